"""Sentences to encode: a text file read lazily, or a list, with its size and digest."""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from .errors import BertflowError
from .files import iter_sentences

__all__ = ["Corpus", "corpus_sha256"]


def corpus_sha256(sentences: Iterable[str]) -> str:
    """sha256 of the sentences as a UTF-8 file with one sentence per `\\n`-ended line."""
    digest = hashlib.sha256()
    for sentence in sentences:
        digest.update(sentence.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


class Corpus:
    """Sentences whose `count` and `sha256` are known before they are encoded: a list, or a text
    file hashed in one streaming pass and read again chunk by chunk, never held whole."""

    def __init__(self, count: int, sha256: str, read: Callable[[int], Iterator[str]], name: str):
        if count < 1:
            raise BertflowError(f"{name} is empty: expected one sentence per line")
        self.count, self.sha256, self.name = count, sha256, name
        self._read = read

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Corpus:
        path, counter = Path(path), itertools.count()
        # zip draws from `counter` once per sentence read: after the pass it holds the count
        counted = zip(iter_sentences(path), counter, strict=False)
        digest = corpus_sha256(s for s, _ in counted)
        return cls(next(counter), digest, lambda start: iter_sentences(path, start), str(path))

    @classmethod
    def from_sentences(cls, sentences: Sequence[str], name: str = "sentences") -> Corpus:
        if isinstance(sentences, str):
            raise BertflowError("expected a list of sentences, not one string")
        return cls(len(sentences), corpus_sha256(sentences),
                   lambda start: iter(sentences[start:]), name)

    def __len__(self) -> int:
        return self.count

    def chunks(self, start: int, stop: int, size: int) -> Iterator[list[str]]:
        """Sentences `start` to `stop` in lists of `size` (the last may be shorter)."""
        sentences = self._read(start)
        for first in range(start, stop, size):
            chunk = list(itertools.islice(sentences, min(size, stop - first)))
            if len(chunk) < min(size, stop - first):
                raise BertflowError(f"{self.name} changed while it was being read")
            yield chunk
