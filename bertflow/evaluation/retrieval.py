"""The retrieval harness: fit a method on a BEIR task's text (never its qrels), search every
document by cosine, and score the ranking as MTEB and BEIR do, with pytrec_eval."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..constants import DEFAULT_BATCH_SIZE
from ..embeddings.cache import EmbeddingCache
from ..encoders.encoder import Encoder
from ..errors import BertflowError
from ..heads.head import FlowHead
from ..storage.corpus import Corpus
from ..training.recipes import Recipe
from .sts import method_maker, row_key

if TYPE_CHECKING:
    from ..data.beir import BeirTask

__all__ = ["FIT_SOURCES", "IDENTICAL_IDS_IGNORED", "MEASURES", "TOP", "evaluate_retrieval",
           "format_retrieval_table", "ignores_identical_ids", "ranking", "score_run", "top_hits",
           "without_identical_ids"]

# the measures of a row (MTEB's names) and the pytrec_eval measure each is the query mean of;
# MRR@10 is `recip_rank` on each query's top 10, as MTEB's own loop computes it
MEASURES = {"ndcg_at_10": "ndcg_cut_10", "map_at_100": "map_cut_100", "mrr_at_10": "recip_rank",
            "recall_at_100": "recall_100"}
FIT_SOURCES = ("corpus", "queries")  # the task's documents, its split's queries; else text files
TOP = 1000  # documents ranked per query, as MTEB
# the tasks MTEB scores with a document whose id is the query's left out of its ranking (its
# `ignore_identical_ids`, set per task since MTEB 2): BEIR's folder names and MTEB's task names
IDENTICAL_IDS_IGNORED = frozenset({"arguana", "quora", "quoraretrieval", "fiqa", "fiqa2018",
                                   "msmarco", "fever"})


def ignores_identical_ids(task_name: str) -> bool:
    """MTEB's default for the task named `task_name` (a BEIR folder's name): whether a
    document with the query's own id is left out of the query's ranking."""
    return task_name.lower() in IDENTICAL_IDS_IGNORED


def evaluate_retrieval(task: BeirTask, method: str | FlowHead, encoder: Encoder,
                       cache: EmbeddingCache, *, pooling: str | None = None,
                       max_length: int | None = None,
                       fit_on: str | os.PathLike | Sequence[str | os.PathLike] = "corpus",
                       k: int | None = None, d: int | None = None,
                       shrinkage: float | None = None,
                       recipe: Recipe | dict[str, Any] | None = None, name: str | None = None,
                       batch_size: int = DEFAULT_BATCH_SIZE, progress: bool | None = None,
                       top: int = TOP,
                       ignore_identical_ids: bool | None = None) -> list[dict[str, Any]]:
    """One row scoring `task`: a method of `METHODS` (`k`, `d`, `shrinkage`, the flow's
    `recipe`) fit on `fit_on` (``"corpus"``, ``"queries"``, text files, or several: their
    embeddings together), or a fitted head (labelled `name`, not fit again); documents and
    queries are embedded once through `cache` with the pooling and max length (the head's),
    transformed, and every document is ranked by cosine for each query (its `top`), less the
    document whose id is the query's where `ignore_identical_ids` (None: MTEB's default for
    the task, `ignores_identical_ids`). The row holds `MEASURES`, the labels of
    `bertflow.evaluation.sts`'s rows and ``ignore_identical_ids``."""
    make, pooling, max_length, labels = method_maker(
        method, encoder, pooling=pooling, max_length=max_length, k=k, d=d, shrinkage=shrinkage,
        recipe=recipe, name=name, progress=progress)

    def embed(corpus: Corpus) -> np.ndarray:
        return cache.files(corpus, encoder, pooling, max_length, batch_size,
                           progress)[pooling].load()

    documents = embed(task.corpus)
    queries = embed(Corpus.from_sentences(list(task.queries.values()), "the queries"))
    fitted = make()
    if not isinstance(method, FlowHead):
        parts = _fit_parts(fit_on)
        given = {"corpus": documents, "queries": queries}
        fitted.fit(np.concatenate([given[p] if isinstance(p, str) else embed(Corpus.from_file(p))
                                   for p in parts]))
        labels["fit_on"] = " + ".join(p if isinstance(p, str) else p.name for p in parts)
    run = ranking(fitted.transform(queries), fitted.transform(documents), list(task.queries),
                  task.corpus.ids, top)
    if ignore_identical_ids is None:
        ignore_identical_ids = ignores_identical_ids(task.name)
    if ignore_identical_ids:
        run = without_identical_ids(run)
    return [{"encoder": encoder.id.name, "pooling": pooling, "max_length": max_length, **labels,
             **fitted.settled(),  # what the rule chose (`Method.settle`)
             "task": task.name, "split": task.split, "queries": len(task.queries),
             "documents": len(task.corpus), "ignore_identical_ids": ignore_identical_ids,
             **score_run(task.qrels, run)}]


def _fit_parts(fit_on: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str | Path]:
    """`fit_on` as ``"corpus"``, ``"queries"`` (each at most once) and text files, in order."""
    given = [fit_on] if isinstance(fit_on, (str, os.PathLike)) else list(fit_on)
    parts = [str(p) if str(p) in FIT_SOURCES else Path(p) for p in given]
    named = [p for p in parts if isinstance(p, str)]
    if not parts or len(set(named)) < len(named):
        raise BertflowError("fit on 'corpus' and 'queries' at most once each, and on text files")
    return parts


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1)


def top_hits(queries: np.ndarray, documents: np.ndarray, top: int = TOP,
             block: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine search: for each query, the scores and the rows of its `top` documents
    (every one if fewer), by score descending, ties by row; (queries × top) arrays, computed
    `block` queries at a time, deterministic."""
    if queries.ndim != 2 or documents.ndim != 2 or queries.shape[1] != documents.shape[1]:
        raise BertflowError(f"queries {queries.shape} and documents {documents.shape} "
                            "differ in width")
    if top < 1 or not len(documents):
        raise BertflowError("nothing to search: no documents, or top < 1")
    d, top = _unit(documents), min(top, len(documents))
    scores = np.empty((len(queries), top), np.float32)
    rows = np.empty((len(queries), top), np.int64)
    for start in range(0, len(queries), block):
        s = _unit(queries[start:start + block]) @ d.T
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


def ranking(queries: np.ndarray, documents: np.ndarray, query_ids: Sequence[str],
            document_ids: Sequence[str], top: int = TOP) -> dict[str, dict[str, float]]:
    """The run pytrec_eval scores: each query id → its `top` documents' ids → cosine."""
    if len(query_ids) != len(queries) or len(document_ids) != len(documents):
        raise BertflowError(f"{len(queries)} queries for {len(query_ids)} ids, {len(documents)} "
                            f"documents for {len(document_ids)} ids")
    scores, rows = top_hits(queries, documents, top)
    return {q: {document_ids[j]: float(s) for j, s in zip(r.tolist(), v.tolist(), strict=True)}
            for q, r, v in zip(query_ids, rows, scores, strict=True)}


def without_identical_ids(run: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """`run` less each query's document of the query's own id: dropped from the ranked top,
    not replaced by the next document, as MTEB's `ignore_identical_ids` does."""
    return {query: {doc: score for doc, score in hits.items() if doc != query}
            for query, hits in run.items()}


def score_run(qrels: dict[str, dict[str, int]],
              run: dict[str, dict[str, float]]) -> dict[str, float]:
    """`MEASURES`, each the mean over the queries of `qrels` that `run` ranks (as MTEB divides);
    trec_eval's conventions: linear gain, ties broken by document id descending."""
    try:
        import pytrec_eval
    except ImportError:
        raise BertflowError("retrieval scores need pytrec_eval: "
                            "pip install 'bertflow[retrieval]'") from None
    per_query = pytrec_eval.RelevanceEvaluator(
        qrels, {"ndcg_cut.10", "map_cut.100", "recall.100"}).evaluate(run)
    first10 = {q: dict(sorted(docs.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:10])
               for q, docs in run.items()}
    reciprocal = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(first10)
    if not per_query:
        raise BertflowError("no query of the qrels is in the run: nothing to score")
    return {name: float(np.mean([(reciprocal if m == "recip_rank" else per_query)[q][m]
                                 for q in per_query])) for name, m in MEASURES.items()}


def format_retrieval_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of retrieval rows: the labels of `row_key`, the task, its split and
    `MEASURES` × 100."""
    lines = ["| encoder | pooling | method | fit on | task | split | nDCG@10 | MAP@100 | MRR@10 "
             "| recall@100 |", "|---|---|---|---|---|---|---:|---:|---:|---:|"]
    for row in rows:
        cells = [*row_key(row), row["task"], row["split"],
                 *(f"{100 * row[m]:.2f}" for m in MEASURES)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
