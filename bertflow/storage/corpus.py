"""Sentences to encode: a text file or a BEIR `corpus.jsonl` (`_id`, `title`, `text`) read
lazily, or a list, with its size, digest and (for documents) ids."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import BertflowError
from .files import iter_sentences
from .jsonl import field, is_jsonl, record_id, records, unicode_text

__all__ = ["Corpus", "corpus_sha256", "document", "read_corpus", "titled"]


def corpus_sha256(sentences: Iterable[str]) -> str:
    """sha256 of the sentences as a UTF-8 file with one sentence per `\\n`-ended line; a
    sentence holding a line break (a document) as `\\r` and its JSON string, which no line of
    a text file can be, so that no two lists share a digest."""
    digest = hashlib.sha256()
    for _ in _hashed(sentences, digest):
        pass
    return digest.hexdigest()


def _hashed(sentences: Iterable[str], digest: Any) -> Iterator[str]:
    """`sentences`, each added to `digest` (as `corpus_sha256` hashes them) as it is given."""
    for sentence in sentences:
        line = "\r" + json.dumps(sentence) if "\n" in sentence or "\r" in sentence else sentence
        digest.update(line.encode("utf-8"))
        digest.update(b"\n")
        yield sentence


class Corpus:
    """Sentences whose `count` and `sha256` are known before they are encoded: a list, or a file
    hashed in one streaming pass and read again chunk by chunk, never held whole (`read()`
    gives them all, from the first). `ids` names each item (a BEIR corpus's document ids) or is
    None (a text file: its items are lines)."""

    def __init__(self, count: int, sha256: str, read: Callable[[], Iterator[str]], name: str,
                 ids: list[str] | None = None):
        if count < 1:
            raise BertflowError(f"{name} is empty: expected one sentence per line")
        if ids is not None and len(ids) != count:
            raise BertflowError(f"{name}: {len(ids)} ids for {count} items")
        self.count, self.sha256, self.name, self.ids = count, sha256, name, ids
        self._read = read

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Corpus:
        """A text file of one sentence a line, or a BEIR corpus (a file named `*.jsonl`)."""
        if is_jsonl(Path(path)):
            return read_corpus(path)
        path, counter = Path(path), itertools.count()
        # zip draws from `counter` once per sentence read: after the pass it holds the count
        counted = zip(iter_sentences(path), counter, strict=False)
        digest = corpus_sha256(s for s, _ in counted)
        return cls(next(counter), digest, lambda: iter_sentences(path), str(path))

    @classmethod
    def from_sentences(cls, sentences: Sequence[str], name: str = "sentences") -> Corpus:
        if isinstance(sentences, str):
            raise BertflowError("expected a list of sentences, not one string")
        return cls(len(sentences), corpus_sha256(sentences),
                   lambda: iter(sentences), name)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks(0, self.count, 4096):
            yield from chunk

    def chunks(self, start: int, stop: int, size: int) -> Iterator[list[str]]:
        """Sentences `start` to `stop` in lists of `size` (the last may be shorter). Every
        sentence is read and hashed again, and the last list is given only once the digest is
        `sha256`'s: the sentences given are those the digest names."""
        digest = hashlib.sha256()
        sentences = _hashed(self._read(), digest)
        for _ in itertools.islice(sentences, start):
            pass
        for first in range(start, stop, size):
            chunk = list(itertools.islice(sentences, min(size, stop - first)))
            whole = len(chunk) == min(size, stop - first)
            if whole and first + size >= stop:  # the last: the rest read, then all of it checked
                rest = sum(1 for _ in sentences)
                whole = (stop + rest, digest.hexdigest()) == (self.count, self.sha256)
            if not whole:
                raise BertflowError(f"{self.name} changed while it was being read; "
                                    "encode it again")
            yield chunk


def document(title: str, text: str) -> str:
    """The text embedded for a document, as MTEB builds it: `title text`, or the text alone."""
    return f"{title} {text}".strip() if title else text.strip()


def read_corpus(path: str | os.PathLike) -> Corpus:
    """A BEIR `corpus.jsonl` as a `Corpus` of documents (`document`) with their ids, checked and
    hashed in one streaming pass and read again chunk by chunk when encoded."""
    path, ids = Path(path), {}

    def counted() -> Iterator[str]:
        for number, record in records(path):
            ids[record_id(path, number, record, ids)] = number
            yield _document(path, number, record)

    digest = corpus_sha256(counted())
    if not ids:
        raise BertflowError(f"{path} is empty: expected one JSON document per line")
    return Corpus(len(ids), digest, lambda: (_document(path, number, record)
                                             for number, record in records(path)),
                  str(path), ids=list(ids))


def titled(path: str | os.PathLike) -> Iterator[tuple[str, str]]:
    """(title, text) of each item of `Corpus.from_file(path)`'s file, read streamed: a BEIR
    corpus's fields (its text stripped), a text file's line with no title."""
    path = Path(path)
    if not is_jsonl(path):
        yield from (("", line.strip()) for line in iter_sentences(path))
        return
    for number, record in records(path):
        _document(path, number, record)  # checked as the corpus is
        yield (record.get("title") or "").strip(), record["text"].strip()


def _document(path: Path, number: int, record: dict[str, Any]) -> str:
    title = record.get("title")
    if title is not None and not isinstance(title, str):
        raise BertflowError(f"{path} line {number}: \"title\" is not a string")
    return document(unicode_text(path, number, "title", title or ""),
                    field(path, number, record, "text"))
