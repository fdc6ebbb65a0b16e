"""The training checkpoint: a `TrainState` and its run, read with `weights_only=True`."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import BertflowError
from ..storage.artifacts import CHECKPOINT
from ..storage.files import Checked, Recheck, atomic_file, refuse_link
from .trainer import TrainState

__all__ = ["Checkpoint", "CheckpointFile", "open_checkpoint"]


@dataclass(frozen=True)
class Checkpoint:
    """A training state, its run's settings and data (compared on resume) and log folder."""

    state: TrainState
    run: dict[str, Any]
    logs: str | None = None

    def save(self, path: str | os.PathLike, recheck: Recheck | None = None) -> None:
        """Write to `path` atomically (`atomic_file`, with its `recheck`)."""
        buffer = io.BytesIO()
        torch.save({**CHECKPOINT.stamp(), "run": self.run, "logs": self.logs,
                    "state": self.state.to_dict()}, buffer)
        with atomic_file(Path(path), recheck=recheck) as tmp, open(tmp, "wb") as f:
            f.write(buffer.getbuffer())

    def extends(self, run: dict[str, Any]) -> bool:
        """Whether `run` is this checkpoint's run asked for more epochs."""
        train = self.run.get("train")
        if not isinstance(train, dict) or not isinstance(train.get("epochs"), int):
            return False
        asked = run["train"]["epochs"]
        return train["epochs"] < asked and {**self.run, "train": {**train, "epochs": asked}} == run

    def check(self, path: str | os.PathLike, run: dict[str, Any], *, extended: bool = True,
              keep: bool = False) -> None:
        """Refuse this checkpoint for `run` unless it is its (or, `extended`, fewer epochs)."""
        if self.run != run and not (extended and self.extends(run)):
            raise BertflowError(f"{path} was written by a run with other settings or data"
                                + ("; not overwriting it" if keep else ""))


class CheckpointFile:
    """`--checkpoint`: read before any work and again (`checked`) before a save where it changed;
    another file is refused, and a checkpoint of another run once the run is known."""

    def __init__(self, path: Path, resume: bool):
        self.path, self.resume = path, resume
        self.run: dict[str, Any] = {}  # once known
        refuse_link(path)
        self.checked = Checked(path, self._check)

    def _check(self, path: Path) -> None:
        keep = not self.resume or bool(self.run)  # the file would be replaced
        self.saved = open_checkpoint(path, keep=keep)
        if self.saved is not None and self.run:
            self.saved.check(path, self.run, extended=self.resume, keep=keep)

    def state_for(self, run: dict[str, Any],
                  say: Callable[[str], None] | None) -> TrainState | None:
        """The saved state where resuming `run` (or extending it), else None; `say` tells which."""
        saved, self.run = self.saved, run
        if saved is not None:
            saved.check(self.path, run, extended=self.resume, keep=not self.resume)
        state = saved.state if saved is not None and self.resume else None
        if say is not None and state is not None and saved.run != run:
            train = run["train"]
            stopped = bool(train["patience"]) and state.bad_epochs >= train["patience"]
            say(f"extending the run in {self.path} from {saved.run['train']['epochs']} to "
                f"{train['epochs']} epochs: from step {state.step + 1} on, the learning rate "
                f"follows the cosine over {train['epochs']} epochs" + (
                    f" (but it stopped early, after {train['patience']} epochs without a "
                    "better held-out NLL: it ends there)" if stopped else ""))
        if say is not None and state is None and (saved is not None or self.resume):
            say(f"{self.path} holds an earlier state of this run: starting afresh (--resume "
                "continues it)" if saved is not None else
                f"no checkpoint at {self.path} yet: starting afresh")
        return state

    def save(self, state: TrainState, logs: str | None) -> None:
        """Save `state` of the run, rechecking the file where it changed since last read."""
        Checkpoint(state, self.run, logs).save(self.path, recheck=self.checked)


def open_checkpoint(path: str | os.PathLike, keep: bool = False) -> Checkpoint | None:
    """The training checkpoint at `path`, or None where there is none; other files are refused."""
    path = Path(path)
    saved = CHECKPOINT.record(path) if path.is_file() else None
    if saved is None and path.exists():
        raise BertflowError(f"{path} is not {CHECKPOINT.name}"
                            + ("; not overwriting it" if keep else ""))
    if saved is None:
        return None
    CHECKPOINT.check(saved, path)
    logs = saved.get("logs")
    try:
        return Checkpoint(TrainState.from_dict(saved["state"]), saved["run"],
                          logs if isinstance(logs, str) else None)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        raise BertflowError(f"{path} is a malformed training checkpoint") from None
