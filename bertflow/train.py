"""Maximum-likelihood training of a flow on embeddings: no files, no command line."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .errors import BertflowError
from .flow import standard_normal_log_prob
from .isotropy import mean_pair_cosine

__all__ = ["History", "TrainConfig", "TrainState", "fit", "split_indices"]


class SummaryWriter(Protocol):
    """What `fit` logs through: TensorBoard's `SummaryWriter` or anything alike."""

    def add_scalar(self, tag: str, value: float, step: int) -> Any: ...

    def add_histogram(self, tag: str, values: Tensor, step: int) -> Any: ...


@dataclass(frozen=True)
class TrainConfig:
    """How to fit: Adam at `lr`, minibatches of `batch_size`, early stopping on held-out NLL.

    The learning rate decays from `lr` to 0 along a cosine over all epochs
    (`schedule="constant"` keeps it). `val_fraction` of the rows (at least one) are held out;
    training stops after `patience` epochs without a better validation NLL (0: never stops
    early) and the best weights are kept. `init_size` rows feed the data-dependent ActNorm
    initialisation. `noise` adds Gaussian jitter of that many times the data's RMS spread to
    each training batch, which keeps the likelihood bounded on near-constant features.
    """

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in value.items() if k in names})


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


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """A seeded split of `range(n)` into (train, validation) indices."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = min(n - 2, max(1, round(n * val_fraction))) if val_fraction > 0 else 0
    if n - n_val < 2:
        raise BertflowError(f"need at least 2 training rows, got {n} in all")
    return order[n_val:], order[:n_val]


def fit(
    model: nn.Module,
    x: Tensor,
    config: TrainConfig = TrainConfig(),
    *,
    state: TrainState | None = None,
    writer: SummaryWriter | None = None,
    on_epoch_end: Callable[[TrainState], None] | None = None,
    progress: bool = False,
) -> History:
    r"""Fit `model` to the rows of `x` by maximum likelihood under a N(0, I) base.

    `model(x)` must return `(z, log_det)`; the loss is $-\frac1N\sum \log p(x)$ in nats with
    $\log p(x) = \log N(z; 0, I) + \log|\det|$. The model is left with the weights of the best
    validation epoch, in eval mode. Pass the `state` given to `on_epoch_end` to resume.
    """
    if x.ndim != 2 or x.shape[0] < 3:
        raise BertflowError(f"need a (rows ≥ 3, dim) tensor to fit, got shape {tuple(x.shape)}")
    dim = x.shape[1]
    train_idx, val_idx = split_indices(x.shape[0], config.val_fraction, config.seed)
    x_train = x[train_idx]
    x_val = x[val_idx] if len(val_idx) else x_train
    jitter = config.noise * float((x_train - x_train.mean(0)).pow(2).mean().sqrt())
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    steps_per_epoch = math.ceil(len(train_idx) / config.batch_size)
    total_steps = steps_per_epoch * config.epochs

    if state is None:
        model.train()
        with torch.no_grad():
            first = x_train[: config.init_size]
            g = torch.Generator().manual_seed(config.seed)
            model(first + jitter * torch.randn(first.shape, generator=g) if jitter else first)
        history, step, start, bad_epochs = History(), 0, 0, 0
        best_model = _copy_state(model)
        if writer is not None:
            writer.add_scalar("cosine/input", mean_pair_cosine(x_val), 0)
    else:
        model.load_state_dict(state.model)
        optimizer.load_state_dict(state.optimizer)
        history, step, start = copy.deepcopy(state.history), state.step, state.epoch
        bad_epochs, best_model = state.bad_epochs, state.best_model

    for epoch in range(start + 1, config.epochs + 1):
        if config.patience and bad_epochs >= config.patience:
            break
        began = time.perf_counter()
        model.train()
        g = torch.Generator().manual_seed(config.seed * 1_000_003 + epoch)
        order = torch.randperm(len(train_idx), generator=g)
        batches = torch.split(order, config.batch_size)
        total, count = 0.0, 0
        bar = tqdm(batches, desc=f"epoch {epoch}", unit="batch", disable=not progress, leave=False)
        for rows in bar:
            batch = x_train[rows]
            if jitter:
                batch = batch + jitter * torch.randn(batch.shape, generator=g)
            z, log_det = model(batch)
            loss = -(standard_normal_log_prob(z) + log_det).mean()
            step += 1
            if not torch.isfinite(loss):
                raise BertflowError(
                    f"non-finite loss ({loss.item()}) at step {step} (epoch {epoch}); "
                    "try a lower learning rate or standardised inputs"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for group in optimizer.param_groups:
                group["lr"] = _learning_rate(config, step, total_steps)
            if config.max_grad_norm:
                nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            total += loss.item() * len(rows)
            count += len(rows)
            if writer is not None:
                writer.add_scalar("train/nll", loss.item(), step)
                writer.add_scalar("train/bits_per_dim", loss.item() / (dim * math.log(2)), step)
                writer.add_scalar("train/log_det", log_det.mean().item(), step)
        record = {"epoch": float(epoch), "train_nll": total / count}
        metrics, z_val = _evaluate(model, x_val, config.seed)
        record.update(metrics, seconds=time.perf_counter() - began)
        if not math.isfinite(record["val_nll"]):
            raise BertflowError(f"non-finite validation NLL after epoch {epoch} (step {step})")
        history.epochs.append(record)
        if record["val_nll"] < history.best_val_nll:
            history.best_val_nll, history.best_epoch = record["val_nll"], epoch
            best_model, bad_epochs = _copy_state(model), 0
        else:
            bad_epochs += 1
        if writer is not None:
            _log_epoch(writer, z_val, record, step)
        if on_epoch_end is not None:
            on_epoch_end(
                TrainState(
                    epoch=epoch,
                    step=step,
                    model=_copy_state(model),
                    optimizer=copy.deepcopy(optimizer.state_dict()),
                    best_model=best_model,
                    history=copy.deepcopy(history),
                    bad_epochs=bad_epochs,
                )
            )
    history.stopped_early = len(history.epochs) < config.epochs
    model.load_state_dict(best_model)
    model.eval()
    return history


@torch.no_grad()
def _evaluate(model: nn.Module, x: Tensor, seed: int) -> tuple[dict[str, float], Tensor]:
    model.eval()
    z, log_det = model(x)
    nll = -(standard_normal_log_prob(z) + log_det).mean().item()
    metrics = {
        "val_nll": nll,
        "val_bits_per_dim": nll / (x.shape[1] * math.log(2)),
        "val_log_det": log_det.mean().item(),
        "val_cosine": mean_pair_cosine(z, seed=seed),
    }
    return metrics, z


def _log_epoch(writer: SummaryWriter, z: Tensor, record: dict[str, float], step: int) -> None:
    for key in ("val_nll", "val_bits_per_dim", "val_log_det"):
        writer.add_scalar(f"val/{key.removeprefix('val_')}", record[key], step)
    writer.add_scalar("cosine/latent", record["val_cosine"], step)
    writer.add_histogram("latent/z", z, step)


def _learning_rate(config: TrainConfig, step: int, total_steps: int) -> float:
    if config.schedule == "constant":
        return config.lr
    return config.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / total_steps))


def _copy_state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
