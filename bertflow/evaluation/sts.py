"""The STS harness: fit a method on unlabeled sentences, and score each task per aggregation."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..constants import DEFAULT_BATCH_SIZE, LINEAR_OPTIONS
from ..data.sts import TASKS, Pairs, Task, pair_vectors, positive_pairs, score
from ..embeddings.cache import EmbeddingCache
from ..embeddings.isotropy import alignment, isotropy_measures, uniformity
from ..encoders.encoder import Encoder
from ..errors import BertflowError
from ..heads.head import Head
from ..storage.files import read_sentences
from ..training.spec import MethodSpec
from .methods import Method, flow_by_recipe, make_method

__all__ = ["AGGREGATIONS", "MEASURES", "evaluate", "evaluate_method", "format_table",
           "method_maker", "pair_measures", "row_key", "summarise", "undefined_notes"]

AGGREGATIONS = ("all", "wmean")
MEASURES = ("mean_cosine", "effective_rank", "condition_number", "isotropy", "alignment",
            "uniformity")  # of the scored embeddings, in every row
Embed = Callable[[Sequence[str]], np.ndarray]
Results = list[dict[str, Any]]
FitOn = str | os.PathLike | Sequence[str | os.PathLike]  # "target", text files, or both


def evaluate(tasks: dict[str, Task], missing: Sequence[str], embed: Embed,
             make: Callable[[], Method], fit_on: str | Sequence[str] | None,
             labels: dict[str, Any], also: Sequence[str] = ()) -> Results:
    """Rows for every task and their average, per aggregation, with `labels` and `MEASURES`;
    `make()` is fit on each task's sentences and `also` (`fit_on` ``"target"``), once on the
    sentences `fit_on`, or not at all (None). An undefined Spearman is None (see ``undefined``)."""
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
        method = shared
        if method is None:  # fit on the task's own sentences, then `also` (embedded apart)
            own = embed(task.unlabeled)
            method = make().fit(np.concatenate([own, np.asarray(embed(also), own.dtype)])
                                if also else own)
        sentences = task.sentences()
        vectors = method.transform(embed(sentences))
        scores = score(task.test, sentences, vectors)
        measures = {**isotropy_measures(vectors), **pair_measures(task.test, sentences, vectors)}
        settled = method.settled()  # what the rule chose (`Method.settle`)
        labels = {**dict.fromkeys(settled), **labels}  # the averages say it where tasks agree
        for a in AGGREGATIONS:
            row = {**labels, **settled, "task": name, "aggregation": a, "spearman": scores[a],
                   **measures}
            if scores[a] is None:
                row["undefined"] = scores["undefined"][a]
            rows.append(row)
    return rows + summarise(rows, labels)


def fit_parts(fit_on: FitOn, sources: Sequence[str]) -> list[str | Path]:
    """`fit_on` as the named `sources` (each at most once) and text files, in order."""
    given = [fit_on] if isinstance(fit_on, (str, os.PathLike)) else list(fit_on)
    parts = [str(p) if str(p) in sources else Path(p) for p in given]
    named = [p for p in parts if isinstance(p, str)]
    if not parts or len(set(named)) < len(named):
        each = " each" if len(sources) > 1 else ""
        raise BertflowError(f"fit on {' and '.join(map(repr, sources))} at most once{each}, "
                            "and on text files")
    return parts


def fit_sources(fit_on: FitOn) -> tuple[str | list[str], list[str], str]:
    """`evaluate`'s `fit_on`, `also` and label from ``"target"`` and/or text files."""
    parts = fit_parts(fit_on, ("target",))
    files = [p for p in parts if isinstance(p, Path)]
    sentences = [s for f in files for s in read_sentences(f)]
    target = len(files) < len(parts)
    label = " + ".join(["target"] * target + [f.name for f in files])
    return ("target", sentences, label) if target else (sentences, [], label)


def summarise(rows: Results, labels: dict[str, Any]) -> Results:
    """The average over the tasks that were scored, per aggregation; it names how many."""
    out = []
    for aggregation in AGGREGATIONS:
        scored = [r for r in rows if r["aggregation"] == aggregation and r["spearman"] is not None]
        if not scored:
            continue
        agreed = {k: scored[0].get(k) if all(r.get(k) == scored[0].get(k) for r in scored)
                  else None for k in labels}  # what the tasks' fits share
        row = {**agreed, "task": "avg", "aggregation": aggregation,
               "spearman": float(np.mean([r["spearman"] for r in scored])),
               "tasks": [r["task"] for r in scored]}
        for key in MEASURES:
            values = [r[key] for r in scored if r.get(key) is not None]
            row[key] = float(np.mean(values)) if len(values) == len(scored) else None
        out.append(row)
    return out


def pair_measures(subsets: Sequence[Pairs], sentences: Sequence[str],
                  vectors: np.ndarray) -> dict[str, float | None]:
    """The `alignment` of the pairs with gold ≥ 4 and the `uniformity` of all `vectors`."""
    values = {"alignment": alignment(*pair_vectors(positive_pairs(subsets), sentences, vectors)),
              "uniformity": uniformity(vectors)}
    return {k: (v if math.isfinite(v) else None) for k, v in values.items()}


def format_table(rows: Results, aggregation: str = "all") -> str:
    """A markdown table: one line per (encoder, pooling, method, fit data), a column per task."""
    cells: dict[tuple[str, ...], dict[str, str]] = {row_key(r): {} for r in rows}
    for r in rows:
        if r["aggregation"] == aggregation:
            cells[row_key(r)][r["task"]] = _cell(r)
    lines = ["| encoder | pooling | method | fit on | " + " | ".join([*TASKS, "avg"]) + " |",
             "|---|---|---|---|" + "---:|" * (len(TASKS) + 1)]
    for key, line in cells.items():
        values = [line.get(task, "") for task in [*TASKS, "avg"]]
        lines.append("| " + " | ".join(key) + " | " + " | ".join(values) + " |")
    return "\n".join(lines)


def undefined_notes(rows: Results) -> list[str]:
    """One line per task whose Spearman is undefined, with the reason, per aggregation."""
    return [f"n/a: {r['task']} ({r['aggregation']}): Spearman undefined, {r['undefined']}"
            for r in rows if r.get("undefined")]


def row_key(row: dict[str, Any]) -> tuple[str, str, str, str]:
    """A row's encoder, pooling, method (``whitening-k (k=128, shrinkage=0.5)``) and fit data."""
    options = ", ".join(f"{o}={row[o]}" for o in LINEAR_OPTIONS if row.get(o) is not None)
    method = f"{row['method']} ({options})" if options else row["method"]
    return row["encoder"], row["pooling"], method, row["fit_on"]


def _cell(row: dict[str, Any]) -> str:
    if row.get("missing"):
        return "missing"
    if row.get("undefined"):
        return "n/a"
    value = row["spearman"]
    return "" if value is None or math.isnan(value) else f"{value:.2f}"


def evaluate_method(tasks: dict[str, Task], missing: Sequence[str],
                    method: str | MethodSpec | Head, encoder: Encoder, cache: EmbeddingCache, *,
                    pooling: str | None = None, max_length: int | None = None,
                    fit_on: FitOn = "target", name: str | None = None,
                    batch_size: int = DEFAULT_BATCH_SIZE, progress: bool | None = None) -> Results:
    """`evaluate` a method (a `MethodSpec`, or the name of one without options) fit on
    `fit_on`, or a fitted head, labelled `name`, with its pooling and max length
    (`Head.settings`)."""
    make, pooling, max_length, labels = method_maker(
        method, encoder, pooling=pooling, max_length=max_length, name=name, progress=progress)
    sentences, also = None, []
    if not isinstance(method, Head):
        sentences, also, labels["fit_on"] = fit_sources(fit_on)
    embed = cache.embedder(encoder, pooling, max_length, batch_size, progress)
    return evaluate(tasks, missing, embed, make, sentences,
                    {"encoder": encoder.id.name, "pooling": pooling, **labels}, also)


def method_maker(method: str | MethodSpec | Head, encoder: Encoder, *,
                 pooling: str | None = None, max_length: int | None = None,
                 name: str | None = None, progress: bool | None = None
                 ) -> tuple[Callable[[], Method], str, int, dict[str, Any]]:
    """A maker of fresh `Method`s of a `MethodSpec` or of a fitted head (labelled `name`: it
    needs no fit), the pooling and max length to embed with (the head's), and the labels of its
    rows: its method and options; a head's also what it was fit on."""
    if isinstance(method, Head):
        pooling, max_length = method.settings(encoder, pooling, max_length)
        corpus = method.training_info.get("corpus") or {}
        labels = {"method": method.method, "head": name,
                  "fit_on": str(corpus.get("file") or corpus.get("name") or "head")}
        return functools.partial(Method, "flow", head=method), pooling, max_length, labels
    spec = MethodSpec.of(method)
    pooling, max_length = encoder.defaults(pooling, max_length)
    make = functools.partial(flow_by_recipe, pooling, spec.recipe, progress=progress is not False) \
        if spec.name == "flow" else functools.partial(
            make_method, spec.name, **spec.linear_options(encoder.width(pooling)))
    return make, pooling, max_length, {"method": spec.name, **make().describe()}
