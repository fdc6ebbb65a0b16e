"""Vector pseudo-relevance feedback (Rocchio in embedding space), a query-time candidate beside
the heads: each query moved towards the unit vectors of its first search's top documents, then
searched again (an exact ranking, `bertflow.evaluation.retrieval`; an index,
`bertflow.search.feedback`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..constants import FEEDBACK_BETA
from ..cosine import unit_rows
from ..errors import BertflowError

__all__ = ["BLOCK", "Feedback"]

BLOCK = 1024  # queries moved at a time: their hits' vectors are held together

Search = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Feedback:
    """Rocchio in embedding space: a query q̂ (unit length) whose first search ranks the unit
    vectors d̂_1 … d̂_k first is searched again as q' = normalise(q̂ + β Σ_i w_i d̂_i), with
    w_i = 1/k, or with `weighted` each hit's cosine over the k cosines' sum (a negative one
    counts 0; where all are, the query stays). β = 0 is the plain search."""

    k: int
    beta: float = FEEDBACK_BETA
    weighted: bool = False

    def __post_init__(self) -> None:
        k, beta = self.k, self.beta
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise BertflowError(f"feedback's k (--feedback-k) must be an integer of at least 1, "
                                f"got {k!r}")
        if isinstance(beta, bool) or not isinstance(beta, int | float | np.number) or \
                not math.isfinite(beta) or beta < 0:
            raise BertflowError(f"feedback's beta (--feedback-beta) must be a finite number of "
                                f"at least 0, got {beta!r}")
        if not isinstance(self.weighted, bool):
            raise BertflowError(f"feedback's weighted is true or false, got {self.weighted!r}")
        object.__setattr__(self, "k", int(self.k))
        object.__setattr__(self, "beta", float(self.beta))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: Any) -> Feedback:
        """A `to_dict`, checked: its keys and values."""
        if not isinstance(value, dict) or set(value) != {"k", "beta", "weighted"}:
            raise BertflowError(f"feedback is k, beta and weighted, got {value!r}")
        return cls(**value)

    def check_count(self, count: int) -> None:
        """Refuse a k above the `count` documents searched."""
        if self.k > count:
            raise BertflowError(f"feedback's k (--feedback-k {self.k}) is more than the {count} "
                                "documents searched")

    def expand(self, queries: np.ndarray, hits: np.ndarray, scores: np.ndarray,
               found: np.ndarray | None = None) -> np.ndarray:
        """q' of unit `queries` (n, d) from their hits' unit vectors `hits` (n, k, d), cosines
        `scores` (n, k) and where a hit was `found` (n, k; None: all), as float32."""
        weights = np.ones(scores.shape) if found is None else found.astype(np.float64)
        if self.weighted:
            weights = weights * np.clip(scores, 0, None)
        total = weights.sum(1, keepdims=True)
        weights = weights / np.where(total > 0, total, 1)
        moved = queries + self.beta * np.einsum("nk,nkd->nd", weights, hits)
        return unit_rows(moved, np.float32)

    def refine(self, queries: np.ndarray, search: Search,
               vectors: Callable[[np.ndarray], np.ndarray], block: int = BLOCK,
               own: np.ndarray | None = None) -> np.ndarray:
        """`queries` (unit rows) moved by feedback, `block` at a time: `search(q, k)` gives
        their first hits' scores and rows (−1: none), `vectors(rows)` those rows' unit
        vectors; `own`, each query's row left out of its hits (−1: none)."""
        moved = np.empty(queries.shape, np.float32)
        for start in range(0, len(queries), block):
            q = queries[start:start + block]
            scores, rows = search(q, self.k + (own is not None))
            found = rows >= 0
            if own is not None:
                found &= rows != own[start:start + block, None]
                found &= np.cumsum(found, 1) <= self.k
            hits = vectors(np.where(found, rows, 0).ravel()).reshape(*rows.shape, -1)
            moved[start:start + block] = self.expand(q, hits, scores, found)
        return moved
