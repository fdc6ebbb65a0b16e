"""The flow head's folder: `config.json`, `model.safetensors` and a manifest; nothing unpickled."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save
from torch import Tensor

from .batches import check_max_length
from .encoder import check_pooling
from .encoder_id import EncoderId
from .errors import BertflowError, first_line
from .files import sha256_file, write_json
from .flow import FlowConfig
from .folders import HEAD_FOLDER, head_folder
from .linear import LINEAR_METHODS

__all__ = ["FORMAT", "FORMAT_VERSION", "SavedHead", "read_head", "write_head"]

FORMAT, FORMAT_VERSION = HEAD_FOLDER.kind, HEAD_FOLDER.version
CONFIG, WEIGHTS = "config.json", "model.safetensors"
_DTYPES = {"torch.float32", "torch.int64", "torch.bool"}


@dataclass(frozen=True)
class SavedHead:
    """What a head's `config.json` says it is, checked field by field."""

    dim: int
    method: str
    flow: FlowConfig | None  # a flow head's Glow; None for a linear head
    out_dim: int
    encoder: EncoderId | None
    pooling: str | None
    max_length: int | None
    standardized: bool  # a StandardScaler before the Glow
    whitened: bool  # a full whitening before the Glow
    training: dict[str, Any]

    @classmethod
    def parse(cls, path: Path, config: dict[str, Any]) -> SavedHead:
        try:
            weights = config["weights"]
            if not isinstance(weights, dict) or weights.get("file") != WEIGHTS:
                raise ValueError(f"weights are not {WEIGHTS}")
            method, dim = config["method"], int(config["dim"])
            if method == "flow":  # every field of the flow, factor_out included, is recorded
                flow, out_dim = FlowConfig.from_dict(config["flow"]), dim
                if set(config["flow"]) != set(flow.to_dict()):
                    raise ValueError("the flow config is incomplete")
            elif method in LINEAR_METHODS:
                flow, out_dim = None, int(config["linear"]["out_dim"])
            else:
                raise ValueError(f"unknown method {method!r}")
            encoder = EncoderId.from_dict(config["encoder"]) if config["encoder"] else None
            pooling, max_length = config["pooling"], config["max_length"]
            if pooling is not None:
                check_pooling(pooling)
            if max_length is not None:
                check_max_length(max_length)
            training = config["training"]
            if not isinstance(training, dict) or not 1 <= out_dim <= dim:
                raise ValueError("bad training record, dim or out_dim")
            return cls(dim, method, flow, out_dim, encoder, pooling, max_length,
                       bool(config["standardize"]), flow is not None and bool(config["linear"]),
                       training)
        except (KeyError, TypeError, ValueError) as e:
            problem = f"{type(e).__name__}: {first_line(e)}"
            raise BertflowError(f"{path / CONFIG} is malformed ({problem})") from None


def read_head(path: str | os.PathLike) -> tuple[SavedHead, dict[str, Tensor]]:
    """The checked config and the tensors of the head at `path` (a folder or a ready head)."""
    path = head_folder(path)
    saved, file = SavedHead.parse(path, HEAD_FOLDER.read(path)), path / WEIGHTS
    if not file.is_file():
        raise BertflowError(f"{path} is missing {WEIGHTS}")
    dim = saved.dim  # refuse a config asking for far more weights than the file holds
    count = saved.flow.parameters(dim) if saved.flow is not None else dim * (saved.out_dim + 1)
    count += 2 * dim * saved.standardized + (dim + 1) * dim * saved.whitened
    size = file.stat().st_size
    if 4 * count > 2 * size + (1 << 20):
        raise BertflowError(f"{file} does not fit its config: it holds {size:,} bytes, the "
                            f"config asks for {count:,} weights")
    try:
        tensors = load_file(str(file))
    except Exception as e:
        raise BertflowError(f"{file} is not a valid safetensors file ({first_line(e)})") from None
    kinds = sorted({str(t.dtype) for t in tensors.values()} - _DTYPES)
    if kinds:
        raise BertflowError(f"{file} does not fit its config: it holds tensors of type "
                            f"{', '.join(kinds)}")
    return saved, tensors


def write_head(folder: Path, tensors: dict[str, Tensor], config: dict[str, Any]) -> None:
    """Write `tensors` and `config` (with the weights' sha256) into `folder`, no manifest."""
    data = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                metadata={"format": FORMAT})
    (folder / WEIGHTS).write_bytes(data)
    write_json(folder / CONFIG, {**config, "weights": {"file": WEIGHTS,
                                                       "sha256": sha256_file(folder / WEIGHTS)}})

