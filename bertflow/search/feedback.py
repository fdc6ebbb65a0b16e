"""Pseudo-relevance feedback (`bertflow.training.feedback`) on a FAISS index of bertflow's:
searched in the space of the vectors it stores, which it gives back for each query's hits."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import BertflowError
from ..training.feedback import Feedback
from .kinds import faiss_module, faiss_reason, inverted_lists

__all__ = ["UNIT_TOLERANCE", "check_index", "search_index"]

UNIT_TOLERANCE = 1e-3  # how far from 1 the length of a vector read back from an index may be
_PROBE = 64  # vectors an index gives back when feedback is set on it


def search_index(index: Any, kind: str, feedback: Feedback, x: np.ndarray,
                 k: int) -> tuple[np.ndarray, np.ndarray]:
    """Search `index` (of `kind`, made by `bertflow.search.kinds.make`) for `x` with
    `feedback`, in the space of the vectors it stores: `x` through its transforms (PCA, unit
    length, a string's own), then its last index searched, its hits read back."""
    chain, last = _parts(index)
    for step in chain:
        x = step.apply(x)
    moved = feedback.refine(x, last.search, lambda rows: _stored(last, kind, rows))
    return last.search(moved, k)


def check_index(index: Any, kind: str) -> None:
    """Refuse feedback on `index` where it cannot give back its vectors at unit length."""
    _stored(_parts(index)[1], kind, np.arange(min(_PROBE, index.ntotal)))


def _parts(index: Any) -> tuple[list[Any], Any]:
    """The vector transforms of `index`, in order, and the index they lead to."""
    faiss = faiss_module()
    chain, inner = [], faiss.downcast_index(index)
    while isinstance(inner, faiss.IndexPreTransform):
        chain += [faiss.downcast_VectorTransform(inner.chain.at(i))
                  for i in range(inner.chain.size())]
        inner = faiss.downcast_index(inner.index)
    return chain, inner


def _stored(index: Any, kind: str, rows: np.ndarray) -> np.ndarray:
    """The vectors of `rows` that `index` holds, checked to be of unit length."""
    faiss = faiss_module()
    ivf = inverted_lists(index)
    if ivf is not None and ivf.direct_map.type == faiss.DirectMap.NoMap:
        ivf.make_direct_map()  # where each vector is in the lists
    try:
        vectors = index.reconstruct_batch(np.ascontiguousarray(rows, dtype=np.int64))
    except RuntimeError as e:
        raise BertflowError(f"feedback (--feedback-k) reads the index's vectors back; kind "
                            f"{kind!r} cannot give them ({faiss_reason(e)})") from None
    lengths = np.linalg.norm(vectors, axis=1)
    if len(lengths) and np.abs(lengths - 1).max() > UNIT_TOLERANCE:
        raise BertflowError(f"feedback (--feedback-k) needs the index's vectors at unit length; "
                            f"kind {kind!r} gives them back at lengths {lengths.min():.3f} to "
                            f"{lengths.max():.3f} (it compresses them: use flat, hnsw or a kind "
                            "that stores them whole, such as IVF…,Flat)")
    return vectors
