"""What a fit makes, stated once: a method of `METHODS` and its options, checked when the
specification is made and passed whole to the fit job and to the evaluations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..constants import METHODS
from ..errors import BertflowError
from ..heads.linear import LINEAR_METHODS, linear_method, linear_options
from .recipes import Recipe

__all__ = ["MethodSpec"]


@dataclass(frozen=True)
class MethodSpec:
    """A method of `METHODS` (`raw`, `standardize`, the linear maps, `flow`) with its options:
    `k` components kept (whitening-k, PCA, fractional whitening), `d` directions removed by
    all-but-the-top, whitening's covariance `shrinkage` (α, or the estimator choosing it), the
    flow's `recipe` (a whole `Recipe`, or its changes to the pooling's recommended one,
    `bertflow.training.recipes.choose`) and fractional whitening's power `gamma` (or
    ``spectrum``: chosen from the eigenspectrum). Whitening with
    `k` is whitening-k; an option of another method is refused."""

    name: str = "flow"
    k: int | None = None
    d: int | None = None
    shrinkage: float | str | None = None
    recipe: Recipe | dict[str, Any] | None = None
    gamma: float | str | None = None

    def __post_init__(self) -> None:
        if self.name not in METHODS:
            raise BertflowError(f"unknown method {self.name!r}; choose one of "
                                f"{', '.join(METHODS)}")
        object.__setattr__(self, "name", linear_method(self.name, self.k, self.d,
                                                       self.shrinkage, self.gamma))
        if self.recipe is not None and self.name != "flow":
            raise BertflowError(f"a recipe applies to the flow, not to {self.name}")

    @classmethod
    def of(cls, method: str | MethodSpec) -> MethodSpec:
        """`method` as a specification: a name with no options, or a specification as is."""
        return method if isinstance(method, MethodSpec) else cls(method)

    @property
    def is_linear(self) -> bool:
        """Whether the method is a linear map fit in closed form (`LINEAR_METHODS`)."""
        return self.name in LINEAR_METHODS

    def linear_options(self, dim: int) -> dict[str, Any]:
        """The options of the linear map on `dim`-d embeddings, defaults filled in."""
        return linear_options(self.name, dim, self.k, self.d, self.shrinkage, self.gamma)
