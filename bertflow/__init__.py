"""bertflow: make BERT sentence embeddings isotropic with a normalizing flow (BERT-flow).

The names below are imported on first use, so that `import bertflow` does not load torch."""

from __future__ import annotations

from .lazy import exports

__version__ = "0.1.0"

_WHERE = {  # module: the public names it defines
    "constants": ("POOLINGS",), "errors": ("BertflowError",),
    "encoders.encoder": ("Encoder",), "encoders.loading": ("encode", "load_encoder"),
    "encoders.pooling": ("pool",),
    "encoders.identity": ("EncoderId", "default_encoder_path"),
    "config": ("FlowConfig", "TrainConfig"), "heads.flow": ("Glow",),
    "heads.head": ("FlowHead", "Head"),
    "embeddings.isotropy": ("mean_pair_cosine",),
    "training.trainer": ("History", "fit", "fit_head"),
    "training.spec": ("MethodSpec",),
}
_MODULES = {"lee": "data.lee", "sts": "data.sts"}  # modules served whole

__all__, __getattr__, __dir__ = exports(__name__, _WHERE, _MODULES)
__all__ = [*__all__, "__version__"]
