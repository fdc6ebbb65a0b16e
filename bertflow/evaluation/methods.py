"""The post-processing methods compared on STS, each fit on unlabeled embeddings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..config import DictConfig, FlowConfig, TrainConfig
from ..constants import METHODS
from ..errors import BertflowError
from ..heads.flow import StandardScaler
from ..heads.head import Head
from ..storage.rows import as_rows, moments
from ..training.recipes import Recipe, choose
from ..training.spec import MethodSpec
from ..training.trainer import fit_head

__all__ = ["METHODS", "Method", "flow_by_recipe", "make_method"]


@dataclass
class Method:
    """A method of `METHODS` fit on embeddings, mapping them to the vectors cosine is taken on:
    ``raw`` as they are, ``standardize`` by a flow head's scaler alone, the rest by a `head` fit
    with `options` (`fit_head` for the flow, `Head.fit_linear` for the baselines)."""

    name: str = "raw"
    options: dict[str, Any] = field(default_factory=dict)
    head: Head | None = None
    scaler: StandardScaler | None = None
    # a flow by `pooling`'s recipe changed by `given` (`bertflow.training.recipes.choose`), chosen
    # where it is fit: the `recipe` and the mean pair `cosine` the rule read, whose settings
    # replace `options`'
    pooling: str | None = None
    given: Recipe | dict[str, Any] | None = None
    recipe: Recipe | None = None
    cosine: float | None = None

    def fit(self, x: np.ndarray) -> Method:
        if self.name == "standardize":
            self.scaler = StandardScaler.from_moments(moments(as_rows(x)))
        elif self.name == "flow":
            if self.pooling is not None:
                self.recipe, self.cosine = choose(self.given, self.pooling, x, stacklevel=3)
                self.options = {**self.options, **self.recipe.fit_options()}
            self.head = fit_head(x, **self.options)
        elif self.name != "raw":
            self.head = Head.fit_linear(x, self.name, **self.options)
        return self

    def transform(self, x: np.ndarray) -> np.ndarray:
        if self.name == "raw":
            return np.asarray(x, dtype=np.float32)
        if self.scaler is not None:
            with torch.no_grad():
                return self.scaler(torch.from_numpy(np.array(x, dtype=np.float32)))[0].numpy()
        if self.head is None:
            raise BertflowError(f"fit the {self.name} before transforming")
        return self.head.transform(x)

    def describe(self) -> dict[str, Any]:
        """The options that a row of results records: `k`, `d`, `shrinkage`, or the flow's
        settings."""
        return {key: value.to_dict() if isinstance(value, DictConfig) else value
                for key, value in self.options.items() if key != "progress"}

    def settled(self) -> dict[str, Any]:
        """What `choose` chose, for a row of results: the flow's settings, the kind of text its
        recipe was chosen on (``recipe_corpus``) and the mean pair cosine the rule read
        (``mean_cosine``, where it read one); empty where nothing was settled."""
        if self.recipe is None:
            return {}
        cosine = {} if self.cosine is None else {"mean_cosine": self.cosine}
        return {**self.describe(), "recipe_corpus": self.recipe.corpus, **cosine}


def make_method(name: str, *, k: int | None = None, d: int | None = None,
                shrinkage: float | str | None = None, gamma: float | None = None,
                flow: FlowConfig | None = None, train: TrainConfig | None = None,
                before: str = "standardize", progress: bool = False) -> Method:
    """A fresh method of `METHODS` by name: `k`, `d`, `shrinkage` and `gamma` (where given)
    for the linear maps, the rest for the flow."""
    name = MethodSpec(name, k, d, shrinkage, gamma=gamma).name  # whitening with k is whitening-k
    if name == "flow":
        return Method(name, {"flow": flow or FlowConfig(), "train": train or TrainConfig(),
                             "before": before, "progress": progress})
    given = {"k": k, "d": d, "shrinkage": shrinkage, "gamma": gamma}
    return Method(name, {key: value for key, value in given.items() if value is not None})


def flow_by_recipe(pooling: str, recipe: Recipe | dict[str, Any] | None = None, *,
                   progress: bool = False) -> Method:
    """A fresh flow by `pooling`'s recommended recipe changed by `recipe`, chosen on the
    embeddings it is fit on (`bertflow.training.recipes.choose`)."""
    return Method("flow", {**choose(recipe, pooling)[0].fit_options(), "progress": progress},
                  pooling=pooling, given=recipe)
