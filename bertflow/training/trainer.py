"""Maximum-likelihood training of a flow on embeddings, and a flow head fit that way; no files:
a `Hook` hears of progress."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..config import FlowConfig, TrainConfig
from ..constants import BEFORE
from ..embeddings.isotropy import mean_pair_cosine
from ..encoders.identity import EncoderId
from ..errors import BertflowError, first_line
from ..heads.flow import Glow, StandardScaler, bits_per_dim, log_likelihood
from ..heads.head import Head, training_rows
from ..heads.linear import LinearMap, fit_map
from ..runtime import distributed
from ..storage.rows import Rows, as_rows, moments

__all__ = ["RECORD", "History", "Hook", "TrainState", "fit", "fit_head", "split_indices"]

_EVAL_ROWS = 1024  # rows per forward pass when evaluating (the peak memory)
_SAMPLE = 4096  # held-out rows whose latents a `Hook` gets and whose mean cosine is measured
# what `fit` records of every epoch; a `measure` adds the rest
RECORD = ("epoch", "train_nll", "val_nll", "val_bits_per_dim", "val_log_det", "val_cosine",
          "seconds")


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
    """What resumes `fit` bit for bit after an epoch; `to_dict` is `weights_only`-loadable."""

    epoch: int
    step: int
    model: dict[str, Tensor]
    optimizer: dict[str, Any]
    best_model: dict[str, Tensor]
    history: History
    bad_epochs: int

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "history": asdict(self.history)}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> TrainState:
        return cls(**{**value, "history": History(**value["history"])})


class Hook(Protocol):
    """What `fit` tells: the held-out inputs, each step's scalars, each epoch's record."""

    def start(self, x: Tensor) -> None: ...

    def scalars(self, step: int, values: dict[str, float]) -> None: ...

    def epoch(self, step: int, record: dict[str, float], z: Tensor) -> None: ...


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """A seeded split of `range(n)` into (train, validation) indices: `val_fraction` of the
    rows held out (at least one, where above 0), at least 3 left to train on."""
    n_val = max(1, round(n * val_fraction)) if val_fraction > 0 else 0
    if n - n_val < 3:
        raise BertflowError(f"need at least 3 training rows: {n} rows, {n_val} of them held "
                            f"out for validation (val_fraction {val_fraction}), leave {n - n_val}")
    order = _permutation(n, torch.Generator().manual_seed(seed))
    return order[n_val:], order[:n_val]


def fit(model: nn.Module, x: Tensor | np.ndarray | Rows, config: TrainConfig = TrainConfig(),
        *, state: TrainState | None = None, hook: Hook | None = None,
        on_epoch_end: Callable[[TrainState], None] | None = None,
        measure: Callable[[nn.Module], dict[str, float]] | None = None,
        progress: bool = False) -> History:
    """Fit `model` (`model(x)` is `(z, log_det)`) to the rows of `x` by maximum likelihood under
    N(0, I), leaving the best validation epoch's weights, in eval mode. A `state` from
    `on_epoch_end` resumes its run or extends it to more epochs; `measure(model)` adds to each
    epoch's record. Under torchrun each process takes its share of each minibatch (DDP)."""
    trainer = _Trainer(model, as_rows(x), config, hook, progress, state)
    for epoch in range(trainer.epoch + 1, config.epochs + 1):
        if config.patience and trainer.bad_epochs >= config.patience:
            break
        began = time.perf_counter()
        trainer.validate(epoch, trainer.train(epoch), began, measure)
        if on_epoch_end is not None:
            on_epoch_end(trainer.state())
    trainer.history.stopped_early = len(trainer.history.epochs) < config.epochs
    model.load_state_dict(trainer.best_model)
    model.eval()
    return trainer.history


class _Trainer:
    def __init__(self, model: nn.Module, rows: Rows, config: TrainConfig, hook: Hook | None,
                 progress: bool, state: TrainState | None):
        if len(rows.shape) != 2 or rows.shape[0] < 3:
            raise BertflowError(f"need a (rows ≥ 3, dim) table to fit, got shape {rows.shape}")
        self.model, self.rows, self.config, self.hook = model, rows, config, hook
        self.progress, self.dim = progress, rows.shape[1]
        self.train_idx, self.val_idx = split_indices(rows.shape[0], config.val_fraction,
                                                     config.seed)
        if not len(self.val_idx):
            self.val_idx = self.train_idx
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self.jitter = 0.0
        if config.noise:  # times the RMS distance of the training rows from their mean
            chosen = np.zeros(rows.shape[0], dtype=bool)
            chosen[self.train_idx.numpy()] = True
            m = moments(rows, chosen)
            self.jitter = config.noise * float(np.sqrt((m.squares / m.count).mean()))
        self.optimizer = _optimizer(model, config)
        self.total_steps = math.ceil(len(self.train_idx) / config.batch_size) * config.epochs
        if state is not None:
            try:
                model.load_state_dict(state.model)
                self.optimizer.load_state_dict(state.optimizer)
            except (RuntimeError, KeyError, TypeError, ValueError) as e:
                raise BertflowError(f"the state does not fit this run ({first_line(e)})") from None
        else:  # the data-dependent initialisation (ActNorm) on the first training rows
            model.train()
            with torch.no_grad():
                first = self.batch(self.train_idx[: config.init_size])
                g = torch.Generator().manual_seed(config.seed)
                model(first + self.jitter * torch.randn(first.shape, generator=g)
                      if self.jitter else first)
            state = TrainState(0, 0, {}, {}, _copy_state(model), History(), 0)
            if hook is not None:
                hook.start(self.batch(self.val_idx[:_SAMPLE]))
        self.epoch, self.step, self.best_model = state.epoch, state.step, state.best_model
        self.history, self.bad_epochs = copy.deepcopy(state.history), state.bad_epochs
        self.net: nn.Module = _Sums(model)
        if self.world > 1:
            self.net = nn.parallel.DistributedDataParallel(self.net, forward_sync_buffers=False)

    def batch(self, indices: Tensor) -> Tensor:
        return torch.from_numpy(np.asarray(self.rows.take(indices.numpy()), dtype=np.float32))

    def train(self, epoch: int) -> float:
        """One pass over the training rows, in an order seeded by the epoch: the mean NLL."""
        self.model.train()
        g = torch.Generator().manual_seed(self.config.seed * 1_000_003 + epoch)
        order = _permutation(len(self.train_idx), g)
        total, count, size = 0.0, 0, self.config.batch_size
        bar = tqdm(range(0, len(order), size), desc=f"epoch {epoch}", unit="batch",
                   disable=not self.progress or self.rank != 0, leave=False)
        began = time.perf_counter()
        for first in bar:
            indices = self.train_idx[order[first : first + size]]
            total += self.optimise(epoch, indices, g) * len(indices)
            count += len(indices)
        if self.hook is not None:
            seconds = max(time.perf_counter() - began, 1e-9)
            self.hook.scalars(self.step, {"rows_per_second": count / seconds})
        return total / count

    def optimise(self, epoch: int, indices: Tensor, g: torch.Generator) -> float:
        """One optimiser step on this process's share of `indices`: the minibatch's mean NLL."""
        n, share = len(indices), slice(self.rank, None, self.world)
        data = self.batch(indices[share])
        if self.jitter:  # drawn for the whole minibatch: every process draws alike
            data = data + (self.jitter * torch.randn((n, self.dim), generator=g))[share]
        nll, log_det = self.net(data)
        loss = nll / (n / self.world)  # DDP averages over processes: the minibatch's mean
        sums = torch.stack([nll.detach(), log_det])
        if self.world > 1:
            torch.distributed.all_reduce(sums)
        value, log_det = (sums / n).tolist()
        self.step += 1
        if not math.isfinite(value):
            raise BertflowError(f"non-finite loss ({value}) at step {self.step} (epoch "
                                f"{epoch}); try a lower learning rate or standardised inputs")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        lr = self.config.lr * 0.5 * (1 + math.cos(math.pi * (self.step - 1) / self.total_steps)) \
            if self.config.schedule == "cosine" else self.config.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.config.max_grad_norm or self.hook is not None:  # without a ceiling: measured
            grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(),
                                                 self.config.max_grad_norm or math.inf)
        self.optimizer.step()
        if self.hook is not None:
            self.hook.scalars(self.step, {
                "nll": value, "bits_per_dim": bits_per_dim(value, self.dim), "log_det": log_det,
                "lr": lr, "grad_norm": grad_norm.item()})
        return value

    def validate(self, epoch: int, train_nll: float, began: float,
                 measure: Callable[[nn.Module], dict[str, float]] | None) -> None:
        """Record a finished epoch; keep the weights if its held-out NLL is the best yet."""
        record = {"epoch": float(epoch), "train_nll": train_nll}
        metrics, z_val = _evaluate(self.model, self.batch, self.val_idx, self.config.seed)
        if measure is not None:
            with torch.no_grad():
                measured = {k: float(v) for k, v in measure(self.model).items()}
            clash = sorted(set(measured) & set(RECORD))
            if clash:
                raise BertflowError(f"a measure may not replace the record's {clash}")
            metrics.update(measured)
        record.update(metrics, seconds=time.perf_counter() - began)
        if not math.isfinite(record["val_nll"]):
            raise BertflowError(f"non-finite validation NLL after epoch {epoch} (step {self.step})")
        if self.hook is not None:
            self.hook.epoch(self.step, record, z_val)
        self.epoch = epoch
        self.history.epochs.append(record)
        if record["val_nll"] < self.history.best_val_nll:
            self.history.best_val_nll, self.history.best_epoch = record["val_nll"], epoch
            self.best_model, self.bad_epochs = _copy_state(self.model), 0
        else:
            self.bad_epochs += 1

    def state(self) -> TrainState:
        return TrainState(self.epoch, self.step, _copy_state(self.model),
                          copy.deepcopy(self.optimizer.state_dict()), self.best_model,
                          copy.deepcopy(self.history), self.bad_epochs)


class _Sums(nn.Module):
    """NLL and log-det summed over `x`; no rows give zeros on every parameter (for DDP)."""

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
    """Held-out measures over `indices`, a block at a time, and the first `_SAMPLE` latents."""
    model.eval()
    nll = log_det_sum = 0.0
    n, kept = len(indices), []
    for start in range(0, n, _EVAL_ROWS):
        z_block, log_det = model(batch(indices[start : start + _EVAL_ROWS]))
        nll -= log_likelihood(z_block, log_det).double().sum().item()
        log_det_sum += log_det.double().sum().item()
        if start < _SAMPLE:
            kept.append(z_block[: _SAMPLE - start])
    z = torch.cat(kept)
    return {"val_nll": nll / n, "val_bits_per_dim": bits_per_dim(nll / n, z.shape[1]),
            "val_log_det": log_det_sum / n, "val_cosine": mean_pair_cosine(z, seed=seed)}, z


def _permutation(n: int, generator: torch.Generator) -> Tensor:
    """A random permutation of `range(n)`, the same as `torch.randperm`'s in int64."""
    return torch.randperm(n, generator=generator,
                          dtype=torch.int32 if n < 2**31 else torch.int64)


def _copy_state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    adam = torch.optim.AdamW if config.weight_decay else torch.optim.Adam
    return (adam if config.bias_correction else _AdamWeightDecay)(
        model.parameters(), lr=config.lr, eps=config.eps, weight_decay=config.weight_decay)


class _AdamWeightDecay(torch.optim.Optimizer):
    """BERT's AdamWeightDecayOptimizer: Adam without bias correction, decay in the update."""

    def __init__(self, params: Any, lr: float, eps: float, weight_decay: float):
        super().__init__(params, {"lr": lr, "eps": eps, "weight_decay": weight_decay,
                                  "betas": (0.9, 0.999)})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in (p for p in group["params"] if p.grad is not None):
                state = self.state[p]
                if not state:
                    state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                m, v = state["m"], state["v"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                p.sub_(group["lr"] * (m / (v.sqrt() + group["eps"]) + group["weight_decay"] * p))


def fit_head(x: np.ndarray | Tensor | Rows, *, encoder: EncoderId | None = None,
             pooling: str | None = None, max_length: int | None = None,
             before: str | LinearMap = "standardize", flow: FlowConfig = FlowConfig(),
             train: TrainConfig = TrainConfig(), corpus: dict[str, Any] | None = None,
             **training: Any) -> Head:
    """A flow head fit to embeddings `x` (an array, or `Rows` read a block at a time), with
    ``"standardize"``, ``"whiten"``, ``"none"`` or a fitted `LinearMap` (whitening or
    fractional whitening at full width) `before` the Glow; `encoder`, `pooling`,
    `max_length` and `corpus` are recorded. `training` goes to `fit`; `head.history` holds
    the epochs."""
    if not isinstance(before, LinearMap) and before not in BEFORE:
        raise BertflowError(f"before must be one of {', '.join(BEFORE)}, not {before!r}")
    data, stats, record = training_rows(x, corpus)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(train.seed)
        glow = Glow(data.shape[1], flow)
    scaler = StandardScaler.from_moments(stats) if before == "standardize" else None
    white = before if isinstance(before, LinearMap) else fit_map(
        data, "whitening", what="the training embeddings") if before == "whiten" else None
    head = Head(glow, scaler, linear=white, encoder=encoder, pooling=pooling,
                    max_length=max_length)
    history = head.history = fit(head, data, train, **training)
    head.training_info = {"corpus": record, "seed": train.seed,
                          "config": train.to_dict(), "epochs_run": len(history.epochs),
                          "best_epoch": history.best_epoch,
                          **{k: history.best.get(k)
                             for k in ("train_nll", "val_nll", "val_bits_per_dim")}}
    return head
