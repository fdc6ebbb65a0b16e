"""bertflow: make BERT sentence embeddings isotropic with a normalizing flow (BERT-flow)."""

__version__ = "0.1.0"

from . import lee, sts
from .encoder import POOLINGS, Encoder, EncoderId, default_encoder_path, encode, load_encoder, pool
from .errors import BertflowError
from .flow import FlowConfig, Glow
from .head import FlowHead
from .isotropy import mean_pair_cosine
from .train import History, TrainConfig, fit

__all__ = [
    "POOLINGS",
    "BertflowError",
    "Encoder",
    "EncoderId",
    "FlowConfig",
    "FlowHead",
    "Glow",
    "History",
    "TrainConfig",
    "__version__",
    "default_encoder_path",
    "encode",
    "fit",
    "lee",
    "load_encoder",
    "mean_pair_cosine",
    "pool",
    "sts",
]
