"""Semantic textual similarity: task readers, cosine scoring and Spearman correlation."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from .errors import BertflowError

__all__ = ["Pairs", "cosine", "pair_spearman", "read_stsb", "spearman"]


@dataclass(frozen=True)
class Pairs:
    """Sentence pairs with gold similarity scores."""

    name: str
    first: list[str]
    second: list[str]
    gold: np.ndarray

    def __len__(self) -> int:
        return len(self.gold)

    def sentences(self) -> list[str]:
        """Every distinct sentence, in first-seen order."""
        return list(dict.fromkeys(self.first + self.second))


def read_stsb(folder: str | os.PathLike, split: str) -> Pairs:
    """STS-B in SentEval's layout: `sts-{split}.csv`, tab-separated, score in column 5 and the
    sentences in columns 6 and 7 (a few lines carry extra source columns after them)."""
    path = Path(folder) / f"sts-{split}.csv"
    if not path.is_file():
        raise BertflowError(f"no STS-B {split} file at {path}")
    first, second, gold = [], [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            fields = line.rstrip("\n").split("\t")
            try:
                score = float(fields[4])
                a, b = fields[5], fields[6]
            except (IndexError, ValueError):
                raise BertflowError(f"{path} line {number} is malformed") from None
            first.append(a)
            second.append(b)
            gold.append(score)
    if not gold:
        raise BertflowError(f"{path} holds no pairs")
    return Pairs(f"STS-B {split}", first, second, np.asarray(gold, dtype=np.float64))


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(1) / np.maximum(norms, 1e-12)


def spearman(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Spearman's rank correlation × 100."""
    return float(spearmanr(predicted, gold).statistic) * 100


def pair_spearman(pairs: Pairs, sentences: Sequence[str], vectors: np.ndarray) -> float:
    """Spearman × 100 between gold scores and the cosine of each pair's vectors, where
    `vectors[i]` embeds `sentences[i]` and every sentence of `pairs` is among them."""
    row = {s: i for i, s in enumerate(sentences)}
    try:
        first = vectors[[row[s] for s in pairs.first]]
        second = vectors[[row[s] for s in pairs.second]]
    except KeyError as e:
        raise BertflowError(f"no vector for sentence {e.args[0]!r} of {pairs.name}") from None
    return spearman(cosine(first, second), pairs.gold)
