"""The retrieval harness: fit a method on a BEIR task's text (never its qrels), search every
document by cosine, and score the ranking as MTEB and BEIR do, with pytrec_eval."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..constants import DEFAULT_BATCH_SIZE
from ..cosine import TOP, top_hits, unit_rows
from ..data.beir import BeirTask, is_qrels
from ..embeddings.cache import EmbeddingCache
from ..encoders.encoder import Encoder
from ..errors import BertflowError
from ..heads.head import Head
from ..storage.artifacts import mteb_file
from ..storage.corpus import Corpus
from ..storage.files import read_json, write_json
from ..training.choice import check_query_log
from ..training.feedback import Feedback
from ..training.spec import MethodSpec
from .sts import FitOn, fit_parts, method_maker, row_key

__all__ = ["FIT_SOURCES", "IDENTICAL_IDS_IGNORED", "MEASURES", "MTEB_K", "MTEB_NAMES",
           "TOP", "check_mteb_destination", "evaluate_retrieval",
           "format_retrieval_table",
           "ignores_identical_ids", "mteb_name", "mteb_result", "mteb_scores", "ranking",
           "score_run", "without_identical_ids", "write_mteb"]

# the measures of a row (MTEB's names) and the pytrec_eval measure each is the query mean of;
# MRR@10 is `recip_rank` on each query's top 10, as MTEB's own loop computes it
MEASURES = {"ndcg_at_10": "ndcg_cut_10", "map_at_100": "map_cut_100", "mrr_at_10": "recip_rank",
            "recall_at_100": "recall_100"}
MTEB_K = (1, 3, 5, 10, 20, 100, 1000)  # the cuts of MTEB's result files
# MTEB's names of BEIR's tasks, by folder name (a result file is named for its task)
MTEB_NAMES = {"arguana": "ArguAna", "climate-fever": "ClimateFEVER", "dbpedia-entity": "DBPedia",
              "fever": "FEVER", "fiqa": "FiQA2018", "hotpotqa": "HotpotQA", "msmarco": "MSMARCO",
              "nfcorpus": "NFCorpus", "nq": "NQ", "quora": "QuoraRetrieval", "scidocs": "SCIDOCS",
              "scifact": "SciFact", "trec-covid": "TRECCOVID", "webis-touche2020": "Touche2020"}
FIT_SOURCES = ("corpus", "queries")  # the task's documents, its split's queries; else text files
# the tasks MTEB scores with a document whose id is the query's left out of its ranking (its
# `ignore_identical_ids`, set per task since MTEB 2): BEIR's folder names and MTEB's task names
IDENTICAL_IDS_IGNORED = frozenset({"arguana", "quora", "quoraretrieval", "fiqa", "fiqa2018",
                                   "msmarco", "fever"})


def ignores_identical_ids(task_name: str) -> bool:
    """MTEB's default for the task named `task_name` (a BEIR folder's name): whether a
    document with the query's own id is left out of the query's ranking."""
    return task_name.lower() in IDENTICAL_IDS_IGNORED


def evaluate_retrieval(task: BeirTask, method: str | MethodSpec | Head, encoder: Encoder,
                       cache: EmbeddingCache, *, pooling: str | None = None,
                       max_length: int | None = None,
                       fit_on: FitOn = "corpus",
                       name: str | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                       progress: bool | None = None, top: int = TOP,
                       ignore_identical_ids: bool | None = None,
                       every_k: bool = False,
                       feedback: Feedback | None = None) -> list[dict[str, Any]]:
    """One row scoring `task`: a method (a `MethodSpec`, or the name of one) fit on `fit_on`
    (``"corpus"``, ``"queries"``, text files, or several: their embeddings together), or a
    fitted head (labelled `name`, not fit again); documents and queries are embedded once
    through `cache` with the pooling and max length (the head's), transformed, and every
    document is ranked by cosine for each query (its `top`), less the document whose id is the
    query's where `ignore_identical_ids` (None: MTEB's default for the task,
    `ignores_identical_ids`); with `feedback`, each query moved towards its first search's top
    documents first (`Feedback`; that document left out of them too). The row holds
    `MEASURES`, the labels of `bertflow.evaluation.sts`'s rows, ``ignore_identical_ids`` and
    ``feedback`` where given; with `every_k`, also ``mteb``: MTEB's measures at `MTEB_K`
    (`mteb_scores`)."""
    if feedback is not None:
        feedback.check_count(len(task.corpus))
    make, pooling, max_length, labels = method_maker(
        method, encoder, pooling=pooling, max_length=max_length, name=name, progress=progress)
    if isinstance(method, Head):
        check_query_log(method, task.queries, f"{task.name}'s {task.split} queries")
        if (method.training_info.get("corpus") or {}).get("sha256") == task.corpus.sha256:
            labels["fit_on"] = "corpus"  # the task's documents, as a method fit on them says
    parts = [] if isinstance(method, Head) else fit_parts(fit_on, FIT_SOURCES)
    for part in parts:
        if isinstance(part, Path) and is_qrels(part):
            raise BertflowError(f"{part} holds qrels (relevance judgements): a method is fit on "
                                "text, never on the qrels")

    def embed(corpus: Corpus) -> np.ndarray:
        return cache.files(corpus, encoder, pooling, max_length, batch_size,
                           progress)[pooling].load()

    documents = embed(task.corpus)
    queries = embed(Corpus.from_sentences(list(task.queries.values()), "the queries"))
    fitted = make()
    if not isinstance(method, Head):
        given = {"corpus": documents, "queries": queries}
        fitted.fit(np.concatenate([given[p] if isinstance(p, str) else embed(Corpus.from_file(p))
                                   for p in parts]))
        labels["fit_on"] = " + ".join(p if isinstance(p, str) else p.name for p in parts)
    if ignore_identical_ids is None:
        ignore_identical_ids = ignores_identical_ids(task.name)
    queries, documents = fitted.transform(queries), fitted.transform(documents)
    if feedback is not None:  # searched exactly, block by block, as `ranking` searches
        unit, row = unit_rows(documents, np.float32), {d: i for i, d in enumerate(task.corpus.ids)}
        own = np.array([row.get(q, -1) for q in task.queries]) if ignore_identical_ids else None
        queries = feedback.refine(unit_rows(queries, np.float32),
                                  lambda q, k: top_hits(q, unit, k), unit.__getitem__, own=own)
    run = ranking(queries, documents, list(task.queries), task.corpus.ids, top)
    if ignore_identical_ids:
        run = without_identical_ids(run)
    return [{"encoder": encoder.id.name, "pooling": pooling, "max_length": max_length, **labels,
             **fitted.settled(),  # what the rule chose (`Method.settle`)
             "task": task.name, "split": task.split, "queries": len(task.queries),
             "documents": len(task.corpus), "ignore_identical_ids": ignore_identical_ids,
             **({"feedback": feedback.to_dict()} if feedback is not None else {}),
             **score_run(task.qrels, run),
             **({"mteb": mteb_scores(task.qrels, run)} if every_k else {})}]


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
    """`MEASURES` of `run` (`mteb_scores` at 10 and 100)."""
    scores = mteb_scores(qrels, run, (10, 100))
    return {name: scores[name] for name in MEASURES}


def mteb_scores(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]],
                k_values: Sequence[int] = MTEB_K) -> dict[str, float]:
    """MTEB's measures at each k: ndcg, map, recall and precision (pytrec_eval's cuts), mrr
    and hit rate (the first relevant document among the top k), each the mean over the
    queries of `qrels` that `run` ranks (as MTEB divides); trec_eval's conventions: linear
    gain, ties broken by document id descending."""
    try:
        import pytrec_eval
    except ImportError:
        raise BertflowError("retrieval scores need pytrec_eval: "
                            "pip install 'bertflow[retrieval]'") from None
    cuts = ",".join(str(k) for k in k_values)
    per_query = pytrec_eval.RelevanceEvaluator(
        qrels, {f"ndcg_cut.{cuts}", f"map_cut.{cuts}", f"recall.{cuts}", f"P.{cuts}"}
    ).evaluate(run)
    if not per_query:
        raise BertflowError("no query of the qrels is in the run: nothing to score")
    ranks = {q: next((rank for rank, (doc, _) in enumerate(sorted(
        run[q].items(), key=lambda kv: (kv[1], kv[0]), reverse=True), 1)
        if qrels[q].get(doc, 0) > 0), None) for q in per_query}
    scores: dict[str, float] = {}
    for k in k_values:
        for name, measure in (("ndcg", "ndcg_cut"), ("map", "map_cut"), ("recall", "recall"),
                              ("precision", "P")):
            scores[f"{name}_at_{k}"] = float(np.mean([per_query[q][f"{measure}_{k}"]
                                                      for q in per_query]))
        scores[f"mrr_at_{k}"] = float(np.mean([1 / r if r and r <= k else 0.0
                                               for r in ranks.values()]))
        scores[f"hit_rate_at_{k}"] = float(np.mean([bool(r and r <= k)
                                                    for r in ranks.values()]))
    return {name: scores[name] for name in sorted(scores, key=_by_measure)}


def _by_measure(name: str) -> tuple[str, int]:
    measure, k = name.rsplit("_at_", 1)
    return measure, int(k)


def mteb_result(row: dict[str, Any], seconds: float | None = None) -> dict[str, Any]:
    """MTEB's result file of the task of `row` (made `every_k`): its measures under
    ``scores.<split>[0]``, nDCG@10 as ``main_score``, named by MTEB's name of the task."""
    if "mteb" not in row:
        raise BertflowError("the row holds no MTEB measures: evaluate it with every_k=True")
    return {"dataset_revision": None, "task_name": mteb_name(row["task"]),
            "mteb_version": None, "evaluation_time": seconds, "kg_co2_emissions": None,
            "scores": {row["split"]: [{**row["mteb"], "main_score": row["mteb"]["ndcg_at_10"],
                                       "hf_subset": "default", "languages": ["eng-Latn"]}]}}


def mteb_name(task: str) -> str:
    """MTEB's name of the BEIR task in folder `task` (its own name where MTEB has none)."""
    return MTEB_NAMES.get(task.lower(), task)


def check_mteb_destination(folder: str | os.PathLike, task: str) -> Path:
    """Where `write_mteb` writes the result of `task` in `folder`: a new file, or MTEB's
    result file of that task (its other splits are kept); anything else is refused."""
    if Path(folder).exists() and not Path(folder).is_dir():
        raise BertflowError(f"--mteb {folder} is not a folder")
    return mteb_file(mteb_name(task)).check_destination(Path(folder) / f"{mteb_name(task)}.json")


def write_mteb(folder: str | os.PathLike, row: dict[str, Any],
               seconds: float | None = None) -> Path:
    """Write (atomically) MTEB's result file of `row`'s task into `folder`, merging into one
    there its other splits; the path written."""
    path = check_mteb_destination(folder, row["task"])
    result = mteb_result(row, seconds)
    if path.exists():
        result["scores"] = {**read_json(path)["scores"], **result["scores"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, result, recheck=lambda p, _: check_mteb_destination(p.parent, row["task"]))
    return path


def format_retrieval_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of retrieval rows: the labels of `row_key`, the task, its split and
    `MEASURES` × 100; a method with feedback says so (``raw + feedback (k=3, beta=0.5)``)."""
    lines = ["| encoder | pooling | method | fit on | task | split | nDCG@10 | MAP@100 | MRR@10 "
             "| recall@100 |", "|---|---|---|---|---|---|---:|---:|---:|---:|"]
    for row in rows:
        encoder, pooling, method, fit_on = row_key(row)
        if row.get("feedback"):
            method += " + feedback ({})".format(", ".join(
                f"{name}={value}" for name, value in row["feedback"].items() if value is not False))
        cells = [encoder, pooling, method, fit_on, row["task"], row["split"],
                 *(f"{100 * row[m]:.2f}" for m in MEASURES)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
