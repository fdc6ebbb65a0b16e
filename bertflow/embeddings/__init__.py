"""Encoded corpora on disk (the embeddings file and its sidecar, the streaming writer, the
cache, outputs) and how isotropic a table of embeddings is."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "cache": ("EmbeddingCache", "encode_to"),
    "file": ("EmbeddingFile", "embeddings_meta", "finished", "open_embeddings", "other_request",
             "read_header", "read_meta"),
    "isotropy": ("alignment", "condition_number", "effective_rank", "isotropy_measures",
                 "mean_cosine", "mean_pair_cosine", "pair_cosines", "partition_isotropy",
                 "singular_values", "uniformity"),
    "outputs": ("check_destination", "lock", "partial_path", "place", "record_paths",
                "write_transformed"),
    "writer": ("write_embeddings",),
})
