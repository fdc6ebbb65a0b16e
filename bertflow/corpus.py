"""Sentences to encode: a text file or a BEIR `corpus.jsonl` read lazily, or a list, with its
size, digest and (for documents) ids."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from .errors import BertflowError
from .files import iter_sentences

__all__ = ["Corpus", "corpus_sha256"]


def corpus_sha256(sentences: Iterable[str]) -> str:
    """sha256 of the sentences as a UTF-8 file with one sentence per `\\n`-ended line; a
    sentence holding a line break (a document) as `\\r` and its JSON string, which no line of
    a text file can be, so that no two lists share a digest."""
    digest = hashlib.sha256()
    for sentence in sentences:
        if "\n" in sentence or "\r" in sentence:
            sentence = "\r" + json.dumps(sentence)
        digest.update(sentence.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


class Corpus:
    """Sentences whose `count` and `sha256` are known before they are encoded: a list, or a file
    hashed in one streaming pass and read again chunk by chunk, never held whole. `ids` names
    each item (a BEIR corpus's document ids) or is None (a text file: its items are lines)."""

    def __init__(self, count: int, sha256: str, read: Callable[[int], Iterator[str]], name: str,
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
        if Path(path).suffix == ".jsonl":
            from .beir import read_corpus

            return read_corpus(path)
        path, counter = Path(path), itertools.count()
        # zip draws from `counter` once per sentence read: after the pass it holds the count
        counted = zip(iter_sentences(path), counter, strict=False)
        digest = corpus_sha256(s for s, _ in counted)
        return cls(next(counter), digest, lambda start: iter_sentences(path, start), str(path))

    @classmethod
    def from_sentences(cls, sentences: Sequence[str], name: str = "sentences",
                       ids: Sequence[str] | None = None) -> Corpus:
        if isinstance(sentences, str):
            raise BertflowError("expected a list of sentences, not one string")
        return cls(len(sentences), corpus_sha256(sentences),
                   lambda start: iter(sentences[start:]), name,
                   None if ids is None else list(ids))

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks(0, self.count, 4096):
            yield from chunk

    def chunks(self, start: int, stop: int, size: int) -> Iterator[list[str]]:
        """Sentences `start` to `stop` in lists of `size` (the last may be shorter)."""
        sentences = self._read(start)
        for first in range(start, stop, size):
            chunk = list(itertools.islice(sentences, min(size, stop - first)))
            if len(chunk) < min(size, stop - first):
                raise BertflowError(f"{self.name} changed while it was being read")
            yield chunk
