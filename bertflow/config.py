"""The settings of a flow (`FlowConfig`) and of its training (`TrainConfig`), each a round trip
through the dict a head or checkpoint saves, and a flow's ceilings: plain dataclasses, which the
command line reads and checks without importing torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, TypeVar

from .errors import BertflowError

__all__ = ["FLOW_CEILINGS", "MAX_FLOW_PARAMETERS", "DictConfig", "FlowConfig", "TrainConfig",
           "nll_text"]

C = TypeVar("C", bound="DictConfig")

# A flow's largest levels, depth (steps per level), hidden (conditioner width) and parameter
# count (1 GiB of float32 weights; training holds four times that).
FLOW_CEILINGS = {"levels": 16, "depth": 256, "hidden": 16384}
MAX_FLOW_PARAMETERS = 2**28


class DictConfig:
    """A dataclass of settings saved as a dict; reading one refuses unknown `KIND` keys."""

    KIND: ClassVar[str] = "config"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[C], value: dict[str, Any]) -> C:
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = set(value) - names
        if unknown:
            raise BertflowError(f"unknown {cls.KIND} keys: {', '.join(sorted(unknown))}")
        return cls(**value)


_CHOICES = {"coupling": ("additive", "affine"), "linear": ("lu", "reverse"),
            "factor_out": ("first", "second")}


@dataclass(frozen=True)
class FlowConfig(DictConfig):
    """Architecture of a Glow; the defaults are those of the BERT-flow release.

    `linear` is each step's mixing: ``"reverse"`` (the release's; needs depth ≥ 2) or ``"lu"``
    (`InvertibleLinear`). `factor_out` is the half of a level's output sent to the base after
    every level but the last: ``"second"`` (the release's and Glow's) or ``"first"``."""

    KIND = "flow config"

    levels: int = 3
    depth: int = 3
    coupling: str = "additive"
    hidden: int = 32
    linear: str = "reverse"
    factor_out: str = "second"

    def __post_init__(self) -> None:
        for name, ceiling in FLOW_CEILINGS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BertflowError(f"{name} must be a positive integer, got {value!r}")
            if value > ceiling:
                raise BertflowError(f"{name} must be at most {ceiling}, got {value}")
        if self.linear == "reverse" and self.depth < 2:
            raise BertflowError("reversal mixing needs depth ≥ 2 (or use linear='lu')")
        for name, (a, b) in _CHOICES.items():
            if getattr(self, name) not in (a, b):
                raise BertflowError(f"{name} must be {a!r} or {b!r}, not {getattr(self, name)!r}")

    def check(self, features: int) -> None:
        """Refuse this flow on `features`-d vectors where it cannot be built."""
        if features >> (self.levels - 1) < 2:
            raise BertflowError(f"{self.levels} levels halve {features} features below 2; "
                                "use fewer levels")
        count = self.parameters(features)
        if count > MAX_FLOW_PARAMETERS:
            raise BertflowError(f"a flow of {self.levels} levels × {self.depth} steps, hidden "
                                f"width {self.hidden}, on {features} features has {count:,} "
                                f"parameters, more than {MAX_FLOW_PARAMETERS:,}; use fewer "
                                "levels or steps, or a narrower hidden width")

    def parameters(self, features: int) -> int:
        """The `Glow`'s parameter count on `features`-d vectors, without building it (to within
        one conditioner output per step of an odd width with LU mixing)."""
        width = 2 if self.coupling == "affine" else 1  # conditioner outputs per feature
        total = 0
        for level in range(self.levels):
            n = features >> level
            kept, changed = n // 2, n - n // 2
            mixing = 2 * n * n + n if self.linear == "lu" else 0
            conditioner = (kept + 1) * self.hidden + (self.hidden + 1) * self.hidden \
                + (self.hidden + 1) * changed * width
            total += self.depth * (2 * n + mixing + conditioner)
        return total


@dataclass(frozen=True)
class TrainConfig(DictConfig):
    """Adam at `lr` (cosine decay to 0, or `constant`), early stopping after `patience` epochs
    (0: never) without a better NLL on the held-out `val_fraction`, keeping the best weights.
    `init_size` rows initialise ActNorm; `noise` jitters each batch by that many times the
    data's RMS spread; `bias_correction=False` is BERT's AdamWeightDecay (the release's)."""

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
        for name, valid, rule in (
            ("epochs", self.epochs >= 1, "at least 1"),
            ("batch_size", self.batch_size >= 1, "at least 1"),
            ("init_size", self.init_size >= 2, "at least 2"),
            ("patience", self.patience >= 0, "at least 0"),
            ("seed", 0 <= self.seed < 2**32, "in [0, 2**32)"),
            ("max_grad_norm", self.max_grad_norm is None or self.max_grad_norm > 0, "positive"),
            ("val_fraction", 0 <= self.val_fraction < 1, "in [0, 1)"),
            ("lr", self.lr > 0, "positive"),
            ("noise", self.noise >= 0, "≥ 0"),
            ("schedule", self.schedule in ("cosine", "constant"), "'cosine' or 'constant'"),
            ("weight_decay", self.weight_decay >= 0, "≥ 0"),
            ("eps", self.eps > 0, "positive"),
        ):
            if not valid:
                raise BertflowError(f"{name} must be {rule}, got {getattr(self, name)!r}")


def nll_text(record: dict[str, Any]) -> str | None:
    """A record's held-out NLL in nats and bits per dimension, as text; None without one."""
    nll, bits = record.get("val_nll"), record.get("val_bits_per_dim")
    if not isinstance(nll, (int, float)) or not isinstance(bits, (int, float)):
        return None
    return f"{nll:.3f} nats ({bits:.4f} bits/dim)"
