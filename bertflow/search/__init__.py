"""Search over transformed embeddings: the index and FAISS's kinds."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, (
    "index", "kinds",
))
