"""Tables of embeddings read by rows, and their statistics streamed a block at a time."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from torch import Tensor

from ..errors import BertflowError
from .files import check_finite

__all__ = ["ArrayRows", "Moments", "Rows", "as_rows", "blocks", "moments"]

_READ_ROWS = 8192  # rows per block when streaming statistics


class Rows(Protocol):
    """A (rows, dim) table read by row indices or ranges as float32 arrays (`EmbeddingFile`)."""

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
    """`x` itself where it is `Rows`, else `ArrayRows` of it."""
    return x if hasattr(x, "take") and hasattr(x, "read") else ArrayRows(x)


@dataclass
class Moments:
    """Per-column count, mean and sum of squared deviations, and the sha256 of the rows read."""

    count: int
    mean: np.ndarray
    squares: np.ndarray
    sha256: str

    @property
    def std(self) -> np.ndarray:
        """The unbiased standard deviation (as `torch.std`)."""
        return np.sqrt(self.squares / max(self.count - 1, 1))

    def check_varies(self, what: str = "the rows") -> None:
        """Refuse a table whose rows are all the same (to the streamed mean's rounding)."""
        if (np.sqrt(self.squares / max(self.count, 1)) <= 1e-9 * np.abs(self.mean)).all():
            raise BertflowError(
                f"{what} are constant: every row is the same (all {len(self.mean)} features are "
                "constant, e.g. one sentence repeated), there is nothing to fit"
            )


def blocks(rows: Rows) -> Iterator[tuple[int, np.ndarray]]:
    """The rows of `rows` a block at a time: its first row's index and a float32 array."""
    for start in range(0, rows.shape[0], _READ_ROWS):
        yield start, np.ascontiguousarray(rows.read(start, start + _READ_ROWS), dtype=np.float32)


def moments(rows: Rows, chosen: np.ndarray | None = None, what: str = "the rows") -> Moments:
    """`Moments` of `rows` (where the mask `chosen` is set), merged a block at a time in
    float64 (Chan, Golub & LeVeque); a NaN or an infinity is an error naming its row."""
    count, mean, squares = 0, np.zeros(rows.shape[1]), np.zeros(rows.shape[1])
    digest = hashlib.sha256()
    for start, block in blocks(rows):
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
