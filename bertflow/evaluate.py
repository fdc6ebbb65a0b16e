"""The STS harness: fit a method on unlabeled sentences, score the seven tasks, measure
isotropy, alignment and uniformity, and return one row per (task, aggregation)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cache import EmbeddingCache
from .constants import DEFAULT_BATCH_SIZE, DEFAULT_MAX_LENGTH, DEFAULT_POOLING
from .encoder import Encoder
from .errors import BertflowError
from .files import read_sentences, refuse_link
from .head import FlowHead
from .isotropy import alignment, isotropy_measures, uniformity
from .linear import default_d, default_k, linear_method
from .methods import Fitted, Method, make_method
from .recipes import Recipe, resolve
from .sts import TASKS, Pairs, Task, pair_vectors, positive_pairs, score

__all__ = ["AGGREGATIONS", "MEASURES", "check_rows_destination", "evaluate", "evaluate_head",
           "evaluate_method", "format_table", "pair_measures", "summarise", "undefined_notes"]

AGGREGATIONS = ("all", "wmean")
MEASURES = ("mean_cosine", "effective_rank", "condition_number", "isotropy", "alignment",
            "uniformity")  # of the scored embeddings, in every row
Embed = Callable[[Sequence[str]], np.ndarray]


def evaluate(
    tasks: dict[str, Task],
    missing: Sequence[str],
    embed: Embed,
    make: Callable[[], Method],
    fit_on: str | Sequence[str] | None,
    labels: dict[str, Any],
    also: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Rows for every task and the 7-task average, for both aggregations.

    `embed` maps sentences to pooled embeddings (usually through the cache); `make` returns a
    fresh, unfitted method. `fit_on` is ``"target"`` (each task's own sentences, without
    scores, and the sentences `also`), a list of sentences to fit once, or None for a method
    that is already fit.
    `labels` (encoder, pooling, method, fit_on) are copied into every row. No gold score is
    ever used to fit. A task whose Spearman is undefined (constant gold scores or constant
    predicted similarities) gets ``spearman`` None and the reason under ``undefined``, and is
    left out of the average; no row holds a NaN. Each row carries the `MEASURES` of the
    task's scored embeddings (`isotropy_measures`, `pair_measures`); the average's are the
    mean over its tasks.
    """
    shared = None
    if fit_on is None:
        shared = make()
    elif not isinstance(fit_on, str):
        shared = make().fit(embed(fit_on))
    rows = []
    for name in TASKS:
        if name in missing:
            rows += [{**labels, "task": name, "aggregation": a, "spearman": None,
                      "missing": True} for a in AGGREGATIONS]
            continue
        if name not in tasks:
            continue
        task = tasks[name]
        method = shared if shared is not None else make().fit(_target(embed, task, also))
        sentences = task.sentences()
        vectors = method.transform(embed(sentences))
        scores = score(task.test, sentences, vectors)
        measures = {**isotropy_measures(vectors), **pair_measures(task.test, sentences, vectors)}
        for a in AGGREGATIONS:
            row = {**labels, "task": name, "aggregation": a, "spearman": scores[a], **measures}
            if scores[a] is None:
                row["undefined"] = scores["undefined"][a]
            rows.append(row)
    return rows + summarise(rows, labels)


def _target(embed: Embed, task: Task, also: Sequence[str]) -> np.ndarray:
    """A task's own sentences' embeddings, then those of `also` (embedded apart: the cache
    keeps each set once)."""
    own = embed(task.unlabeled)
    return np.concatenate([own, np.asarray(embed(also), own.dtype)]) if also else own


def fit_sources(fit_on: str | os.PathLike | Sequence[str | os.PathLike]
                ) -> tuple[str | list[str], list[str], str]:
    """What `evaluate` fits on, from ``"target"``, a text file of sentences, or several of
    these (each task's own sentences and the files' together): its `fit_on`, its `also` and
    the label of the rows."""
    parts = [fit_on] if isinstance(fit_on, (str, os.PathLike)) else list(fit_on)
    files = [Path(p) for p in parts if str(p) != "target"]
    if not parts or len(files) + 1 < len(parts):
        raise BertflowError("fit on 'target' at most once, and on text files")
    sentences = [s for f in files for s in read_sentences(f)]
    target = len(files) < len(parts)
    label = " + ".join(["target"] * target + [f.name for f in files])
    return ("target", sentences, label) if target else (sentences, [], label)


def summarise(rows: list[dict[str, Any]], labels: dict[str, Any]) -> list[dict[str, Any]]:
    """The average over the tasks that were scored, per aggregation; it names how many."""
    out = []
    for aggregation in AGGREGATIONS:
        scored = [r for r in rows if r["aggregation"] == aggregation and r["spearman"] is not None]
        if not scored:
            continue
        row = {**labels, "task": "avg", "aggregation": aggregation,
               "spearman": float(np.mean([r["spearman"] for r in scored])),
               "tasks": [r["task"] for r in scored]}
        for key in MEASURES:
            values = [r[key] for r in scored if r.get(key) is not None]
            row[key] = float(np.mean(values)) if values and len(values) == len(scored) else None
        out.append(row)
    return out


def pair_measures(subsets: Sequence[Pairs], sentences: Sequence[str],
                  vectors: np.ndarray) -> dict[str, float | None]:
    """Wang & Isola's `alignment` of the pairs of `subsets` with gold ≥ 4 (`positive_pairs`)
    and `uniformity` of random pairs of all `vectors`, where `vectors[i]` embeds
    `sentences[i]`; None where undefined (no positive pair, fewer than two sentences)."""
    values = {"alignment": alignment(*pair_vectors(positive_pairs(subsets), sentences, vectors)),
              "uniformity": uniformity(vectors)}
    return {k: (v if math.isfinite(v) else None) for k, v in values.items()}


def format_table(rows: list[dict[str, Any]], aggregation: str = "all") -> str:
    """A markdown table: one line per (pooling, method with its k or d, fit data), one column
    per task; a task whose Spearman is undefined shows ``n/a`` (`undefined_notes` says why)."""
    keys = list(dict.fromkeys(_key(r) for r in rows))
    lines = ["| encoder | pooling | method | fit on | " + " | ".join([*TASKS, "avg"]) + " |",
             "|---|---|---|---|" + "---:|" * (len(TASKS) + 1)]
    for key in keys:
        cells = {r["task"]: r for r in rows if r["aggregation"] == aggregation
                 and _key(r) == key}
        values = [_cell(cells.get(task)) for task in [*TASKS, "avg"]]
        lines.append("| " + " | ".join(key) + " | " + " | ".join(values) + " |")
    return "\n".join(lines)


def undefined_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One line per task whose Spearman is undefined, with the reason, per aggregation."""
    return [f"n/a: {r['task']} ({r['aggregation']}): Spearman undefined, {r['undefined']}"
            for r in rows if r.get("undefined")]


def _key(row: dict[str, Any]) -> tuple[str, str, str, str]:
    """A row's encoder, pooling, method (with its k or d: ``whitening-k (k=128)``) and fit
    data."""
    options = ", ".join(f"{o}={row[o]}" for o in ("k", "d") if row.get(o) is not None)
    method = f"{row['method']} ({options})" if options else row["method"]
    return row["encoder"], row["pooling"], method, row["fit_on"]


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    if row.get("missing"):
        return "missing"
    if row.get("undefined"):
        return "n/a"
    value = row["spearman"]
    return "" if value is None or math.isnan(value) else f"{value:.2f}"


def evaluate_head(
    tasks: dict[str, Task],
    missing: Sequence[str],
    head: FlowHead,
    encoder: Encoder,
    cache: EmbeddingCache,
    *,
    name: str,
    pooling: str | None = None,
    max_length: int = DEFAULT_MAX_LENGTH,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool | None = None,
) -> list[dict[str, Any]]:
    """`evaluate` a fitted head (called `name` in the rows) on embeddings of `encoder` with
    its pooling (`pooling`, when given, must be the head's) and its max length (`max_length`
    for a head that records none), through `cache`."""
    head.check(dim=encoder.width(head.pooling or DEFAULT_POOLING), encoder=encoder.id)
    if pooling is not None:
        head.check(pooling=pooling)
    pooling, max_length = head.pooling or DEFAULT_POOLING, head.max_length or max_length
    corpus = head.training_info.get("corpus") or {}
    labels = {"encoder": encoder.id.name, "pooling": pooling, "method": head.method, "head": name,
              "fit_on": str(corpus.get("file") or corpus.get("name") or "head")}
    embed = cache.embedder(encoder, pooling, max_length, batch_size, progress)
    return evaluate(tasks, missing, embed, lambda: Fitted(head), None, labels)


def evaluate_method(
    tasks: dict[str, Task],
    missing: Sequence[str],
    method: str,
    encoder: Encoder,
    cache: EmbeddingCache,
    *,
    pooling: str = DEFAULT_POOLING,
    max_length: int = DEFAULT_MAX_LENGTH,
    fit_on: str | os.PathLike | Sequence[str | os.PathLike] = "target",
    k: int | None = None,
    d: int | None = None,
    recipe: Recipe | dict[str, Any] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool | None = None,
) -> list[dict[str, Any]]:
    """`evaluate` a method of `METHODS`, fit on each task's own sentences (``"target"``), on
    the sentences of the text file `fit_on`, or on several of these together (`fit_sources`),
    on embeddings of `encoder` with `pooling`
    through `cache`. `k` applies to whitening (whitening keeping `k` components is
    whitening-k) and whitening-k (default `default_k` of the width), `d` to abtt (default
    `default_d`); the flow is fit by `recipe` (a `Recipe`, or changes to the pooling's
    recommended one)."""
    method = linear_method(method, k, d)
    sentences, also, fit_label = fit_sources(fit_on)
    width = encoder.width(pooling)
    k = default_k(width) if method == "whitening-k" and k is None else k
    d = default_d(width) if method == "abtt" and d is None else d
    recipe = resolve(recipe, pooling)

    def make() -> Method:
        return make_method(method, k=k, d=d, **recipe.fit_options(),
                           progress=progress is not False)

    labels = {"encoder": encoder.id.name, "pooling": pooling, "method": method,
              **make().describe(), "fit_on": fit_label}
    embed = cache.embedder(encoder, pooling, max_length, batch_size, progress)
    return evaluate(tasks, missing, embed, make, sentences, labels, also)


def check_rows_destination(path: Path) -> None:
    """`eval --json` may replace the rows of an earlier `eval`, but no other file, a folder or
    a symbolic link."""
    if path.is_dir():
        raise BertflowError(f"--json {path} is a folder")
    refuse_link(path)
    if not path.exists():
        return
    try:
        rows = json.loads(path.read_bytes())
    except (OSError, ValueError):
        rows = None
    if not (isinstance(rows, list) and rows and all(
            isinstance(row, dict) and {"task", "aggregation", "spearman"} <= row.keys()
            for row in rows)):
        raise BertflowError(f"--json {path} exists and is not rows written by bertflow eval; "
                            "not replacing it")
