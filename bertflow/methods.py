"""The post-processing methods compared on STS, each fit on unlabeled embeddings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .constants import METHODS
from .errors import BertflowError
from .flow import FlowConfig, StandardScaler
from .head import FlowHead
from .linear import linear_method
from .train import TrainConfig

__all__ = ["METHODS", "Fitted", "FlowMethod", "LinearMethod", "Method", "Raw", "ScalerOnly",
           "make_method"]


class Method:
    """Fit on embeddings, then maps embeddings to the vectors cosine is taken on."""

    name: str
    head: FlowHead | None = None

    def fit(self, x: np.ndarray) -> Method:
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        if self.head is None:
            raise BertflowError(f"fit the {self.name} before transforming")
        return self.head.transform(x)

    def describe(self) -> dict[str, Any]:
        return {}


@dataclass
class Raw(Method):
    """The pooled embeddings as they are."""

    name: str = "raw"

    def transform(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)


@dataclass
class ScalerOnly(Method):
    r"""$\tilde x = (x - \mu) / \sigma$ per feature: a flow head's scaler without the flow."""

    name: str = "standardize"
    scaler: StandardScaler | None = None

    def fit(self, x: np.ndarray) -> ScalerOnly:
        self.scaler = StandardScaler.from_data(torch.from_numpy(np.asarray(x, dtype=np.float64)))
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        if self.scaler is None:
            raise BertflowError("fit the scaler before transforming")
        with torch.no_grad():
            return self.scaler(torch.from_numpy(np.array(x, dtype=np.float32)))[0].numpy()


@dataclass
class Fitted(Method):
    """A head already fit."""

    head: FlowHead
    name: str = "flow"


@dataclass
class LinearMethod(Method):
    """A linear baseline as a head (`FlowHead.fit_linear`); whitening given `k` is whitening-k."""

    name: str = "whitening"
    k: int | None = None
    d: int | None = None
    head: FlowHead | None = None

    def __post_init__(self) -> None:
        self.name = linear_method(self.name, self.k, self.d)

    def fit(self, x: np.ndarray) -> LinearMethod:
        self.head = FlowHead.fit_linear(x, self.name, k=self.k, d=self.d)
        return self

    def describe(self) -> dict[str, Any]:
        return {"whitening-k": {"k": self.k}, "abtt": {"d": self.d}}.get(self.name, {})


@dataclass
class FlowMethod(Method):
    """The flow head fit by maximum likelihood (`FlowHead.fit`)."""

    flow: FlowConfig = field(default_factory=FlowConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    before: str = "standardize"
    name: str = "flow"
    head: FlowHead | None = None
    progress: bool = False

    def fit(self, x: np.ndarray) -> FlowMethod:
        self.head = FlowHead.fit(x, flow=self.flow, train=self.train, before=self.before,
                                 progress=self.progress)
        return self

    def describe(self) -> dict[str, Any]:
        return {"flow": self.flow.to_dict(), "train": self.train.to_dict(), "before": self.before}


def make_method(name: str, *, k: int | None = None, d: int | None = None,
                flow: FlowConfig | None = None, train: TrainConfig | None = None,
                before: str = "standardize", progress: bool = False) -> Method:
    """A fresh method of `METHODS` by name: `k`, `d` for the baselines, the rest for the flow."""
    if name not in METHODS:
        raise BertflowError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    name = linear_method(name, k, d)
    if name == "raw":
        return Raw()
    if name == "standardize":
        return ScalerOnly()
    if name == "flow":
        return FlowMethod(flow or FlowConfig(), train or TrainConfig(), before, progress=progress)
    return LinearMethod(name, k, d)
