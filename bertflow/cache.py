"""The embedding cache: a folder of embeddings files keyed by what made them, and where
embeddings come from (`training_embeddings`): a corpus through the cache, or an embeddings
file whose sidecar is reconciled with what the caller says of it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import distributed
from .corpus import Corpus
from .embeddings import (
    EmbeddingFile,
    check_destination,
    embeddings_meta,
    open_embeddings,
    read_meta,
    write_embeddings,
)
from .encoder import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_POOLING,
    Encoder,
    check_batch_size,
    check_max_length,
    check_pooling,
    load_encoder,
)
from .errors import BertflowError
from .files import atomic_file, meta_path, write_json

__all__ = ["EmbeddingCache", "default_cache", "encode_to", "training_embeddings"]


def default_cache() -> Path:
    """Where the cache is unless a folder is given: `$BERTFLOW_CACHE/embeddings`, else
    `$XDG_CACHE_HOME/bertflow/embeddings`, else `~/.cache/bertflow/embeddings`."""
    root = os.environ.get("BERTFLOW_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "bertflow"
    )
    return Path(root) / "embeddings"


class EmbeddingCache:
    """A folder of embeddings keyed by (encoder weights, precision, pooling, max_length,
    corpus).

    A cached file is used only when its sidecar matches the request field for field and the
    file its checksum; anything else is encoded again and replaces it. Entries are written by
    the streaming writer, so an interrupted encode continues where it stopped (or, where it
    cannot be continued, with other settings or altered rows, starts afresh), and two processes
    asking for the same entry encode it once.
    """

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_cache()

    def embedder(self, encoder: Encoder, pooling: str, max_length: int = 128,
                 batch_size: int = DEFAULT_BATCH_SIZE,
                 progress: bool | None = None) -> Callable[[Sequence[str]], np.ndarray]:
        """Sentences → their pooled embeddings (rows, dim), read from the cache or encoded
        into it."""

        def embed(sentences: Sequence[str]) -> np.ndarray:
            return np.asarray(self.encode(sentences, encoder, pooling, max_length, batch_size,
                                          progress))

        return embed

    def path(self, meta: dict[str, Any]) -> Path:
        key = {k: meta[k] for k in ("pooling", "max_length", "corpus_sha256", "count")}
        key["encoder"] = meta["encoder"]["fingerprint"]
        if meta.get("precision", "float32") != "float32":
            key["precision"] = meta["precision"]
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        return self.root / f"{meta['pooling']}-{digest}.npy"

    def meta(self, corpus: Corpus, encoder: Encoder, pooling: str,
             max_length: int = 128) -> dict[str, Any]:
        return embeddings_meta(encoder.id, pooling, max_length, corpus.sha256, len(corpus),
                               encoder.width(pooling), encoder.precision)

    def path_for(self, sentences: Sequence[str], encoder: Encoder, pooling: str,
                 max_length: int = 128) -> Path:
        """Where the embeddings of this request are (or would be) kept."""
        return self.path(self.meta(Corpus.from_sentences(sentences), encoder, pooling,
                                   max_length))

    def get(self, meta: dict[str, Any]) -> EmbeddingFile | None:
        """The cached file for `meta`, checked, or None."""
        path = self.path(meta)
        try:
            stored = read_meta(path)
            if stored is None or not path.exists() or not _same(stored, meta):
                return None
            return EmbeddingFile(path).verify()
        except BertflowError:
            return None

    def files(
        self,
        corpus: Corpus,
        encoder: Encoder,
        pooling: str | Sequence[str],
        max_length: int = 128,
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress: bool | None = None,
    ) -> dict[str, EmbeddingFile]:
        """The cached embeddings of `corpus` with each pooling, encoding (in one pass) only
        those that are missing."""
        poolings = [pooling] if isinstance(pooling, str) else list(pooling)
        metas = {p: self.meta(corpus, encoder, p, max_length) for p in poolings}
        found = {p: self.get(m) for p, m in metas.items()}
        missing = {p: self.path(metas[p]) for p, f in found.items() if f is None}
        if missing:
            write_embeddings(missing, corpus, encoder, max_length, batch_size, resume=True,
                             restart=True, wait=True, progress=progress)
            for p in missing:
                found[p] = EmbeddingFile(missing[p])
        return {p: found[p] for p in poolings}

    def encode(
        self,
        sentences: Sequence[str],
        encoder: Encoder,
        pooling: str | Sequence[str],
        max_length: int = 128,
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress: bool | None = None,
    ) -> np.ndarray | dict[str, np.ndarray]:
        """Like `Encoder.encode`, reading what is cached and encoding only what is missing;
        the arrays are memory-mapped."""
        files = self.files(Corpus.from_sentences(sentences), encoder, pooling, max_length,
                           batch_size, progress)
        arrays = {p: f.load() for p, f in files.items()}
        return arrays[pooling] if isinstance(pooling, str) else arrays

    def adopt(self, path: str | os.PathLike) -> Path | None:
        """Add a finished embeddings file to the cache as a hard link (no copy), so that a
        later request for the same embeddings reads it; None where links cannot be made."""
        meta = read_meta(path)
        if meta is None:
            raise BertflowError(f"{path} has no sidecar to file it under")
        target = self.path(meta)
        if self.get(meta) is not None:
            return target
        try:
            _place(Path(path), target, meta, copy=False)
        except OSError:
            return None
        return target

    def copy_to(self, meta: dict[str, Any], path: str | os.PathLike) -> bool:
        """Put the cached file for `meta`, if there is one, at `path` (linked, else copied)
        with its sidecar; whether there was one."""
        cached = self.get(meta)
        if cached is None:
            return False
        _place(cached.path, Path(path), cached.meta, copy=True)
        return True


def encode_to(
    path: str | os.PathLike,
    corpus: Corpus,
    encoder: Encoder,
    pooling: str,
    max_length: int = 128,
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    cache: EmbeddingCache | None = None,
    resume: bool = False,
    restart: bool = False,
    progress: bool | None = None,
) -> bool:
    """Write the embeddings of `corpus` to `path` (and its sidecar), taking them from `cache`
    when it has them and filing them there when it does not: whether they were encoded.
    Resumable (`resume`, `restart`) and runnable under torchrun like `write_embeddings`."""
    check_batch_size(batch_size)
    meta = embeddings_meta(encoder.id, check_pooling(pooling), check_max_length(max_length),
                           corpus.sha256, len(corpus), encoder.width(pooling), encoder.precision)
    path = check_destination(path)
    if cache is not None and cache.get(meta) is not None:
        if distributed.is_main():
            cache.copy_to(meta, path)
        distributed.barrier()
        return False
    write_embeddings({pooling: path}, corpus, encoder, max_length, batch_size, resume=resume,
                     restart=restart, progress=progress)
    if cache is not None and distributed.is_main():
        cache.adopt(path)
    distributed.barrier()
    return True


def training_embeddings(
    source: str | os.PathLike,
    *,
    encoder: str | os.PathLike | None = None,
    pooling: str | None = None,
    max_length: int = 128,
    batch_size: int = DEFAULT_BATCH_SIZE,
    cache: EmbeddingCache | None = None,
    device: str = "auto",
    dtype: str = "float32",
    progress: bool | None = None,
) -> tuple[EmbeddingFile, dict[str, Any]]:
    """The embeddings of `source` to fit a head to, read from disk as needed, and where they
    came from: its encoder (an `EncoderId`, or None when unknown), pooling, max length, the
    digest of the data (``data``), what a head records of its corpus (``corpus``) and, for a
    text file, the `Encoder` that embedded it (``loaded``), for reuse.

    A text file is encoded with `encoder` (default: the package's) on `device` in `dtype`, and
    `pooling` (default first_last), through `cache` (default: `default_cache()`). A `.npy`
    made by `bertflow encode` says in its sidecar how it was made, and a `pooling` or
    `encoder` given besides must agree with it (`open_embeddings`)."""
    check_max_length(max_length)
    source = Path(source)
    if source.suffix != ".npy":
        corpus = Corpus.from_file(source)
        loaded = load_encoder(encoder, device, dtype)
        pooling = pooling or DEFAULT_POOLING
        x = (cache or EmbeddingCache()).files(corpus, loaded, pooling, max_length, batch_size,
                                              progress=progress)[pooling]
        return x, {"encoder": loaded.id, "pooling": pooling, "max_length": max_length,
                   "data": corpus.sha256,
                   "corpus": {"sha256": corpus.sha256, "file": source.name}, "loaded": loaded}
    given = load_encoder(encoder, "cpu") if encoder else None
    return open_embeddings(source, pooling=pooling, encoder=given, max_length=max_length)


def _place(source: Path, target: Path, meta: dict[str, Any], copy: bool) -> None:
    """Put `source` at `target` as a hard link (else, with `copy`, as a copy) with sidecar
    `meta`, which is written before the data is renamed into place: a process killed at any
    point leaves the old pair, the new one, or a sidecar that the data beside it (if any) fails,
    which readers refuse and the cache encodes again."""
    with atomic_file(target) as temporary:
        temporary.unlink()
        try:
            os.link(source, temporary)
        except OSError:
            if not copy:
                raise
            shutil.copyfile(source, temporary)
        write_json(meta_path(target), meta)


def _same(stored: dict[str, Any], meta: dict[str, Any]) -> bool:
    keys = set(meta) - {"format_version", "encoder"}
    return all(stored.get(k) == meta[k] for k in keys) and (
        stored["encoder"]["fingerprint"] == meta["encoder"]["fingerprint"])
