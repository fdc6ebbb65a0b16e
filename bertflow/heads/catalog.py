"""The heads that come with bertflow (the package data under `ready/`), and a head's folder
from a path or a ready head's name."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from ..errors import BertflowError
from ..storage.artifacts import HEAD_FOLDER

__all__ = ["head_folder", "ready_heads"]


def ready_heads() -> dict[str, Path]:
    """The heads that come with bertflow, by name."""
    folder = Path(str(importlib.resources.files(__package__) / "ready"))
    if not folder.is_dir():
        return {}
    return {p.name: p for p in sorted(folder.iterdir()) if (p / HEAD_FOLDER.config).is_file()}


def head_folder(path: str | os.PathLike) -> Path:
    """The folder of head `path`: a folder, or the name of a ready head."""
    path = Path(path)
    ready = {} if path.is_dir() else ready_heads()
    path = ready.get(str(path), path)
    if not path.is_dir():
        raise BertflowError(f"no flow head folder at {path}, nor a ready head of that name "
                            f"({', '.join(ready) or 'none installed'})")
    return path
