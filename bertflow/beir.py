"""A retrieval task in BEIR's layout: `corpus.jsonl` (`_id`, `title`, `text`), `queries.jsonl`
(`_id`, `text`) and `qrels/SPLIT.tsv` (`query-id`, `corpus-id`, `score`), each read streamed,
a bad line refused in one line naming its file and line number."""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .corpus import Corpus, corpus_sha256
from .errors import BertflowError, first_line
from .files import iter_sentences

__all__ = ["QRELS_HEADER", "BeirTask", "document", "load_task", "read_corpus", "read_qrels",
           "read_queries"]

QRELS_HEADER = ("query-id", "corpus-id", "score")


@dataclass(frozen=True)
class BeirTask:
    """One split of a BEIR folder: the corpus (with its ids), the queries its qrels name (in the
    queries file's order) and the qrels, query id → document id → relevance."""

    name: str
    split: str
    corpus: Corpus
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def document(title: str, text: str) -> str:
    """The text embedded for a document, as MTEB builds it: `title text`, or the text alone."""
    return f"{title} {text}".strip() if title else text.strip()


def read_corpus(path: str | os.PathLike) -> Corpus:
    """A BEIR `corpus.jsonl` as a `Corpus` of documents (`document`) with their ids, checked and
    hashed in one streaming pass and read again chunk by chunk when encoded."""
    path, ids = Path(path), {}

    def counted() -> Iterator[str]:
        for number, record in _records(path):
            ids[_id(path, number, record, ids)] = number
            yield _document(path, number, record)

    digest = corpus_sha256(counted())
    if not ids:
        raise BertflowError(f"{path} is empty: expected one JSON document per line")
    return Corpus(len(ids), digest, lambda start: _documents(path, start), str(path),
                  ids=list(ids))


def read_queries(path: str | os.PathLike) -> dict[str, str]:
    """Query id → text, in file order: a BEIR `queries.jsonl` (`_id`, `text`; a file named
    `*.jsonl`), else a text file of one query a line, whose ids are its line numbers."""
    path, queries, lines = Path(path), {}, {}
    if path.suffix != ".jsonl":
        queries = {str(n): q for n, q in enumerate(_lines(path, "one query"), 1)}
    else:
        for number, record in _records(path):
            key = _id(path, number, record, lines)
            lines[key], queries[key] = number, _field(path, number, record, "text")
            if not queries[key].strip():
                raise BertflowError(f"{path} line {number}: the query text is empty")
    if not queries:
        raise BertflowError(f"{path} is empty: expected one query per line")
    return queries


def read_qrels(path: str | os.PathLike, documents: Collection[str] | None = None,
               queries: Collection[str] | None = None) -> dict[str, dict[str, int]]:
    """Query id → document id → relevance from a BEIR `qrels/SPLIT.tsv` (after its header); a
    row naming a document not in `documents` or a query not in `queries` (where given), a
    repeated row and a file without rows are refused."""
    path, qrels = Path(path), {}
    lines = enumerate(_lines(path, "one judgement"), 1)
    header = next(lines, (1, ""))[1]
    if tuple(header.strip().split("\t")) != QRELS_HEADER:
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
        if not -2**31 <= relevance < 2**31:  # pytrec_eval keeps a C int
            raise BertflowError(f"{path} line {number}: the score {score} is out of range")
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
    return qrels


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


def _lines(path: Path, what: str, start: int = 0) -> Iterator[str]:
    """The lines of text file `path` from line `start` on; a blank one is refused."""
    for number, line in enumerate(iter_sentences(path, start, blank_ok=True), start + 1):
        if not line.strip():
            raise BertflowError(f"{path} line {number} is blank: expected {what} per line")
        yield line


def _records(path: Path, start: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) of each line of a JSON-lines file from line `start` on."""
    for number, line in enumerate(_lines(path, "one JSON object", start), start + 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise BertflowError(f"{path} line {number} is not JSON ({first_line(e)})") from None
        if not isinstance(record, dict):
            raise BertflowError(f"{path} line {number} is not a JSON object")
        yield number, record


def _documents(path: Path, start: int) -> Iterator[str]:
    for number, record in _records(path, start):
        yield _document(path, number, record)


def _document(path: Path, number: int, record: dict[str, Any]) -> str:
    title = record.get("title")
    if title is not None and not isinstance(title, str):
        raise BertflowError(f"{path} line {number}: \"title\" is not a string")
    return document(_unicode(path, number, "title", title or ""),
                    _field(path, number, record, "text"))


def _field(path: Path, number: int, record: dict[str, Any], key: str) -> str:
    if key not in record:
        raise BertflowError(f"{path} line {number} has no {key!r}")
    value = record[key]
    if isinstance(value, int) and not isinstance(value, bool) and key == "_id":
        return str(value)
    if not isinstance(value, str):
        raise BertflowError(f"{path} line {number}: {key!r} is not a string")
    return _unicode(path, number, key, value)


def _unicode(path: Path, number: int, key: str, value: str) -> str:
    """`value`, refused where JSON's escapes made it no Unicode text (a lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BertflowError(f"{path} line {number}: {key!r} is not valid Unicode (a lone "
                            "surrogate)") from None
    return value


def _id(path: Path, number: int, record: dict[str, Any], seen: dict[str, int]) -> str:
    """The `_id` of `record`, refused where empty or on an earlier line (`seen`: id → line)."""
    key = _field(path, number, record, "_id")
    if not key.strip():
        raise BertflowError(f"{path} line {number}: '_id' is empty")
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in key):
        raise BertflowError(f"{path} line {number}: '_id' {key!r} holds a control character")
    if key in seen:
        raise BertflowError(f"{path} line {number}: duplicate id {key!r} (also on line "
                            f"{seen[key]})")
    return key

