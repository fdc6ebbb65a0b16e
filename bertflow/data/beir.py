"""A retrieval task in BEIR's layout: `corpus.jsonl` (`_id`, `title`, `text`), `queries.jsonl`
(`_id`, `text`) and `qrels/SPLIT.tsv` (`query-id`, `corpus-id`, `score`), each read streamed,
a bad line refused in one line naming its file and line number."""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from ..errors import BertflowError
from ..storage.corpus import Corpus, read_corpus
from ..storage.files import iter_sentences
from ..storage.jsonl import field, is_jsonl, record_id, records

__all__ = ["MAX_RELEVANCE", "QRELS_HEADER", "BeirTask", "is_qrels", "load_task", "read_qrels",
           "read_queries"]

QRELS_HEADER = ("query-id", "corpus-id", "score")
# the largest relevance a qrels row may give, either sign: trec_eval's nDCG keeps a gain slot per
# level from 0 to the largest (2^31 levels: 17 GB, or every measure 0 where memory runs out);
# graded relevance is 0-2 in BEIR and 0-4 in TREC
MAX_RELEVANCE = 1000


@dataclass(frozen=True)
class BeirTask:
    """One split of a BEIR folder: the corpus (with its ids), the queries its qrels name (in the
    queries file's order) and the qrels, query id → document id → relevance."""

    name: str
    split: str
    corpus: Corpus
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def read_queries(path: str | os.PathLike) -> dict[str, str]:
    """Query id → text, in file order: a BEIR `queries.jsonl` (`_id`, `text`; a file named
    `*.jsonl`), else a text file of one query a line, whose ids are its line numbers."""
    path, queries, lines = Path(path), {}, {}
    if not is_jsonl(path):
        queries = {str(n): q for n, q in enumerate(iter_sentences(path, what="one query"), 1)}
    else:
        for number, record in records(path):
            key = record_id(path, number, record, lines)
            lines[key], queries[key] = number, field(path, number, record, "text")
    if not queries:
        raise BertflowError(f"{path} is empty: expected one query per line")
    return queries


def read_qrels(path: str | os.PathLike, documents: Collection[str] | None = None,
               queries: Collection[str] | None = None) -> dict[str, dict[str, int]]:
    """Query id → document id → relevance from a BEIR `qrels/SPLIT.tsv` (after its header); a
    row naming a document not in `documents` or a query not in `queries` (where given), a
    repeated row, a relevance beyond ±`MAX_RELEVANCE`, and a file without rows or without a
    relevant one (a relevance above 0) are refused."""
    path, qrels = Path(path), {}
    lines = enumerate(iter_sentences(path, what="one judgement"), 1)
    header = next(lines, (1, ""))[1]
    if not _is_header(header):
        raise BertflowError(f"{path} line 1: expected the header {' / '.join(QRELS_HEADER)} "
                            f"(tab-separated), got {header[:60]!r}")
    for number, line in lines:
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) != 3 or not all(fields):
            raise BertflowError(f"{path} line {number}: expected query-id, corpus-id and score "
                                f"separated by tabs, got {line[:60]!r}")
        query, doc, score = fields
        try:
            relevance = int(score)
        except ValueError:
            raise BertflowError(f"{path} line {number}: the score {score!r} is not an "
                                "integer") from None
        if abs(relevance) > MAX_RELEVANCE:
            raise BertflowError(f"{path} line {number}: the score {score} is outside "
                                f"-{MAX_RELEVANCE}..{MAX_RELEVANCE}")
        for given, known, what in ((query, queries, "query"), (doc, documents, "document")):
            if known is not None and given not in known:
                raise BertflowError(f"{path} line {number}: no {what} with id {given!r} "
                                    f"in the task")
        if doc in qrels.setdefault(query, {}):
            raise BertflowError(f"{path} line {number}: query {query!r} and document {doc!r} "
                                "are judged twice")
        qrels[query][doc] = relevance
    if not qrels:
        raise BertflowError(f"{path} has no judgements after its header: the split is empty")
    if not any(r > 0 for judged in qrels.values() for r in judged.values()):
        raise BertflowError(f"{path} judges no document relevant (no score above 0): the "
                            "split cannot be scored")
    return qrels


def is_qrels(path: str | os.PathLike) -> bool:
    """Whether the text file at `path` opens with `QRELS_HEADER`: BEIR's judgements."""
    return _is_header(next(iter_sentences(path, blank_ok=True), ""))


def _is_header(line: str) -> bool:
    return tuple(line.strip().split("\t")) == QRELS_HEADER


def load_task(folder: str | os.PathLike, split: str = "test") -> BeirTask:
    """Split `split` of the BEIR folder `folder`: its corpus, the queries its qrels judge and
    its qrels, every id they name checked against the corpus and the queries file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BertflowError(f"no BEIR folder at {folder}")
    qrels_path = folder / "qrels" / f"{split}.tsv"
    if not qrels_path.is_file():
        splits = sorted(p.stem for p in (folder / "qrels").glob("*.tsv"))
        raise BertflowError(f"{folder} has no split {split!r} (no qrels/{split}.tsv); it has "
                            f"{', '.join(splits) or 'none'}")
    for name in ("corpus.jsonl", "queries.jsonl"):
        if not (folder / name).is_file():
            raise BertflowError(f"{folder} has no {name}: not a BEIR folder")
    corpus = read_corpus(folder / "corpus.jsonl")
    queries = read_queries(folder / "queries.jsonl")
    qrels = read_qrels(qrels_path, set(corpus.ids or ()), queries)
    return BeirTask(folder.name, split, corpus, {q: t for q, t in queries.items() if q in qrels},
                    qrels)


