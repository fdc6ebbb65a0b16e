"""The training checkpoint: a `TrainState` and its run, read with `weights_only=True`."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import BertflowError
from .files import atomic_file
from .train import TrainState

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "Checkpoint", "open_checkpoint"]

CHECKPOINT_FORMAT = "bertflow-train-state"
CHECKPOINT_VERSION = 2


@dataclass(frozen=True)
class Checkpoint:
    """A training state, its run's settings and data (compared on resume) and log folder."""

    state: TrainState
    run: dict[str, Any]
    logs: str | None = None

    def save(self, path: str | os.PathLike,
             recheck: Callable[[Path], object] | None = None) -> None:
        """Write to `path` atomically (`atomic_file`, with its `recheck`)."""
        buffer = io.BytesIO()
        torch.save({"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION,
                    "run": self.run, "logs": self.logs, "state": self.state.to_dict()}, buffer)
        with atomic_file(Path(path), recheck=recheck) as tmp, open(tmp, "wb") as f:
            f.write(buffer.getbuffer())

    def extends(self, run: dict[str, Any]) -> bool:
        """Whether `run` is this checkpoint's run asked for more epochs."""
        train = self.run.get("train")
        if not isinstance(train, dict) or not isinstance(train.get("epochs"), int):
            return False
        epochs = run["train"]["epochs"]
        return train["epochs"] < epochs and {**self.run,
                                             "train": {**train, "epochs": epochs}} == run

    def check(self, path: str | os.PathLike, run: dict[str, Any], *, extended: bool = True,
              keep: bool = False) -> None:
        """Refuse this checkpoint for `run` unless it is its (or, `extended`, fewer epochs)."""
        if self.run != run and not (extended and self.extends(run)):
            raise BertflowError(f"{path} was written by a run with other settings or data"
                                + ("; not overwriting it" if keep else ""))


def open_checkpoint(path: str | os.PathLike, keep: bool = False) -> Checkpoint | None:
    """The training checkpoint at `path`, or None where there is none; other files are refused."""
    path = Path(path)
    if not path.exists():
        return None
    checkpoint = _read(path) if path.is_file() else None
    if checkpoint is None:
        raise BertflowError(f"{path} is not a bertflow training checkpoint"
                            + ("; not overwriting it" if keep else ""))
    return checkpoint


def _read(path: Path) -> Checkpoint | None:
    with open(path, "rb") as f:  # an unreadable file is an OSError, not "not a checkpoint"
        if not zipfile.is_zipfile(f):
            return None
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1 or CHECKPOINT_FORMAT.encode() not in archive.read(pickles[0]):
                return None  # someone else's torch file: not worth loading
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT \
                or not isinstance(saved.get("run"), dict):
            return None
        version, logs = saved.get("format_version"), saved.get("logs")
        if version == CHECKPOINT_VERSION:
            state = TrainState.from_dict(saved["state"])
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError,
            KeyError, IndexError, TypeError, AttributeError):
        return None
    if version != CHECKPOINT_VERSION:
        raise BertflowError(f"{path} is a bertflow training checkpoint of format version "
                            f"{version}; this bertflow reads version {CHECKPOINT_VERSION}")
    return Checkpoint(state, saved["run"], logs if isinstance(logs, str) else None)
