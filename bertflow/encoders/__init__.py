"""A frozen Hugging Face encoder: loading and checking it, its identity, pooling, batching, the
fused forward, the folder's own settings and sentence-transformers' calling convention."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, (
    "batches", "encoder", "fused", "identity", "loading", "pooling", "settings", "st_api",
))
