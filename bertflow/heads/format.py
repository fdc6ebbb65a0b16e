"""A head's on-disk format: a folder of `config.json` (what the head is and what made its
training embeddings), `model.safetensors` (its weights, nothing pickled) and `manifest.json`;
read back field by field, with the weights checked against the config before they are loaded."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import Tensor

from .. import __version__
from ..config import FlowConfig
from ..encoders.batches import check_max_length
from ..encoders.identity import EncoderId
from ..encoders.pooling import check_pooling
from ..errors import BertflowError, first_line
from ..storage.artifacts import HEAD_FOLDER, counts, write_manifest
from ..storage.files import sha256_file, write_json
from .catalog import head_folder
from .flow import Glow, StandardScaler
from .head import Head
from .linear import LINEAR_METHODS, LinearMap

__all__ = ["CONFIG", "FORMAT", "WEIGHTS", "head_config", "load_head",
           "save_head", "weights_sha256", "write_head"]

FORMAT = HEAD_FOLDER.kind
CONFIG, WEIGHTS = HEAD_FOLDER.files
_DTYPES = {"torch.float32", "torch.int64", "torch.bool"}


def head_config(head: Head) -> dict[str, Any]:
    """The JSON description of `head` saved beside its weights."""
    linear = {"tensors": ["linear.mean", "linear.weight"], "out_dim": head.out_dim,
              "method": head.linear.method if head.linear is not None else None}
    scaler = {"tensors": ["standardize.mean", "standardize.std"]}
    return {**HEAD_FOLDER.stamp(), "bertflow_version": __version__, "dim": head.dim,
            "encoder": head.encoder.to_dict() if head.encoder else None,
            "pooling": head.pooling, "max_length": head.max_length, "method": head.method,
            "flow": head.glow.config.to_dict() if head.glow is not None else None,
            "linear": linear if head.linear is not None else None,
            "standardize": scaler if head.standardize is not None else None,
            "training": head.training_info}


def save_head(head: Head, path: str | os.PathLike) -> Path:
    """Write `head` to folder `path` atomically, replacing only a head there."""
    return HEAD_FOLDER.write(path, lambda tmp: write_head(head, tmp, manifest=False))


def write_head(head: Head, folder: Path, manifest: bool = True) -> None:
    """Write the files of `head` (and its manifest) into an existing folder."""
    head.check_finite()
    (folder / WEIGHTS).write_bytes(_weights(head))
    weights = {"file": WEIGHTS, "sha256": sha256_file(folder / WEIGHTS)}
    write_json(folder / CONFIG, {**head_config(head), "weights": weights})
    if manifest:
        write_manifest(folder, FORMAT)


def weights_sha256(head: Head) -> str:
    """The sha256 of `head`'s weights file, as `write_head` writes it: the head's identity."""
    return hashlib.sha256(_weights(head)).hexdigest()


def _weights(head: Head) -> bytes:
    tensors = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    return save_tensors(tensors, metadata={"format": FORMAT})


def load_head(path: str | os.PathLike, within: Mapping[str, bytes] | None = None) -> Head:
    """Rebuild a head from its folder, or a ready head by name; nothing is unpickled. `within`:
    the folder's files, already read and checked (a head inside an index folder)."""
    head, tensors = _read(head_folder(path) if within is None else Path(path), within)
    try:
        head.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        detail = str(e).strip().splitlines()[1:2] or [first_line(e)]
        raise BertflowError(f"head {path} does not fit its config: {detail[0].strip()}") \
            from None
    head.check_finite(f"{path}")
    return head.eval()


def _read(path: Path, within: Mapping[str, bytes] | None) -> tuple[Head, dict[str, Tensor]]:
    """A head of the shape the config at `path` describes (checked field by field), with
    placeholder weights, and the tensors of its weights file: the bytes its manifest checked."""
    config, files = HEAD_FOLDER.load(path, within)
    try:
        weights = config["weights"]
        if not isinstance(weights, dict) or weights.get("file") != WEIGHTS:
            raise ValueError(f"weights are not {WEIGHTS}")
        method, (dim,) = config["method"], counts(config, "dim")
        if method == "flow":  # every field of the flow, factor_out included, is recorded
            flow, out_dim = FlowConfig.from_dict(config["flow"]), dim
            if set(config["flow"]) != set(flow.to_dict()):
                raise ValueError("the flow config is incomplete")
        elif method in LINEAR_METHODS:
            flow, (out_dim,) = None, counts(config["linear"], "out_dim")
        else:
            raise ValueError(f"unknown method {method!r}")
        encoder = EncoderId.from_dict(config["encoder"]) if config["encoder"] else None
        pooling = None if config["pooling"] is None else check_pooling(config["pooling"])
        max_length = config["max_length"]
        max_length = None if max_length is None else check_max_length(max_length)
        training = config["training"]
        if not isinstance(training, dict) or not 1 <= out_dim <= dim:
            raise ValueError("bad training record, dim or out_dim")
        standardized = bool(config["standardize"])
        # the linear map's method: a linear head's, or the map before a Glow (recorded since
        # a flow may follow fractional whitening; whitening where a config names none)
        mapped = method if flow is None else (
            (config["linear"].get("method") or "whitening") if config["linear"] else None)
    except (KeyError, TypeError, ValueError) as e:
        problem = f"{type(e).__name__}: {first_line(e)}"
        raise BertflowError(f"{path / CONFIG} is malformed ({problem})") from None
    file, data = path / WEIGHTS, files.get(WEIGHTS)
    if data is None:
        raise BertflowError(f"{path} is missing {WEIGHTS}")
    # refuse a config asking for far more weights than the file holds
    count = (flow.parameters(dim) if flow is not None else 0) + 2 * dim * standardized
    count += dim * (out_dim + 1) * (mapped is not None)
    if 4 * count > 2 * len(data) + (1 << 20):
        raise BertflowError(f"{file} does not fit its config: it holds {len(data):,} bytes, "
                            f"the config asks for {count:,} weights")
    try:
        tensors = load_tensors(data)
    except Exception as e:
        raise BertflowError(f"{file} is not a valid safetensors file ({first_line(e)})") from None
    kinds = sorted({str(t.dtype) for t in tensors.values()} - _DTYPES)
    if kinds:
        raise BertflowError(f"{file} does not fit its config: it holds tensors of type "
                            f"{', '.join(kinds)}")
    scaler = StandardScaler(torch.zeros(dim), torch.ones(dim)) if standardized else None
    linear = LinearMap(torch.zeros(dim), torch.eye(dim, out_dim), mapped) if mapped else None
    return Head(Glow(dim, flow) if flow is not None else None, scaler, linear=linear,
                    encoder=encoder, pooling=pooling, max_length=max_length,
                    training_info=training), tensors
