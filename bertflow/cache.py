"""Embeddings on disk: a memory-mappable `.npy` and a `.meta.json` saying what made it."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .encoder import DEFAULT_BATCH_SIZE, Encoder, EncoderId, check_max_length, check_pooling
from .errors import BertflowError
from .files import load_embeddings, meta_path, read_json, save_embeddings

__all__ = ["EmbeddingCache", "corpus_sha256", "embeddings_meta", "read_meta"]

FORMAT = "bertflow-embeddings"


def corpus_sha256(sentences: Sequence[str]) -> str:
    """sha256 of the sentences as a UTF-8 file with one sentence per `\\n`-ended line."""
    digest = hashlib.sha256()
    for sentence in sentences:
        digest.update(sentence.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def embeddings_meta(
    encoder: EncoderId, pooling: str, max_length: int, corpus: str, count: int, dim: int
) -> dict[str, Any]:
    """The record that identifies a set of embeddings."""
    return {
        "format": FORMAT,
        "format_version": 1,
        "encoder": encoder.to_dict(),
        "pooling": pooling,
        "max_length": max_length,
        "corpus_sha256": corpus,
        "count": count,
        "dim": dim,
        "dtype": "float32",
    }


def read_meta(npy: str | os.PathLike) -> dict[str, Any] | None:
    """The sidecar of `npy` if it has one, checked to be an embeddings record."""
    path = meta_path(npy)
    if not path.exists():
        return None
    meta = read_json(path)
    if meta.get("format") != FORMAT:
        raise BertflowError(f"{path} is not a bertflow embeddings record")
    missing = {"encoder", "pooling", "max_length", "count", "dim"} - meta.keys()
    if missing:
        raise BertflowError(f"{path} lacks {', '.join(sorted(missing))}")
    try:
        EncoderId.from_dict(meta["encoder"])
        check_pooling(meta["pooling"])
        check_max_length(meta["max_length"])
        if not all(isinstance(meta[k], int) and meta[k] > 0 for k in ("count", "dim")):
            raise BertflowError("count and dim must be positive integers")
    except BertflowError as e:
        raise BertflowError(f"{path} is malformed: {e}") from None
    return meta


class EmbeddingCache:
    """A folder of embeddings keyed by (encoder weights, pooling, max_length, corpus).

    A cached file is used only when its sidecar matches the request field for field and its
    shape matches the sidecar; anything else is encoded again and replaces it.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, meta: dict[str, Any]) -> Path:
        key = {k: meta[k] for k in ("pooling", "max_length", "corpus_sha256", "count")}
        key["encoder"] = meta["encoder"]["fingerprint"]
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        return self.root / f"{meta['pooling']}-{digest}.npy"

    def path_for(
        self, sentences: Sequence[str], encoder: Encoder, pooling: str, max_length: int = 128
    ) -> Path:
        """Where the embeddings of this request are (or would be) kept."""
        meta = embeddings_meta(
            encoder.id, pooling, max_length, corpus_sha256(sentences), len(sentences), encoder.dim
        )
        return self.path(meta)

    def get(self, meta: dict[str, Any]) -> np.ndarray | None:
        path = self.path(meta)
        try:
            stored = read_meta(path)
            if stored is None or not path.exists():
                return None
            same = {k: v for k, v in stored.items() if k != "encoder"} == {
                k: v for k, v in meta.items() if k != "encoder"
            } and stored["encoder"]["fingerprint"] == meta["encoder"]["fingerprint"]
            if not same:
                return None
            array = load_embeddings(path)
        except BertflowError:
            return None
        return array if array.shape == (meta["count"], meta["dim"]) else None

    def encode(
        self,
        sentences: Sequence[str],
        encoder: Encoder,
        pooling: str | Sequence[str],
        max_length: int = 128,
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress: bool | None = None,
    ) -> np.ndarray | dict[str, np.ndarray]:
        """Like `Encoder.encode`, reading what is cached and encoding only what is missing."""
        poolings = [pooling] if isinstance(pooling, str) else list(pooling)
        corpus = corpus_sha256(sentences)
        metas = {
            p: embeddings_meta(encoder.id, p, max_length, corpus, len(sentences), encoder.dim)
            for p in poolings
        }
        found = {p: self.get(m) for p, m in metas.items()}
        missing = [p for p, array in found.items() if array is None]
        if missing:
            fresh = encoder.encode(sentences, missing, max_length, batch_size, progress)
            assert isinstance(fresh, dict)
            for p, array in fresh.items():
                save_embeddings(self.path(metas[p]), array, metas[p])
                found[p] = load_embeddings(self.path(metas[p]))
        return found[pooling] if isinstance(pooling, str) else {p: found[p] for p in poolings}
