"""Cosine between rows: rows scaled to unit length, and exact cosine search (a query's top
documents by cosine), shared by the proxy, feedback and the retrieval harness."""

from __future__ import annotations

import numpy as np

from .errors import BertflowError

__all__ = ["PAIR_BYTES", "SCORE_BUDGET", "TOP", "top_hits", "unit_rows"]

# the working memory of exact search: a block of queries is scored against every document at
# once, a float32 score, its negation and an int64 column a pair while the top is selected
SCORE_BUDGET = 268_435_456  # 256 MiB
PAIR_BYTES = 16
TOP = 1000  # documents ranked per query, as MTEB


def unit_rows(x: np.ndarray, dtype: type = np.float64) -> np.ndarray:
    """The rows of `x` in `dtype` scaled to unit length (a zero row stays zero)."""
    x = np.asarray(x, dtype=dtype)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1)


def top_hits(queries: np.ndarray, documents: np.ndarray, top: int = TOP,
             budget: int = SCORE_BUDGET) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine search: for each query, the scores and the rows of its `top` documents
    (every one if fewer), by score descending, ties by row; (queries × top) arrays, computed
    a block of queries at a time: 256, or fewer where scoring every document would take more
    than `budget` bytes (`PAIR_BYTES` a query and document; at least one query),
    deterministic."""
    if queries.ndim != 2 or documents.ndim != 2 or queries.shape[1] != documents.shape[1]:
        raise BertflowError(f"queries {queries.shape} and documents {documents.shape} "
                            "differ in width")
    if top < 1 or not len(documents):
        raise BertflowError("nothing to search: no documents, or top < 1")
    d, top = unit_rows(documents, np.float32), min(top, len(documents))
    scores = np.empty((len(queries), top), np.float32)
    rows = np.empty((len(queries), top), np.int64)
    block = max(1, min(256, budget // (PAIR_BYTES * len(documents))))
    for start in range(0, len(queries), block):
        s = unit_rows(queries[start:start + block], np.float32) @ d.T
        kept = (_first_top(s, top) if top < s.shape[1]
                else np.broadcast_to(np.arange(s.shape[1]), s.shape))
        kept_scores = np.take_along_axis(s, kept, axis=1)
        order = np.lexsort((kept, -kept_scores), axis=1)
        rows[start:start + block] = np.take_along_axis(kept, order, axis=1)
        scores[start:start + block] = np.take_along_axis(kept_scores, order, axis=1)
    return scores, rows


def _first_top(s: np.ndarray, top: int) -> np.ndarray:
    """The columns of each row's `top` highest scores, unordered; of the scores tied with the
    last one kept, those of the lowest columns (`argpartition` keeps arbitrary ones)."""
    kept = np.argpartition(-s, top - 1, axis=1)[:, :top]
    cut = np.take_along_axis(s, kept, axis=1).min(1, keepdims=True)
    for row in np.flatnonzero((s >= cut).sum(1) > top):  # ties straddle the cut: rare
        above = np.flatnonzero(s[row] > cut[row])
        tied = np.flatnonzero(s[row] == cut[row])[: top - len(above)]
        kept[row] = np.concatenate([above, tied])
    return kept
