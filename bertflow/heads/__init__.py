"""What is applied to embeddings before cosine: the Glow, linear maps, the head module and its
format, density scores, and the heads that come with bertflow."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, (
    "catalog", "density", "flow", "format", "head", "linear",
))
