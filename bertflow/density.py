"""The head as a density: how unusual an embedding is, and how well that separates domains."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

from .errors import BertflowError
from .files import check_finite
from .head import FlowHead

__all__ = ["auroc", "novelty", "typicality"]


def novelty(head: FlowHead, x: np.ndarray) -> np.ndarray:
    """−log p(x) per row under the head's density (nats): higher is less like the corpus the
    head was fit on."""
    scores = -np.asarray(head.log_prob(np.asarray(x)), dtype=np.float64)
    check_finite(scores, "the log-densities (the head overflows on these embeddings)")
    return scores


def typicality(scores: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|novelty − the median novelty of in-domain `reference` rows| (nats), from `novelty`
    scores: how far each row lies from the typical set of the head's domain, in either
    direction. Flows can give inputs from another domain a higher density than their own
    (simpler, more central inputs); this score flags them as well as the improbable ones."""
    return np.abs(np.asarray(scores) - np.median(reference))


def auroc(negative: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve of a score that should be higher for `positive` rows: the
    probability that a random positive outscores a random negative, ties counting half."""
    negative, positive = np.ravel(negative), np.ravel(positive)
    if not len(negative) or not len(positive):
        raise BertflowError("AUROC needs at least one score on each side")
    if not (np.isfinite(negative).all() and np.isfinite(positive).all()):
        raise BertflowError("AUROC needs finite scores")
    ranks = rankdata(np.concatenate([negative, positive]))
    above = ranks[len(negative):].sum() - len(positive) * (len(positive) + 1) / 2
    return float(above / (len(negative) * len(positive)))
