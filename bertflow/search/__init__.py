"""Search over transformed embeddings: the index and FAISS's kinds."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "index": ("Hit", "Index"),
    "kinds": ("KINDS", "MAX_PER_CENTROID", "MIN_PER_CENTROID", "TRAIN_SEED", "faiss_module",
              "faiss_reason", "inverted_lists", "make", "no_lists", "sample", "set_nprobe",
              "structure", "training_rows"),
})
