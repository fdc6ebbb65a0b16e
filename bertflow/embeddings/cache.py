"""The embedding cache: a folder of embeddings files keyed by what made them."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import numpy as np

from ..constants import DEFAULT_BATCH_SIZE
from ..encoders.batches import check_batch_size
from ..encoders.encoder import Encoder
from ..encoders.pooling import check_pooling
from ..errors import BertflowError
from ..runtime import distributed
from ..storage.corpus import Corpus
from .file import EmbeddingFile, embeddings_meta, finished
from .outputs import check_destination, lock, place
from .writer import write_embeddings

__all__ = ["EmbeddingCache", "encode_to"]


class EmbeddingCache:
    """A folder of embeddings keyed by (encoder fingerprint, precision, pooling, max_length,
    corpus). An entry is used only when its sidecar matches the request and the file its
    checksum; anything else is encoded again by the streaming writer, which continues an
    interrupted entry where it can and lets two processes asking for one entry encode it once.
    The folder is `root`, else `$BERTFLOW_CACHE/embeddings`, else
    `$XDG_CACHE_HOME/bertflow/embeddings`, else `~/.cache/bertflow/embeddings`."""

    def __init__(self, root: str | os.PathLike | None = None):
        if root is None:
            root = Path(os.environ.get("BERTFLOW_CACHE") or Path(
                os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "bertflow"))
            root /= "embeddings"
        self.root = Path(root)

    def embedder(self, encoder: Encoder, pooling: str, max_length: int = 128,
                 batch_size: int = DEFAULT_BATCH_SIZE,
                 progress: bool | None = None) -> Callable[[Sequence[str]], np.ndarray]:
        """Sentences → their pooled embeddings, read from the cache or encoded into it."""
        return lambda sentences: np.asarray(self.encode(sentences, encoder, pooling, max_length,
                                                        batch_size, progress))

    def path(self, meta: dict[str, Any]) -> Path:
        """Where the entry with sidecar `meta` is (or would be) kept."""
        key = {k: meta[k] for k in ("pooling", "max_length", "corpus_sha256", "count")}
        key["encoder"] = meta["encoder"]["fingerprint"]
        if meta["precision"] != "float32":
            key["precision"] = meta["precision"]
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        return self.root / f"{meta['pooling']}-{digest}.npy"

    def get(self, meta: dict[str, Any]) -> EmbeddingFile | None:
        """The cached file for `meta`, checked, or None."""
        return finished(self.path(meta), meta)

    def files(self, corpus: Corpus, encoder: Encoder, pooling: str | Sequence[str],
              max_length: int = 128, batch_size: int = DEFAULT_BATCH_SIZE,
              progress: bool | None = None) -> dict[str, EmbeddingFile]:
        """The cached embeddings of `corpus` with each pooling, encoding (in one pass) only
        those that are missing."""
        poolings = [pooling] if isinstance(pooling, str) else list(pooling)
        metas = {p: embeddings_meta(corpus, encoder, p, max_length) for p in poolings}
        found = {p: self.get(m) for p, m in metas.items()}
        missing = {p: self.path(metas[p]) for p, f in found.items() if f is None}
        if missing:
            write_embeddings(missing, corpus, encoder, max_length, batch_size, resume=True,
                             restart=True, wait=True, progress=progress, own=True)
            found.update({p: EmbeddingFile(path) for p, path in missing.items()})
        return {p: found[p] for p in poolings}

    def encode(self, sentences: Sequence[str], encoder: Encoder, pooling: str | Sequence[str],
               max_length: int = 128, batch_size: int = DEFAULT_BATCH_SIZE,
               progress: bool | None = None) -> np.ndarray | dict[str, np.ndarray]:
        """Like `Encoder.encode`, reading what is cached and encoding only what is missing;
        the arrays are memory-mapped."""
        files = self.files(Corpus.from_sentences(sentences), encoder, pooling, max_length,
                           batch_size, progress)
        arrays = {p: f.load() for p, f in files.items()}
        return arrays[pooling] if isinstance(pooling, str) else arrays


def encode_to(path: str | os.PathLike, corpus: Corpus, encoder: Encoder, pooling: str,
              max_length: int = 128, batch_size: int = DEFAULT_BATCH_SIZE, *,
              cache: EmbeddingCache | None = None, resume: bool = False, restart: bool = False,
              progress: bool | None = None) -> bool:
    """Write the embeddings of `corpus` to `path` by `write_embeddings` (its lock and its rules
    for a stopped run), copied from `cache` when it has them, else filed there as a hard link
    (not where links cannot be made or another process is writing the entry); whether they were
    encoded (under torchrun only rank 0 knows: the others say True)."""
    check_batch_size(batch_size)
    path = check_destination(path)
    meta = cached = None
    if cache is not None and distributed.is_main():
        meta = embeddings_meta(corpus, encoder, check_pooling(pooling), max_length)
        cached = cache.get(meta)
    write_embeddings({pooling: path}, corpus, encoder, max_length, batch_size, resume=resume,
                     restart=restart, progress=progress,
                     copies=None if cached is None else {pooling: cached})
    if cache is not None and meta is not None and cached is None and cache.get(meta) is None:
        with suppress(OSError, BertflowError), lock(cache.path(meta), wait=False):
            place(EmbeddingFile(path), cache.path(meta), copy=False)
    distributed.barrier()
    return cached is None
