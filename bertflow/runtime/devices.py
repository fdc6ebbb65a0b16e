"""The device and the precision the encoder runs in: named, checked to be there, and refused
where they cannot run together."""

from __future__ import annotations

import re

import torch

from ..constants import DTYPES
from ..errors import BertflowError

__all__ = ["resolve_device", "resolve_dtype"]


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """A device from ``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``, if there."""
    name = "auto" if device is None else str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"(cpu|cuda)(:\d+)?", name):
        raise BertflowError(f"unknown device {name!r}; choose auto, cpu, cuda or cuda:N")
    resolved = torch.device(name)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise BertflowError(f"device {name} asked for, but this torch "
                                f"({torch.__version__}) sees no CUDA GPU")
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise BertflowError(f"device {name} asked for, but there are {count} CUDA GPUs")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The transformer's dtype from its name, refused where `device` cannot run it well."""
    name = "float32" if dtype is None else str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise BertflowError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    if device.type == "cpu" and name == "float16":
        raise BertflowError("dtype float16 is not supported on the CPU; use bfloat16 or float32")
    if device.type == "cuda" and name == "int8":
        raise BertflowError(f"dtype int8 runs on the CPU only, not on {device}; use float16")
    if device.type == "cuda" and name == "bfloat16" and not torch.cuda.is_bf16_supported():
        raise BertflowError(f"dtype bfloat16 is not supported on {device}; use float16")
    return getattr(torch, name)
