"""Post-processing methods compared in one harness: raw pooling, standardisation alone,
BERT-whitening, all-but-the-top, and the flow. Each is fit on unlabeled embeddings and then
maps embeddings to the vectors that cosine similarity is taken on; `make_method` builds one by
its name in `METHODS`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from .constants import METHODS
from .errors import BertflowError
from .flow import FlowConfig, StandardScaler
from .head import FlowHead
from .linear import default_d, default_k, fit_weight, linear_method
from .train import TrainConfig

__all__ = [
    "METHODS",
    "AllButTheTop",
    "Fitted",
    "FlowMethod",
    "Method",
    "Raw",
    "ScalerOnly",
    "Whitening",
    "default_d",
    "default_k",
    "make_method",
    # old names
    "Flow",
    "Standardization",
]

class Method(Protocol):
    name: str

    def fit(self, x: np.ndarray) -> Method: ...

    def transform(self, x: np.ndarray) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass
class Raw:
    """The pooled embeddings as they are."""

    name: str = "raw"

    def fit(self, x: np.ndarray) -> Raw:
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        return {}


@dataclass
class ScalerOnly:
    r"""$\tilde x = (x - \mu) / \sigma$ per feature (dead features only centred): the head's
    first step, its `StandardScaler`, without the flow (the method named ``standardize``)."""

    name: str = "standardize"
    scaler: StandardScaler | None = None

    def fit(self, x: np.ndarray) -> ScalerOnly:
        self.scaler = StandardScaler.from_data(torch.from_numpy(np.asarray(x, dtype=np.float64)))
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        if self.scaler is None:
            raise BertflowError("fit the standardisation before transforming")
        with torch.no_grad():
            return self.scaler(torch.from_numpy(np.array(x, dtype=np.float32)))[0].numpy()

    def describe(self) -> dict[str, Any]:
        return {}


@dataclass
class Whitening:
    r"""BERT-whitening (Su et al., 2021): $\tilde x = (x - \mu)\, U \Lambda^{-1/2}$ with
    $\Sigma = U \Lambda U^\top$, so that the output covariance is the identity; given `k`, or
    named ``whitening-k``, only the top `k` components are kept (by default `default_k` of
    the width). See `linear.whitening_weight`."""

    k: int | None = None
    name: str = "whitening"
    mean: np.ndarray | None = None
    kernel: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.name = linear_method(self.name, self.k)
        if self.k is not None and self.k < 1:
            raise BertflowError(f"whitening needs k ≥ 1, got {self.k}")

    def fit(self, x: np.ndarray) -> Whitening:
        _, self.mean, self.kernel = fit_weight(x, self.name, k=self.k)
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        return _apply(x, self.mean, self.kernel)

    def describe(self) -> dict[str, Any]:
        return {"k": self.k} if self.name == "whitening-k" else {}


@dataclass
class AllButTheTop:
    r"""All-but-the-top (Mu & Viswanath, 2018): centre, then remove the projections on the top
    `d` principal directions (by default `default_d` of the width):
    $\tilde x = (x - \mu)(I - \sum_{i \le d} u_i u_i^\top)$."""

    d: int | None = None
    name: str = "abtt"
    mean: np.ndarray | None = None
    kernel: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.d is not None and self.d < 0:
            raise BertflowError(f"all-but-the-top needs d ≥ 0, got {self.d}")

    def fit(self, x: np.ndarray) -> AllButTheTop:
        _, self.mean, self.kernel = fit_weight(x, "abtt", d=self.d)
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        return _apply(x, self.mean, self.kernel)

    def describe(self) -> dict[str, Any]:
        return {"d": self.d}


def _apply(x: np.ndarray, mean: np.ndarray | None, kernel: np.ndarray | None) -> np.ndarray:
    """$(x - \mu) W$ in float64, as float32."""
    if mean is None or kernel is None:
        raise BertflowError("fit the method before transforming")
    return ((np.asarray(x, dtype=np.float64) - mean) @ kernel).astype(np.float32)


@dataclass
class FlowMethod:
    """The BERT-flow head, fit by maximum likelihood (see `FlowHead.fit`), as a method."""

    flow: FlowConfig = field(default_factory=FlowConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    before: str = "standardize"  # what comes before the Glow: one of constants.BEFORE
    name: str = "flow"
    head: FlowHead | None = None
    progress: bool = False

    def fit(self, x: np.ndarray) -> FlowMethod:
        self.head = FlowHead.fit(x, flow=self.flow, train=self.train, before=self.before,
                                 progress=self.progress)
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        if self.head is None:
            raise BertflowError("fit the flow before transforming")
        return self.head.transform(x)

    def describe(self) -> dict[str, Any]:
        return {"flow": self.flow.to_dict(), "train": self.train.to_dict(),
                "before": self.before}


@dataclass
class Fitted:
    """A flow head that is already fit: `fit` leaves it as it is."""

    head: FlowHead
    name: str = "flow"

    def fit(self, x: np.ndarray) -> Fitted:
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        return self.head.transform(x)

    def describe(self) -> dict[str, Any]:
        return {}


def make_method(name: str, *, k: int | None = None, d: int | None = None,
                flow: FlowConfig | None = None, train: TrainConfig | None = None,
                before: str = "standardize", progress: bool = False) -> Method:
    """A fresh method by name: one of `METHODS`; `k` for whitening and whitening-k (whitening
    keeping `k` components is whitening-k; by default whitening-k keeps `default_k` of the
    width), `d` for abtt (default `default_d`), each refused with another method
    (`linear.linear_method`); `flow`, `train` and `before` for the flow, as
    `Recipe.fit_options` gives them."""
    if name not in METHODS:
        raise BertflowError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    name = linear_method(name, k, d)
    if name == "raw":
        return Raw()
    if name == "standardize":
        return ScalerOnly()
    if name in ("whitening", "whitening-k"):
        return Whitening(k, name)
    if name == "abtt":
        return AllButTheTop(d)
    return FlowMethod(flow or FlowConfig(), train or TrainConfig(), before, progress=progress)


Standardization = ScalerOnly  # its old name
Flow = FlowMethod  # its old name
