"""A fit's TensorBoard logs: its curves, hyperparameters with results, and the run's folder."""

from __future__ import annotations

import itertools
import math
import shutil
import time
from pathlib import Path
from typing import Any

from torch import Tensor

from ..embeddings.isotropy import effective_rank, mean_pair_cosine, partition_isotropy
from .trainer import RECORD, History, TrainState

__all__ = ["RunLogs", "TensorBoard"]

_SPECTRAL = 2048  # held-out rows whose spectrum is measured (two SVDs each epoch)
# the tag of each value of an epoch's record; a measure's ``a_b`` is logged as ``a/b``
_EPOCH_TAGS = {"epoch": "train/epoch", "train_nll": "train/epoch_nll", "val_nll": "val/nll",
               "val_bits_per_dim": "val/bits_per_dim", "val_log_det": "val/log_det",
               "val_cosine": "cosine/latent"}


class TensorBoard:
    """A `train.Hook` writing each step's scalars and each epoch's record to a `SummaryWriter`."""

    def __init__(self, writer: Any):
        self.writer = writer

    def start(self, x: Tensor) -> None:
        self.writer.add_scalar("cosine/input", mean_pair_cosine(x), 0)
        self._spectrum("input", x, 0)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"train/{key}", value, step)

    def epoch(self, step: int, record: dict[str, float], z: Tensor) -> None:
        for key, tag in _EPOCH_TAGS.items():
            self.writer.add_scalar(tag, record[key], step)
        self._spectrum("latent", z, step)
        self.writer.add_histogram("latent/z", z, step)
        for key in sorted(record.keys() - set(RECORD)):
            self.writer.add_scalar(key.replace("_", "/", 1), record[key], step)

    def hparams(self, hparams: dict[str, Any], history: History, step: int | None = None) -> None:
        """Log a finished run's hyperparameters (nested dicts as `outer/inner`) with its results
        (the best epoch's, and each measure's last as `last_<name>`) for the HPARAMS tab."""
        best, last = history.best, history.epochs[-1] if history.epochs else {}
        metrics = {"hparams/best_val_nll": history.best_val_nll,
                   "hparams/best_val_bits_per_dim": best.get("val_bits_per_dim", math.nan),
                   "hparams/best_epoch": float(history.best_epoch),
                   "hparams/epochs_run": float(len(history.epochs))}
        for key in sorted(last.keys() - set(RECORD)):
            metrics[f"hparams/{key}"] = best.get(key, math.nan)
            metrics[f"hparams/last_{key}"] = last[key]
        _after_newest_events(Path(self.writer.log_dir))  # its own event file, read last
        self.writer.add_hparams(_flatten(hparams), metrics, run_name=".", global_step=step)

    def _spectrum(self, which: str, x: Tensor, step: int) -> None:
        x = x[:_SPECTRAL].detach().cpu().double().numpy()
        self.writer.add_scalar(f"effective_rank/{which}", effective_rank(x), step)
        self.writer.add_scalar(f"partition_isotropy/{which}", partition_isotropy(x), step)


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}/"))
        else:
            plain = value is None or isinstance(value, (bool, int, float, str))
            flat[f"{prefix}{key}"] = value if plain else str(value)
    return flat


class RunLogs:
    """A run's folder in `logdir`: the resumed checkpoint's (`recorded`; then `resumed`), else
    a new TIME-seedN; `made`: the folders made for it, innermost first."""

    def __init__(self, logdir: Path, seed: int, recorded: str | None):
        self.made = [p for p in (logdir, *logdir.parents) if not p.exists()]
        self.writer: Any = None
        self.resumed = bool(recorded) and recorded == Path(recorded).name != ".."
        logdir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in itertools.count(1):
            self.folder = logdir / (recorded if self.resumed else
                                    f"{stamp}-seed{seed}{f'-{n}' if n > 1 else ''}")
            try:
                self.folder.mkdir()
                self.made.insert(0, self.folder)
                return
            except FileExistsError:
                if self.resumed:
                    return

    def open(self, state: TrainState | None) -> TensorBoard:
        """The run's hook; a resumed run hides what was logged after its checkpoint."""
        from torch.utils.tensorboard import SummaryWriter

        _after_newest_events(self.folder)
        self.writer = SummaryWriter(str(self.folder),
                                    purge_step=state.step + 1 if state is not None else None)
        return TensorBoard(self.writer)

    def close(self, keep: bool) -> None:
        """Close the writer; unless `keep`, remove the folders made for the run."""
        if self.writer is not None:
            self.writer.close()
        for path in [] if keep else self.made:
            if path == self.folder:
                shutil.rmtree(path, ignore_errors=True)
                continue
            try:
                path.rmdir()
            except OSError:
                return


def _after_newest_events(folder: Path) -> None:
    """Wait until the clock has passed the second of the newest event file in `folder`: event
    files are read in name order, which within a second is not their order (10 before 9)."""
    seconds = [int(part) for p in folder.glob("events.out.tfevents.*")
               if (part := p.name.split(".")[3]).isdigit()]
    if seconds:
        time.sleep(max(0.0, max(seconds) + 1 - time.time()))
