"""bertflow: make BERT sentence embeddings isotropic with a normalizing flow (BERT-flow).

The names below are imported on first use, so that `import bertflow` does not load torch."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_WHERE = {  # module: the public names it defines
    "constants": ("POOLINGS",), "errors": ("BertflowError",),
    "encoder": ("Encoder", "encode", "load_encoder", "pool"),
    "encoder_id": ("EncoderId", "default_encoder_path"), "flow": ("FlowConfig", "Glow"),
    "head": ("FlowHead",), "isotropy": ("mean_pair_cosine",),
    "train": ("History", "TrainConfig", "fit"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
_MODULES = ("lee", "sts")

__all__ = sorted([*_MODULE_OF, *_MODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bertflow' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
