"""The head as a density: how unusual an embedding is, and how well that separates domains."""

from __future__ import annotations

import numpy as np
from scipy.stats import mannwhitneyu

from ..errors import BertflowError
from ..storage.files import check_finite
from .head import Head

__all__ = ["auroc", "novelty", "typicality"]


def novelty(head: Head, x: np.ndarray) -> np.ndarray:
    """−log p(x) per row under the head's density (nats): higher is less like its corpus."""
    scores = -np.asarray(head.log_prob(np.asarray(x)), dtype=np.float64)
    check_finite(scores, "the log-densities (the head overflows on these embeddings)")
    return scores


def typicality(scores: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|`scores` − the median of in-domain `reference` scores| (`novelty`, nats): it also flags
    the inputs from another domain that a flow finds more likely than its own."""
    return np.abs(np.asarray(scores) - np.median(reference))


def auroc(negative: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve of a score higher for `positive` rows, ties counting half."""
    negative, positive = np.ravel(negative), np.ravel(positive)
    if not len(negative) or not len(positive):
        raise BertflowError("AUROC needs at least one score on each side")
    if not (np.isfinite(negative).all() and np.isfinite(positive).all()):
        raise BertflowError("AUROC needs finite scores")
    return float(mannwhitneyu(positive, negative).statistic / (len(negative) * len(positive)))
