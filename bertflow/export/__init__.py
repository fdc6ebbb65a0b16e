"""A head outside bertflow: ONNX and torch.export graphs, the sentence-transformers pipeline and
its model card."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, (
    "card", "graphs", "pipeline",
))
