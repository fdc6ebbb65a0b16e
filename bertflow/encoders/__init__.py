"""A frozen Hugging Face encoder: loading and checking it, its identity, pooling, batching, the
fused forward, the folder's own settings and sentence-transformers' calling convention."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "batches": ("check_batch_size", "check_max_length", "release_free_memory", "token_batches"),
    "encoder": ("CHUNK_SIZE", "Encoder"),
    "fused": ("FUSED_KINDS", "FusedEncoder", "PROBE_TOLERANCE", "fused_encoder", "state_gap",
              "supports_fused"),
    "identity": ("EncoderId", "default_encoder_path", "fingerprint", "locate", "recorded_folder",
                 "recorded_location"),
    "loading": ("check_architecture", "encode", "load_encoder", "resolve_encoder"),
    "pooling": ("LAYERS", "check_pooling", "pool"),
    "settings": ("FolderSettings", "read_settings"),
    "st_api": ("SIMILARITY_FN_NAME", "as_sentences", "check_options", "convert", "similarity",
               "similarity_pairwise"),
})
