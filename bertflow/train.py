"""Maximum-likelihood training of a flow on embeddings: no files, no command line."""

from __future__ import annotations

import copy
import hashlib
import io
import math
import os
import pickle
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from . import distributed
from .config import DictConfig
from .errors import BertflowError
from .files import atomic_file, check_finite
from .flow import bits_per_dim, log_likelihood
from .isotropy import effective_rank, mean_pair_cosine, partition_isotropy

__all__ = ["CHECKPOINT_FORMAT", "ArrayRows", "Checkpoint", "History", "Moments", "Rows",
           "TrainConfig", "TrainState", "as_rows", "fit", "log_hparams", "moments",
           "open_checkpoint", "read_checkpoint", "split_indices"]

CHECKPOINT_FORMAT = "bertflow-train-state"
CHECKPOINT_VERSION = 1

_READ_ROWS = 8192  # rows per block when streaming statistics
_EVAL_ROWS = 1024  # rows per forward pass when evaluating (its activations are the peak memory)
_SAMPLE = 16384  # held-out latents kept for the isotropy measures
_SPECTRAL = 2048  # of them, those whose spectrum is measured (two SVDs each epoch)


class SummaryWriter(Protocol):
    """What `fit` logs through: TensorBoard's `SummaryWriter` or anything alike."""

    def add_scalar(self, tag: str, value: float, step: int) -> Any: ...

    def add_histogram(self, tag: str, values: Tensor, step: int) -> Any: ...

    def add_hparams(self, hparam_dict: dict[str, Any], metric_dict: dict[str, float],
                    hparam_domain_discrete: Any = None, run_name: str | None = None,
                    global_step: int | None = None) -> Any: ...


@dataclass(frozen=True)
class TrainConfig(DictConfig):
    """How to fit: Adam at `lr`, minibatches of `batch_size`, early stopping on held-out NLL.

    The learning rate decays from `lr` to 0 along a cosine over all epochs
    (`schedule="constant"` keeps it). `val_fraction` of the rows (at least one) are held out;
    training stops after `patience` epochs without a better validation NLL (0: never stops
    early) and the best weights are kept. `init_size` rows feed the data-dependent ActNorm
    initialisation. `noise` adds Gaussian jitter of that many times the data's RMS spread to
    each training batch, which keeps the likelihood bounded on near-constant features.

    `weight_decay` (decoupled, as AdamW), `eps` (Adam's) and `bias_correction=False` (BERT's
    AdamWeightDecay, which the release fits its flow with, has none) make the optimiser the
    release's; with `max_grad_norm` the global gradient norm is clipped.
    """

    KIND = "training config"

    epochs: int = 1
    batch_size: int = 64
    lr: float = 1e-3
    val_fraction: float = 0.1
    patience: int = 3
    seed: int = 0
    init_size: int = 1024
    max_grad_norm: float | None = None
    schedule: str = "cosine"
    noise: float = 0.0
    weight_decay: float = 0.0
    eps: float = 1e-8
    bias_correction: bool = True

    def __post_init__(self) -> None:
        for name, low in (("epochs", 1), ("batch_size", 1), ("init_size", 2), ("patience", 0)):
            if getattr(self, name) < low:
                raise BertflowError(f"{name} must be at least {low}, got {getattr(self, name)}")
        if not 0 <= self.seed < 2**32:
            raise BertflowError(f"seed must be in [0, 2**32), got {self.seed}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise BertflowError(f"max_grad_norm must be positive, got {self.max_grad_norm}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise BertflowError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if not self.lr > 0:
            raise BertflowError(f"lr must be positive, got {self.lr}")
        if self.noise < 0:
            raise BertflowError(f"noise must be ≥ 0, got {self.noise}")
        if self.schedule not in ("cosine", "constant"):
            raise BertflowError(f"schedule must be 'cosine' or 'constant', not {self.schedule!r}")
        if not self.weight_decay >= 0:
            raise BertflowError(f"weight_decay must be ≥ 0, got {self.weight_decay}")
        if not self.eps > 0:
            raise BertflowError(f"eps must be positive, got {self.eps}")



@dataclass
class History:
    """One record per finished epoch, and which epoch gave the kept weights."""

    epochs: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    best_val_nll: float = math.inf
    stopped_early: bool = False

    @property
    def best(self) -> dict[str, float]:
        return self.epochs[self.best_epoch - 1] if self.best_epoch else {}


@dataclass
class TrainState:
    """Everything needed to resume `fit` bit for bit after any finished epoch.

    Holds only tensors, numbers and strings, so it round-trips through
    `torch.save` / `torch.load(weights_only=True)` without unpickling code.
    """

    epoch: int
    step: int
    model: dict[str, Tensor]
    optimizer: dict[str, Any]
    best_model: dict[str, Tensor]
    history: History
    bad_epochs: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "model": self.model,
            "optimizer": self.optimizer,
            "best_model": self.best_model,
            "history": asdict(self.history),
            "bad_epochs": self.bad_epochs,
        }

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> TrainState:
        value = dict(value)
        value["history"] = History(**value["history"])
        return cls(**value)

    def save(self, path: str | os.PathLike, run: dict[str, Any], logs: str | None = None,
             recheck: Callable[[Path], object] | None = None) -> None:
        """Write this state to `path` atomically as a training checkpoint, with `run` (the
        settings and data it belongs to, compared on resume) and `logs` (the name of the run's
        log folder, if any); `recheck` as `atomic_file` takes it. A full disk is a one-line
        `BertflowError`."""
        path = Path(path)
        buffer = io.BytesIO()
        torch.save({"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION,
                    "run": run, "logs": logs, "state": self.to_dict()}, buffer)
        with atomic_file(path, recheck=recheck) as tmp, open(tmp, "wb") as f:
            f.write(buffer.getbuffer())  # a full disk: one line

    @classmethod
    def load(cls, path: str | os.PathLike, run: dict[str, Any] | None = None) -> TrainState:
        """The state saved at `path` by `save`; with `run`, refuse one saved for another."""
        checkpoint = open_checkpoint(path)
        if checkpoint is None:
            raise BertflowError(f"{path} is not a bertflow training checkpoint")
        if run is not None:
            checkpoint.check(path, run, extended=False)
        return checkpoint.state


@dataclass(frozen=True)
class Checkpoint:
    """What `TrainState.save` writes: the state, the run it belongs to (its settings and data,
    compared on resume), its log folder name."""

    state: TrainState
    run: dict[str, Any]
    logs: str | None = None

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
        """Refuse this checkpoint (at `path`) for `run` unless it is that run's, or, with
        `extended`, that run's of fewer epochs. With `keep`, the message says that the file is
        left as it is."""
        if self.run != run and not (extended and self.extends(run)):
            raise BertflowError(f"{path} was written by a run with other settings or data"
                                + ("; not overwriting it" if keep else ""))


def open_checkpoint(path: str | os.PathLike, keep: bool = False) -> Checkpoint | None:
    """The training checkpoint at `path`, or None where there is no file; any other file is
    refused (with `keep`, saying that it is left as it is)."""
    checkpoint = read_checkpoint(path)
    if checkpoint is None and Path(path).exists():
        raise BertflowError(f"{path} is not a bertflow training checkpoint"
                            + ("; not overwriting it" if keep else ""))
    return checkpoint


def read_checkpoint(path: str | os.PathLike) -> Checkpoint | None:
    """The training checkpoint at `path`; None when there is no file there, or a file that is
    not one. Only a zip archive holding a pickle (torch's format) is read, and that with
    `torch.load(weights_only=True)`: tensors and plain containers, never code."""
    path = Path(path)
    if not path.is_file():
        return None
    with open(path, "rb") as f:  # an unreadable file is an OSError, not "not a checkpoint"
        if not zipfile.is_zipfile(f):
            return None
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                return None
            header = archive.read(pickles[0])  # the pickle alone: tensors are other members
        if CHECKPOINT_FORMAT.encode() not in header and b"bad_epochs" not in header:
            return None  # someone else's torch file: not worth loading
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(saved, dict) or not isinstance(saved.get("run"), dict):
            return None
        if saved.get("format") != CHECKPOINT_FORMAT and set(saved) != {"run", "state"}:
            return None  # neither this format nor the unmarked one written before it
        logs, version = saved.get("logs"), saved.get("format_version", CHECKPOINT_VERSION)
        if version == CHECKPOINT_VERSION:
            state = TrainState.from_dict(saved["state"])
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError,
            KeyError, IndexError, TypeError, AttributeError):
        return None
    if version != CHECKPOINT_VERSION:
        raise BertflowError(f"{path} is a bertflow training checkpoint of format version "
                            f"{version}; this bertflow reads version {CHECKPOINT_VERSION}")
    return Checkpoint(state, saved["run"], logs if isinstance(logs, str) else None)


class Rows(Protocol):
    """Where `fit` reads its data: a (rows, dim) table read by row indices or by ranges, as
    float32 arrays. An array qualifies through `as_rows`; `EmbeddingFile` reads a file."""

    shape: tuple[int, int]

    def take(self, rows: np.ndarray) -> np.ndarray: ...

    def read(self, start: int, stop: int) -> np.ndarray: ...


class ArrayRows:
    """An in-memory array or tensor as `Rows`."""

    def __init__(self, x: np.ndarray | Tensor):
        x = x.detach().cpu().numpy() if isinstance(x, Tensor) else x
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        self.shape = self.x.shape

    def take(self, rows: np.ndarray) -> np.ndarray:
        return self.x[rows]

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.x[start:stop]


def as_rows(x: np.ndarray | Tensor | Rows) -> Rows:
    return x if hasattr(x, "take") and hasattr(x, "read") else ArrayRows(x)


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """A seeded split of `range(n)` into (train, validation) indices (int32 below 2**31 rows:
    4 bytes a row is all that grows with the corpus)."""
    order = _permutation(n, torch.Generator().manual_seed(seed))
    n_val = min(n - 2, max(1, round(n * val_fraction))) if val_fraction > 0 else 0
    if n - n_val < 2:
        raise BertflowError(f"need at least 2 training rows, got {n} in all")
    return order[n_val:], order[:n_val]


def fit(
    model: nn.Module,
    x: Tensor | np.ndarray | Rows,
    config: TrainConfig = TrainConfig(),
    *,
    state: TrainState | None = None,
    writer: SummaryWriter | None = None,
    on_epoch_end: Callable[[TrainState], None] | None = None,
    measure: Callable[[nn.Module], dict[str, float]] | None = None,
    progress: bool = False,
) -> History:
    r"""Fit `model` to the rows of `x` by maximum likelihood under a N(0, I) base.

    `model(x)` must return `(z, log_det)`; the loss is the NLL $-\frac1N\sum \log p(x)$ in
    nats with $\log p(x) = \log N(z; 0, I) + \log|\det|$ (`log_likelihood`). `x` is read one
    minibatch at a time, so it may be a file larger than memory (`Rows`). The model is left
    with the weights of the best validation epoch, in eval mode. Pass the `state` given to
    `on_epoch_end` to resume; a `state` saved by a run of fewer `config.epochs` extends that
    run: from the step it resumes at, the learning rate follows the cosine over the new total
    (where a run of that length would be), so the result depends on the state and `config`
    alone.

    `measure(model)`, called after each epoch's validation (eval mode, no gradients), returns
    further measures of the current model, such as a dev-set score; they join the epoch's
    record and the `writer`'s scalars (`"dev_spearman"` is logged as `dev/spearman`). The
    `writer` also gets, per step, the loss, learning rate and gradient norm; per epoch, the
    epoch's mean train NLL and throughput, the held-out NLL, and the isotropy of held-out
    latents (mean cosine, effective rank, I(W)).

    Under `torch.distributed` (torchrun) every process runs `fit` on the same `x` with the same
    config: each takes every world-size-th row of each minibatch (none, where the minibatch has
    fewer rows than processes), `DistributedDataParallel` averages the gradients, and the result
    is the one-process fit up to float rounding.
    """
    trainer = _Trainer(model, as_rows(x), config, writer, progress)
    run = trainer.resume(state) if state is not None else trainer.initialise()
    for epoch in range(run.epoch + 1, config.epochs + 1):
        if config.patience and run.bad_epochs >= config.patience:
            break
        began = time.perf_counter()
        train_nll = trainer.epoch(run, epoch)
        record = trainer.validate(run, epoch, train_nll, began, measure)
        run.add(record, model)
        if on_epoch_end is not None:
            on_epoch_end(trainer.state(run))
    run.history.stopped_early = len(run.history.epochs) < config.epochs
    model.load_state_dict(run.best_model)
    model.eval()
    return run.history


@dataclass
class _Run:
    """Where a fit stands after its last finished epoch (`epoch`, 0 before the first)."""

    epoch: int
    step: int
    history: History
    best_model: dict[str, Tensor]
    bad_epochs: int

    def add(self, record: dict[str, float], model: nn.Module) -> None:
        """Record a finished epoch; keep the model's weights if its held-out NLL is the best
        yet, else count one more epoch without improvement (early stopping)."""
        self.epoch = int(record["epoch"])
        self.history.epochs.append(record)
        if record["val_nll"] < self.history.best_val_nll:
            self.history.best_val_nll, self.history.best_epoch = record["val_nll"], self.epoch
            self.best_model, self.bad_epochs = _copy_state(model), 0
        else:
            self.bad_epochs += 1


class _Trainer:
    """What stays fixed over a fit: the model, its optimiser, the rows and their split."""

    def __init__(self, model: nn.Module, rows: Rows, config: TrainConfig,
                 writer: SummaryWriter | None, progress: bool):
        if len(rows.shape) != 2 or rows.shape[0] < 3:
            raise BertflowError(f"need a (rows ≥ 3, dim) table to fit, got shape {rows.shape}")
        self.model, self.rows, self.config, self.writer = model, rows, config, writer
        self.progress, self.dim = progress, rows.shape[1]
        self.train_idx, self.val_idx = split_indices(rows.shape[0], config.val_fraction,
                                                     config.seed)
        if not len(self.val_idx):
            self.val_idx = self.train_idx
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self.jitter = config.noise * _rms_deviation(rows, self.train_idx) if config.noise \
            else 0.0
        self.optimizer = _optimizer(model, config)
        self.total_steps = math.ceil(len(self.train_idx) / config.batch_size) * config.epochs
        self.net: nn.Module = _Sums(model)

    def batch(self, indices: Tensor) -> Tensor:
        return torch.from_numpy(np.asarray(self.rows.take(indices.numpy()), dtype=np.float32))

    def initialise(self) -> _Run:
        """A fresh run: the data-dependent initialisation (ActNorm) on the first `init_size`
        training rows, and, for the writer, the isotropy of the held-out inputs."""
        self.model.train()
        with torch.no_grad():
            first = self.batch(self.train_idx[: self.config.init_size])
            g = torch.Generator().manual_seed(self.config.seed)
            self.model(first + self.jitter * torch.randn(first.shape, generator=g)
                       if self.jitter else first)
        run = _Run(0, 0, History(), _copy_state(self.model), 0)
        if self.writer is not None:
            x_val = self.batch(self.val_idx[:_SAMPLE])
            self.writer.add_scalar("cosine/input", mean_pair_cosine(x_val), 0)
            _log_spectrum(self.writer, "input", x_val[:_SPECTRAL], 0)
        self._distribute()
        return run

    def resume(self, state: TrainState) -> _Run:
        """The run `state` saved, with the model and the optimiser as they were."""
        self.model.load_state_dict(state.model)
        self.optimizer.load_state_dict(state.optimizer)
        run = _Run(state.epoch, state.step, copy.deepcopy(state.history), state.best_model,
                   state.bad_epochs)
        self._distribute()
        return run

    def _distribute(self) -> None:
        if self.world > 1:
            self.net = nn.parallel.DistributedDataParallel(self.net,
                                                           forward_sync_buffers=False)

    def epoch(self, run: _Run, epoch: int) -> float:
        """One pass over the training rows in an order seeded by the epoch: the mean NLL of
        its minibatches, weighted by their size."""
        self.model.train()
        g = torch.Generator().manual_seed(self.config.seed * 1_000_003 + epoch)
        order = _permutation(len(self.train_idx), g)
        total, count, size = 0.0, 0, self.config.batch_size
        bar = tqdm(range(0, len(order), size), desc=f"epoch {epoch}", unit="batch",
                   disable=not self.progress or self.rank != 0, leave=False)
        began = time.perf_counter()
        for first in bar:
            indices = self.train_idx[order[first : first + size]]
            total += self.step(run, epoch, indices, g) * len(indices)
            count += len(indices)
        if self.writer is not None:
            seconds = max(time.perf_counter() - began, 1e-9)
            self.writer.add_scalar("train/rows_per_second", count / seconds, run.step)
        return total / count

    def step(self, run: _Run, epoch: int, indices: Tensor, g: torch.Generator) -> float:
        """One optimiser step on the minibatch `indices` (this process's share of it under
        torchrun, which may be empty): its mean NLL over all processes."""
        n = len(indices)
        noise = self.jitter * torch.randn((n, self.dim), generator=g) if self.jitter else None
        share = slice(self.rank, None, self.world)
        data = self.batch(indices[share])
        if noise is not None:
            data = data + noise[share]
        nll, log_det = self.net(data)
        loss = nll / (n / self.world)  # DDP averages over processes: the minibatch's mean
        sums = torch.stack([nll.detach(), log_det])
        if self.world > 1:
            torch.distributed.all_reduce(sums)
        value, log_det = (sums / n).tolist()
        run.step += 1
        if not math.isfinite(value):
            raise BertflowError(f"non-finite loss ({value}) at step {run.step} (epoch {epoch}); "
                                "try a lower learning rate or standardised inputs")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        lr = _learning_rate(self.config, run.step, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        grad_norm = None
        if self.config.max_grad_norm:
            grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(),
                                                 self.config.max_grad_norm)
        elif self.writer is not None:
            grad_norm = _grad_norm(self.model)
        self.optimizer.step()
        if self.writer is not None:
            self._log_step(value, log_det, lr, grad_norm, run.step)
        return value

    def _log_step(self, nll: float, log_det: float, lr: float, grad_norm: Tensor,
                  step: int) -> None:
        self.writer.add_scalar("train/nll", nll, step)
        self.writer.add_scalar("train/bits_per_dim", bits_per_dim(nll, self.dim), step)
        self.writer.add_scalar("train/log_det", log_det, step)
        self.writer.add_scalar("train/lr", lr, step)
        self.writer.add_scalar("train/grad_norm", grad_norm.item(), step)

    def validate(self, run: _Run, epoch: int, train_nll: float, began: float,
                 measure: Callable[[nn.Module], dict[str, float]] | None) -> dict[str, float]:
        """The record of a finished epoch: its train NLL, the held-out measures (`_evaluate`)
        and those of `measure`, and how long it took."""
        record = {"epoch": float(epoch), "train_nll": train_nll}
        metrics, z_val = _evaluate(self.model, self.batch, self.val_idx, self.config.seed)
        if measure is not None:
            with torch.no_grad():
                measured = {k: float(v) for k, v in measure(self.model).items()}
            clash = sorted(set(measured) & set(_RECORD))
            if clash:
                raise BertflowError(f"a measure may not replace the record's {clash}")
            metrics.update(measured)
        record.update(metrics, seconds=time.perf_counter() - began)
        if not math.isfinite(record["val_nll"]):
            raise BertflowError(f"non-finite validation NLL after epoch {epoch} "
                                f"(step {run.step})")
        if self.writer is not None:
            _log_epoch(self.writer, z_val, record, run.step)
        return record

    def state(self, run: _Run) -> TrainState:
        """A copy of everything needed to resume after the epoch `run` just finished."""
        return TrainState(epoch=run.epoch, step=run.step, model=_copy_state(self.model),
                          optimizer=copy.deepcopy(self.optimizer.state_dict()),
                          best_model=run.best_model, history=copy.deepcopy(run.history),
                          bad_epochs=run.bad_epochs)


class _Sums(nn.Module):
    """A model's NLL and log-determinant, each summed over the rows of `x`. No rows (a
    process's empty share of a short minibatch) give zeros that still depend on every trained
    parameter, so that the process joins DDP's gradient all-reduce, with zero gradients."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if not len(x):  # the model may not take 0 rows (nflows cannot reshape them)
            zero = sum(p.sum() for p in self.parameters() if p.requires_grad) * 0.0
            return zero, zero.detach()
        z, log_det = self.model(x)
        return -log_likelihood(z, log_det).sum(), log_det.detach().sum()


@torch.no_grad()
def _evaluate(model: nn.Module, batch: Callable[[Tensor], Tensor], indices: Tensor,
              seed: int) -> tuple[dict[str, float], Tensor]:
    """Held-out NLL and log-det over `indices`, a block at a time, and the latents of the first
    `_SAMPLE` of them (for the isotropy measures and the histogram)."""
    model.eval()
    nll = log_det_sum = 0.0
    n = len(indices)
    z_sample = None
    for start in range(0, n, _EVAL_ROWS):
        z, log_det = model(batch(indices[start : start + _EVAL_ROWS]))
        nll -= log_likelihood(z, log_det).double().sum().item()
        log_det_sum += log_det.double().sum().item()
        if z_sample is None:
            z_sample = z.new_empty(min(n, _SAMPLE), z.shape[1])
        if start < len(z_sample):
            z_sample[start : start + len(z)] = z[: len(z_sample) - start]
    z = z_sample
    metrics = {
        "val_nll": nll / n,
        "val_bits_per_dim": bits_per_dim(nll / n, z.shape[1]),
        "val_log_det": log_det_sum / n,
        "val_cosine": mean_pair_cosine(z, seed=seed),
    }
    return metrics, z


@dataclass
class Moments:
    """Per-column count, mean and sum of squared deviations of a table, and the sha256 of the
    float32 rows that were read."""

    count: int
    mean: np.ndarray
    squares: np.ndarray
    sha256: str

    @property
    def std(self) -> np.ndarray:
        """The unbiased standard deviation (as `torch.std`)."""
        return np.sqrt(self.squares / max(self.count - 1, 1))

    @property
    def constant(self) -> np.ndarray:
        """Which columns hold the same value in every row: a spread below 1e-9 of the mean's
        size, far under float32's resolution, is the rounding of the streamed mean."""
        return np.sqrt(self.squares / max(self.count, 1)) <= 1e-9 * np.abs(self.mean)

    def check_varies(self, what: str = "the rows") -> None:
        """Refuse a table whose rows are all the same: no density can be fit to it."""
        constant = self.constant
        if constant.all():
            raise BertflowError(
                f"{what} are constant: every row is the same (all {len(constant)} features are "
                "constant, e.g. one sentence repeated), there is nothing to fit"
            )


def moments(rows: Rows, chosen: np.ndarray | None = None, what: str = "the rows") -> Moments:
    """`Moments` of `rows` (only those where the boolean mask `chosen` is set), read a block
    at a time and merged in float64 (Chan, Golub & LeVeque's update); a NaN or an infinity is
    an error naming its row."""
    count, mean, squares = 0, np.zeros(rows.shape[1]), np.zeros(rows.shape[1])
    digest = hashlib.sha256()
    for start in range(0, rows.shape[0], _READ_ROWS):
        block = np.ascontiguousarray(rows.read(start, start + _READ_ROWS), dtype=np.float32)
        check_finite(block, what, offset=start)
        digest.update(block.tobytes())
        if chosen is not None:
            block = block[chosen[start : start + len(block)]]
        if not len(block):
            continue
        block = block.astype(np.float64)
        block_mean = block.mean(0)
        delta, total = block_mean - mean, count + len(block)
        mean = mean + delta * len(block) / total
        squares = squares + ((block - block_mean) ** 2).sum(0) + delta**2 * count * len(
            block) / total
        count = total
    return Moments(count, mean, squares, digest.hexdigest())


def _rms_deviation(rows: Rows, indices: Tensor) -> float:
    """The RMS distance of the rows at `indices` from their mean."""
    chosen = np.zeros(rows.shape[0], dtype=bool)
    chosen[indices.numpy()] = True
    m = moments(rows, chosen)
    return float(np.sqrt((m.squares / m.count).mean()))


_RECORD = ("epoch", "train_nll", "val_nll", "val_bits_per_dim", "val_log_det", "val_cosine",
           "seconds")  # what `fit` records of every epoch; a `measure` adds the rest


def _log_epoch(writer: SummaryWriter, z: Tensor, record: dict[str, float], step: int) -> None:
    writer.add_scalar("train/epoch", record["epoch"], step)
    writer.add_scalar("train/epoch_nll", record["train_nll"], step)
    for key in ("val_nll", "val_bits_per_dim", "val_log_det"):
        writer.add_scalar(f"val/{key.removeprefix('val_')}", record[key], step)
    writer.add_scalar("cosine/latent", record["val_cosine"], step)
    _log_spectrum(writer, "latent", z[:_SPECTRAL], step)
    writer.add_histogram("latent/z", z, step)
    for key in sorted(record.keys() - set(_RECORD)):
        writer.add_scalar(key.replace("_", "/", 1), record[key], step)


def _log_spectrum(writer: SummaryWriter, which: str, x: Tensor, step: int) -> None:
    """The effective rank and I(W) of a sample, as `effective_rank/{which}` and
    `partition_isotropy/{which}` (NaN where undefined)."""
    x = x.detach().cpu().double().numpy()
    writer.add_scalar(f"effective_rank/{which}", effective_rank(x), step)
    writer.add_scalar(f"partition_isotropy/{which}", partition_isotropy(x), step)


def log_hparams(writer: SummaryWriter, hparams: dict[str, Any], history: History,
                step: int | None = None) -> None:
    """Log a finished run's hyperparameters with its results, for TensorBoard's HPARAMS tab,
    into the writer's own folder (beside its curves, not in a subfolder).

    Nested dicts of `hparams` are flattened to `outer/inner` names; None is left out and any
    other non-number becomes text. The results: `hparams/best_val_nll`,
    `hparams/best_val_bits_per_dim`, `hparams/best_epoch`, `hparams/epochs_run`, and for each
    measure that `fit`'s `measure` added to the records, its value at the best epoch (the kept
    weights) as `hparams/<name>` and at the last as `hparams/last_<name>`.
    """
    best, last = history.best, history.epochs[-1] if history.epochs else {}
    metrics = {"hparams/best_val_nll": history.best_val_nll,
               "hparams/best_val_bits_per_dim": best.get("val_bits_per_dim", math.nan),
               "hparams/best_epoch": float(history.best_epoch),
               "hparams/epochs_run": float(len(history.epochs))}
    for key in sorted(last.keys() - set(_RECORD)):
        metrics[f"hparams/{key}"] = best.get(key, math.nan)
        metrics[f"hparams/last_{key}"] = last[key]
    writer.add_hparams(_flatten(hparams), metrics, run_name=".", global_step=step)


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}/"))
        elif value is None or isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def _grad_norm(model: nn.Module) -> Tensor:
    """The 2-norm of all gradients together (what `clip_grad_norm_` measures)."""
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return torch.stack(norms).norm() if norms else torch.zeros(())


def _permutation(n: int, generator: torch.Generator) -> Tensor:
    """A random permutation of `range(n)`, the same as `torch.randperm`'s in int64."""
    return torch.randperm(n, generator=generator,
                          dtype=torch.int32 if n < 2**31 else torch.int64)


def _learning_rate(config: TrainConfig, step: int, total_steps: int) -> float:
    if config.schedule == "constant":
        return config.lr
    return config.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / total_steps))


def _copy_state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    params, lr, eps, decay = model.parameters(), config.lr, config.eps, config.weight_decay
    if not config.bias_correction:
        return _AdamWeightDecay(params, lr=lr, eps=eps, weight_decay=decay)
    if decay:
        return torch.optim.AdamW(params, lr=lr, eps=eps, weight_decay=decay)
    return torch.optim.Adam(params, lr=lr, eps=eps)


class _AdamWeightDecay(torch.optim.Optimizer):
    def __init__(self, params: Any, lr: float, eps: float, weight_decay: float,
                 betas: tuple[float, float] = (0.9, 0.999)):
        super().__init__(params, {"lr": lr, "eps": eps, "weight_decay": weight_decay,
                                  "betas": betas})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                m, v = state["m"], state["v"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                update = m / (v.sqrt() + group["eps"]) + group["weight_decay"] * p
                p.sub_(group["lr"] * update)
