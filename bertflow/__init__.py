"""bertflow: make BERT sentence embeddings isotropic with a normalizing flow (BERT-flow).

The names below are imported on first use, so that `import bertflow` does not load torch."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_WHERE = {
    "POOLINGS": "constants",
    "BertflowError": "errors",
    "Encoder": "encoder",
    "EncoderId": "encoder_id",
    "default_encoder_path": "encoder_id",
    "encode": "encoder",
    "load_encoder": "encoder",
    "pool": "encoder",
    "FlowConfig": "flow",
    "Glow": "flow",
    "FlowHead": "head",
    "mean_pair_cosine": "isotropy",
    "History": "train",
    "TrainConfig": "train",
    "fit": "train",
}
_MODULES = ("lee", "sts")

__all__ = sorted([*_WHERE, *_MODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bertflow' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
