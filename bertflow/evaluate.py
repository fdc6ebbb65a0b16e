"""The STS harness: fit a method on unlabeled sentences, score the seven tasks, measure
isotropy, and return one row per (task, aggregation)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .isotropy import isotropy_measures
from .methods import Method
from .sts import TASKS, Task, score

__all__ = ["AGGREGATIONS", "evaluate", "format_table", "summarise", "undefined_notes"]

AGGREGATIONS = ("all", "wmean")
Embed = Callable[[Sequence[str]], np.ndarray]


def evaluate(
    tasks: dict[str, Task],
    missing: Sequence[str],
    embed: Embed,
    make: Callable[[], Method],
    fit_on: str | Sequence[str] | None,
    labels: dict[str, Any],
) -> list[dict[str, Any]]:
    """Rows for every task and the 7-task average, for both aggregations.

    `embed` maps sentences to pooled embeddings (usually through the cache); `make` returns a
    fresh, unfitted method. `fit_on` is ``"target"`` (each task's own sentences, without
    scores), a list of sentences to fit once, or None for a method that is already fit.
    `labels` (encoder, pooling, method, fit_on) are copied into every row. No gold score is
    ever used to fit. A task whose Spearman is undefined (constant gold scores or constant
    predicted similarities) gets ``spearman`` None and the reason under ``undefined``, and is
    left out of the average; no row holds a NaN.
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
        method = shared if shared is not None else make().fit(embed(task.unlabeled))
        sentences = task.sentences()
        vectors = method.transform(embed(sentences))
        scores = score(task.test, sentences, vectors)
        measures = isotropy_measures(vectors)
        for a in AGGREGATIONS:
            row = {**labels, "task": name, "aggregation": a, "spearman": scores[a], **measures}
            if scores[a] is None:
                row["undefined"] = scores["undefined"][a]
            rows.append(row)
    return rows + summarise(rows, labels)


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
        for key in ("mean_cosine", "effective_rank", "condition_number", "isotropy"):
            values = [r[key] for r in scored if r.get(key) is not None]
            row[key] = float(np.mean(values)) if values and len(values) == len(scored) else None
        out.append(row)
    return out


def format_table(rows: list[dict[str, Any]], aggregation: str = "all") -> str:
    """A markdown table: one line per (pooling, method, fit data), one column per task; a task
    whose Spearman is undefined shows ``n/a`` (`undefined_notes` says why)."""
    keys = list(dict.fromkeys((r["encoder"], r["pooling"], r["method"], r["fit_on"])
                              for r in rows))
    lines = ["| encoder | pooling | method | fit on | " + " | ".join([*TASKS, "avg"]) + " |",
             "|---|---|---|---|" + "---:|" * (len(TASKS) + 1)]
    for key in keys:
        cells = {r["task"]: r for r in rows if r["aggregation"] == aggregation
                 and (r["encoder"], r["pooling"], r["method"], r["fit_on"]) == key}
        values = [_cell(cells.get(task)) for task in [*TASKS, "avg"]]
        lines.append("| " + " | ".join(key) + " | " + " | ".join(values) + " |")
    return "\n".join(lines)


def undefined_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One line per task whose Spearman is undefined, with the reason, per aggregation."""
    return [f"n/a: {r['task']} ({r['aggregation']}): Spearman undefined, {r['undefined']}"
            for r in rows if r.get("undefined")]


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    if row.get("missing"):
        return "missing"
    if row.get("undefined"):
        return "n/a"
    value = row["spearman"]
    return "" if value is None or math.isnan(value) else f"{value:.2f}"
