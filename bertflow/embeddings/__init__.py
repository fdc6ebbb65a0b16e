"""Encoded corpora on disk (the embeddings file and its sidecar, the streaming writer, the
cache, outputs) and how isotropic a table of embeddings is."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, (
    "cache", "file", "isotropy", "outputs", "writer",
))
