"""Semantic textual similarity: task readers (SentEval layout), cosine scoring, Spearman."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from ..constants import TASKS
from ..errors import BertflowError
from ..storage.files import iter_sentences

__all__ = ["POSITIVE_GOLD", "STS_SUBSETS", "TASKS", "Pairs", "Task", "cosine", "load_task",
           "load_tasks", "pair_spearman", "pair_vectors", "positive_pairs", "read_sick",
           "read_sts_subset", "read_stsb", "read_stsb_splits", "score", "sentences_of", "spearman",
           "undefined"]

STS_SUBSETS = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
POSITIVE_GOLD = 4.0  # a pair scored at least this (of 5) is a paraphrase: SimCSE's positives
_FOLDERS = {**{t: f"{t}-en-test" for t in STS_SUBSETS}, "STS-B": "STSBenchmark", "SICK-R": "SICK"}
_SICK_FILES = {"train": "SICK_train.txt", "trial": "SICK_trial.txt",
               "test": "SICK_test_annotated.txt"}
_PARTS = {**STS_SUBSETS, "STS-B": ("train", "dev", "test"), "SICK-R": tuple(_SICK_FILES)}


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


@dataclass(frozen=True)
class Task:
    """A benchmark: its scored subsets, and all its sentences without scores (every split)."""

    name: str
    test: tuple[Pairs, ...]
    unlabeled: tuple[str, ...]

    def sentences(self) -> list[str]:
        """Every distinct sentence of the scored pairs."""
        return sentences_of(self.test)


def sentences_of(pairs: Iterable[Pairs]) -> list[str]:
    """Every distinct sentence of these pairs, in first-seen order."""
    return list(dict.fromkeys(s for each in pairs for s in each.sentences()))


def read_stsb(folder: str | os.PathLike, split: str) -> Pairs:
    """STS-B as SentEval ships it: `sts-{split}.csv`, tab-separated, the score in column 5 and
    the sentences in columns 6 and 7 (some lines carry extra source columns after them)."""
    path = Path(folder) / f"sts-{split}.csv"
    return _read_pairs(f"STS-B {split}", path, _tab_lines(path), (4, 5, 6),
                       ": expected a score in column 5 and sentences in columns 6 and 7")


def read_stsb_splits(folder: str | os.PathLike,
                     splits: Sequence[str] = ("train", "dev", "test")) -> dict[str, Pairs]:
    """STS-B's `splits` by name."""
    return {split: read_stsb(folder, split) for split in splits}


def read_sick(folder: str | os.PathLike, split: str) -> Pairs:
    """One SICK split, tab-separated under a header naming its columns."""
    if split not in _SICK_FILES:
        raise BertflowError(f"SICK has no split {split!r}; choose one of {', '.join(_SICK_FILES)}")
    path = Path(folder) / _SICK_FILES[split]
    lines = _tab_lines(path)
    try:
        columns = tuple(lines[0][1].index(c) for c in ("relatedness_score", "sentence_A",
                                                       "sentence_B"))
    except ValueError:
        raise BertflowError(f"{path} line 1 is not a SICK header "
                            "(sentence_A, sentence_B, relatedness_score)") from None
    return _read_pairs(f"SICK-R {split}", path, lines[1:], columns)


def read_sts_subset(folder: str | os.PathLike, subset: str) -> Pairs:
    """One SemEval STS subset in SentEval's layout: `STS.input.<subset>.txt` (two sentences,
    tab-separated) and `STS.gs.<subset>.txt` (their 0-5 score; a pair without one is skipped)."""
    folder = Path(folder)
    inputs = folder / f"STS.input.{subset}.txt"
    scores = folder / f"STS.gs.{subset}.txt"
    pairs = _tab_lines(inputs, allow_empty=True)
    golds = list(iter_sentences(scores, blank_ok=True))
    if len(pairs) != len(golds):
        raise BertflowError(f"{scores} has {len(golds)} lines but {inputs} has {len(pairs)}")
    scored = [(number, [value, *fields])
              for (number, fields), value in zip(pairs, golds, strict=True) if value.strip()]
    for number, fields in scored:
        if len(fields) != 3:
            raise BertflowError(f"{inputs} line {number} is malformed: expected 2 tab-separated "
                                f"sentences, found {len(fields) - 1} fields")
    return _read_pairs(f"{folder.name} {subset}", scores, scored, (0, 1, 2),
                       ": {!r} is not a score")


def _read_pairs(name: str, path: Path, lines: list[tuple[int, list[str]]],
                columns: tuple[int, int, int], expected: str = "") -> Pairs:
    """The pairs of tab-separated `lines`, the score and the two sentences in `columns`."""
    first, second, gold = [], [], []
    for number, fields in lines:
        try:
            score, a, b = float(fields[columns[0]]), fields[columns[1]], fields[columns[2]]
        except (IndexError, ValueError):
            bad = expected.format(fields[columns[0]][:40] if len(fields) > columns[0] else "")
            raise BertflowError(f"{path} line {number} is malformed{bad}") from None
        if not math.isfinite(score):
            raise BertflowError(f"{path} line {number}: gold score "
                                f"{fields[columns[0]].strip()[:40]!r} is not a finite number")
        gold.append(score)
        first.append(a)
        second.append(b)
    if not gold:
        raise BertflowError(f"{path} holds no scored pairs")
    return Pairs(name, first, second, np.asarray(gold, dtype=np.float64))


def load_task(data: str | os.PathLike, name: str) -> Task | None:
    """Task `name` from data folder `data`, or None when its folder is absent."""
    if name not in TASKS:
        raise BertflowError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    folder = Path(data) / _FOLDERS[name]
    if not folder.is_dir():
        return None
    read = {"STS-B": read_stsb, "SICK-R": read_sick}.get(name, read_sts_subset)
    splits = [read(folder, part) for part in _PARTS[name]]
    test = tuple(splits) if name in STS_SUBSETS else (splits[2],)  # the test split alone
    return Task(name, test, tuple(sentences_of(splits)))


def load_tasks(data: str | os.PathLike,
               names: Sequence[str] = TASKS) -> tuple[dict[str, Task], list[str]]:
    """The tasks found in `data`, and the names of those missing from it."""
    if not Path(data).is_dir():
        raise BertflowError(f"no data folder at {data}")
    tasks = {name: load_task(data, name) for name in names}
    found = {name: task for name, task in tasks.items() if task is not None}
    return found, [name for name, task in tasks.items() if task is None]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(1) / np.maximum(norms, 1e-12)


def spearman(predicted: np.ndarray, gold: np.ndarray) -> float:
    """Spearman's rank correlation × 100; NaN where it is undefined (see `undefined`)."""
    if undefined(predicted, gold) is not None:
        return math.nan
    return float(spearmanr(predicted, gold).statistic) * 100


def undefined(predicted: np.ndarray, gold: np.ndarray) -> str | None:
    """Why Spearman's correlation is undefined (a side not finite, or constant), else None."""
    predicted, gold = np.asarray(predicted, dtype=np.float64), np.asarray(gold, np.float64)
    if not np.isfinite(gold).all():
        return "non-finite gold scores"
    if not np.isfinite(predicted).all():
        return "non-finite predicted similarities"
    if len(gold) < 2 or np.all(gold == gold[0]):
        return "constant gold scores"
    if np.all(predicted == predicted[0]):
        return "constant predicted similarities"
    return None


def pair_spearman(pairs: Pairs, sentences: Sequence[str], vectors: np.ndarray) -> float | None:
    """Spearman × 100 of gold against cosine (`vectors[i]` embeds `sentences[i]`), or None."""
    return score((pairs,), sentences, vectors)["all"]


def score(subsets: Sequence[Pairs], sentences: Sequence[str],
          vectors: np.ndarray) -> dict[str, Any]:
    """Spearman × 100 of cosine against gold, aggregated two ways over the subsets: ``all``
    pools every pair (SimCSE and later work); ``wmean`` averages the per-subset correlations
    weighted by size (the BERT-flow and BERT-whitening papers). An undefined aggregation (in
    any one subset, for ``wmean``) is None, its reason under ``undefined``: no NaN."""
    row = {s: i for i, s in enumerate(sentences)}
    similarities = [cosine(*pair_vectors(pairs, row, vectors)) for pairs in subsets]
    each = list(zip(subsets, similarities, strict=True))
    reasons = [f"{reason} in {p.name}" for p, s in each if (reason := undefined(s, p.gold))]
    predicted, gold = np.concatenate(similarities), np.concatenate([p.gold for p in subsets])
    why = {"all": undefined(predicted, gold), "wmean": "; ".join(reasons) or None}
    return {
        "all": None if why["all"] else float(spearmanr(predicted, gold).statistic) * 100,
        "wmean": None if why["wmean"] else float(np.average(
            [spearmanr(s, p.gold)[0] * 100 for p, s in each], weights=[len(p) for p in subsets])),
        "undefined": {k: v for k, v in why.items() if v is not None},
    }


def pair_vectors(pairs: Pairs, sentences: Sequence[str] | dict[str, int],
                 vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The vectors of each pair's first and second sentences, `vectors[i]` embedding
    `sentences[i]` (or, given a dict, `vectors[sentences[s]]` embedding `s`)."""
    row = sentences if isinstance(sentences, dict) else {s: i for i, s in enumerate(sentences)}
    try:
        return vectors[[row[s] for s in pairs.first]], vectors[[row[s] for s in pairs.second]]
    except KeyError as e:
        raise BertflowError(f"no vector for sentence {e.args[0]!r} of {pairs.name}") from None


def positive_pairs(subsets: Iterable[Pairs], threshold: float = POSITIVE_GOLD) -> Pairs:
    """The pairs of `subsets` with gold ≥ `threshold` as one `Pairs` (alignment's positives)."""
    kept = [(pairs, np.flatnonzero(pairs.gold >= threshold)) for pairs in subsets]
    return Pairs(f"gold ≥ {threshold:g} in {', '.join(p.name for p, _ in kept)}",
                 [p.first[i] for p, keep in kept for i in keep],
                 [p.second[i] for p, keep in kept for i in keep],
                 np.concatenate([np.zeros(0), *(p.gold[keep] for p, keep in kept)]))


def _tab_lines(path: Path, allow_empty: bool = False) -> list[tuple[int, list[str]]]:
    """(line number, tab-separated fields) of each line not blank, or of every line."""
    lines = enumerate(iter_sentences(path, blank_ok=True), start=1)
    out = [(number, line.split("\t")) for number, line in lines if line.strip() or allow_empty]
    if not out:
        raise BertflowError(f"{path} is empty")
    return out
