"""Vector search over transformed embeddings with FAISS; an index folder holds `index.faiss`,
`items.json` (the items and their ids), `config.json`, the head in `head/` and the manifest."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from . import distributed
from .batches import check_max_length
from .cache import EmbeddingCache
from .constants import DEFAULT_BATCH_SIZE, DEFAULT_MAX_LENGTH, DEFAULT_POOLING
from .corpus import Corpus
from .encoder import Encoder, check_pooling, resolve_encoder
from .encoder_id import EncoderId
from .errors import BertflowError, first_line
from .files import check_finite, read_json, sha256_file, write_json
from .folders import INDEX_FOLDER
from .head import FlowHead

__all__ = ["KINDS", "Hit", "Index"]

KINDS = ("flat", "hnsw")
_INDEX, _ITEMS, _CONFIG, _HEAD = "index.faiss", "items.json", "config.json", "head"


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise BertflowError("retrieval needs faiss: pip install 'bertflow[retrieval]'") from None
    return faiss


class Hit(NamedTuple):
    """One search result: the cosine `score`, the `item`, its line (position + 1) and its `id`
    (a BEIR document's `_id`; for a text corpus, the line as text)."""

    score: float
    item: str
    line: int
    id: str


class Index:
    """Sentences, their ids and their vectors (encoder → pooling → head → optional PCA → unit
    length) in a FAISS inner-product index, exact (`flat`) or approximate (`hnsw`)."""

    def __init__(self, faiss_index: Any, items: list[str], config: dict[str, Any],
                 head: FlowHead | None = None, ids: list[str] | None = None):
        self.faiss_index = faiss_index
        self.items = items
        self.ids = _check_ids(ids, len(items))
        self.config = config
        self.head = head

    @property
    def encoder(self) -> EncoderId | None:
        value = self.config.get("encoder")
        return EncoderId.from_dict(value) if value else None

    @property
    def pooling(self) -> str:
        return self.config["pooling"]

    @classmethod
    def from_embeddings(cls, x: np.ndarray, items: Sequence[str], *,
                        ids: Sequence[str] | None = None, head: FlowHead | None = None,
                        encoder: EncoderId | None = None,
                        pooling: str = DEFAULT_POOLING, max_length: int = DEFAULT_MAX_LENGTH,
                        kind: str = "flat", dims: int | None = None, hnsw_m: int = 32) -> Index:
        """Index pooled embeddings `x` of `items` (named by `ids`, by default their lines),
        after `head`, keeping `dims` components."""
        faiss = _faiss()
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[0] != len(items) or not len(items):
            raise BertflowError(f"need one embedding row per item: {x.shape} for {len(items)}")
        ids = _check_ids(ids, len(items))
        if kind not in KINDS:
            raise BertflowError(f"unknown index kind {kind!r}; choose one of {', '.join(KINDS)}")
        check_pooling(pooling)
        if head is not None:
            head.check(encoder=encoder, pooling=pooling)
            x = head.transform(x)  # checks its width, input and output
        else:
            check_finite(x, "the embeddings to index")
        dim = x.shape[1]
        if dims is not None and not 1 <= dims <= min(dim, len(items)):
            raise BertflowError(f"dims must be between 1 and {min(dim, len(items))} (the "
                                f"dimension and the number of items), got {dims}")
        out = dims or dim
        inner = faiss.IndexFlatIP(out) if kind == "flat" else faiss.IndexHNSWFlat(
            out, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index = faiss.IndexPreTransform(faiss.NormalizationTransform(out, 2.0), inner)
        if out < dim:
            index.prepend_transform(faiss.PCAMatrix(dim, out))
        z = np.ascontiguousarray(x, dtype=np.float32)
        try:
            index.train(z)
            index.add(z)
        except RuntimeError as e:
            raise BertflowError(f"FAISS could not build the index ({first_line(e)})") from None
        config = {"format": INDEX_FOLDER.kind, "format_version": INDEX_FOLDER.version,
                  "encoder": encoder.to_dict() if encoder else None, "pooling": pooling,
                  "max_length": max_length, "kind": kind, "dim": dim, "dims": out,
                  "count": len(items), "head": head is not None}
        return cls(index, list(items), config, head, ids)

    @classmethod
    def build(cls, sentences: Sequence[str] | Corpus,
              encoder: Encoder | str | os.PathLike | None = None, *,
              ids: Sequence[str] | None = None, head: FlowHead | None = None,
              pooling: str | None = None,
              max_length: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
              cache: EmbeddingCache | None = None, progress: bool | None = None,
              **options: Any) -> Index | None:
        """Embed `sentences` (a list, or a `Corpus`, read streamed, whose ids are the default
        `ids`), then index them. Under torchrun, with a `cache` the processes share the encoding
        and rank 0 alone gets the index (the others None)."""
        encoder = resolve_encoder(encoder, head.encoder if head is not None else None)
        pooling, max_length = head.settings(encoder, pooling, max_length) if head is not None \
            else (check_pooling(pooling or DEFAULT_POOLING), max_length or DEFAULT_MAX_LENGTH)
        corpus = sentences if isinstance(sentences, Corpus) else None
        if ids is None and corpus is not None:
            ids = corpus.ids
        if cache is None:
            sentences = list(sentences)
            x = encoder.encode(sentences, pooling, max_length, batch_size, progress)
        else:
            x = cache.files(corpus or Corpus.from_sentences(sentences), encoder, pooling,
                            max_length, batch_size, progress)[pooling].load()
            if not distributed.is_main():
                return None
        return cls.from_embeddings(x, list(sentences), ids=ids, head=head, encoder=encoder.id,
                                   pooling=pooling, max_length=max_length, **options)

    def search_embeddings(self, x: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Cosine scores and item ids (rows, k), best first, for pooled query embeddings."""
        if k < 1:
            raise BertflowError(f"k must be at least 1, got {k}")
        x = np.asarray(x)
        width = self.head.dim if self.head is not None else self.config["dim"]
        if x.ndim != 2 or x.shape[1] != width:
            raise BertflowError(f"index expects {width}-d embeddings, got {x.shape}")
        if self.head is not None:
            x = self.head.transform(x)  # checks its input and output
        else:
            check_finite(x, "the query embeddings")
        return self.faiss_index.search(np.ascontiguousarray(x, dtype=np.float32),
                                       min(k, len(self.items)))

    def search(self, queries: Sequence[str], encoder: Encoder | str | os.PathLike | None = None,
               k: int = 10, batch_size: int = DEFAULT_BATCH_SIZE) -> list[list[Hit]]:
        """For each query, the `k` nearest items as `Hit(score, item, line, id)`, best first."""
        if isinstance(queries, str):
            raise BertflowError("expected a list of queries, got one string: pass [query]")
        encoder = resolve_encoder(encoder, self.encoder)
        mine = self.encoder
        if mine is not None and mine.fingerprint != encoder.id.fingerprint:
            raise BertflowError(f"index was built with encoder {mine}; got encoder {encoder.id}")
        x = encoder.encode(queries, self.pooling, self.config["max_length"], batch_size)
        scores, ids = self.search_embeddings(x, k)
        return [[Hit(float(s), self.items[i], int(i) + 1, self.ids[i])
                 for s, i in zip(row_s, row_i, strict=True) if i >= 0]
                for row_s, row_i in zip(scores, ids, strict=True)]

    def save(self, path: str | os.PathLike) -> Path:
        """Write the index folder atomically (see `folders.FolderFormat.write`)."""
        faiss = _faiss()

        def fill(tmp: Path) -> None:
            faiss.write_index(self.faiss_index, str(tmp / _INDEX))
            write_json(tmp / _ITEMS, {"items": self.items, "ids": self.ids})
            if self.head is not None:
                (tmp / _HEAD).mkdir()
                self.head.write(tmp / _HEAD)
            files = {name: sha256_file(tmp / name) for name in (_INDEX, _ITEMS)}
            write_json(tmp / _CONFIG, {**self.config, "sha256": files})

        return INDEX_FOLDER.write(path, fill)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Index:
        """Rebuild an index folder, checking its manifest, config, FAISS index and head."""
        faiss = _faiss()
        path = Path(path)
        if not (path / _INDEX).is_file():
            raise BertflowError(f"no index at {path} (no {_INDEX})")
        config = INDEX_FOLDER.read(path)
        try:
            dim, dims, count = (int(config[k]) for k in ("dim", "dims", "count"))
            encoder = EncoderId.from_dict(config["encoder"]) if config["encoder"] else None
            check_pooling(config["pooling"])
            check_max_length(config["max_length"])
            if config["kind"] not in KINDS or not 1 <= dims <= dim or count < 1:
                raise ValueError("bad kind, dims or count")
        except (KeyError, TypeError, ValueError, BertflowError) as e:
            raise BertflowError(f"{path / _CONFIG} is malformed ({first_line(e)})") from None
        stored = read_json(path / _ITEMS)
        items, ids = stored.get("items"), stored.get("ids")
        if not all(isinstance(v, list) and all(isinstance(i, str) for i in v)
                   for v in (items, ids)):
            raise BertflowError(f"{path / _ITEMS} does not hold a list of items and their ids")
        try:
            _check_ids(ids, len(items))
        except BertflowError as e:
            raise BertflowError(f"{path / _ITEMS}: {e}") from None
        try:
            index = faiss.read_index(str(path / _INDEX))
        except RuntimeError as e:
            raise BertflowError(f"{path / _INDEX} is not a valid FAISS index ({first_line(e)})") \
                from None
        if (not isinstance(index, faiss.IndexPreTransform) or index.d != dim
                or index.metric_type != faiss.METRIC_INNER_PRODUCT
                or not len(items) == index.ntotal == count):
            raise BertflowError(f"{path} is inconsistent: {len(items)} items, {index.ntotal} "
                                f"vectors of {index.d} dimensions; its config says {count} of "
                                f"{dim}, inner product")
        if bool(config["head"]) != (path / _HEAD).is_dir():
            raise BertflowError(f"{path}: the config and the {_HEAD}/ folder disagree on a head")
        head = FlowHead.load(path / _HEAD) if config["head"] else None
        if head is not None:
            head.check(encoder=encoder, pooling=config["pooling"])
            if head.out_dim != dim:
                raise BertflowError(f"{path}: its head gives {head.out_dim}-d vectors, its "
                                    f"index holds {dim}-d ones")
        config.pop("sha256", None)  # belongs to the files on disk; `save` writes it afresh
        return cls(index, items, config, head, ids)


def _check_ids(ids: Sequence[str] | None, count: int) -> list[str]:
    """`ids` as a list, checked to name `count` items once each; None: the lines as text."""
    if ids is None:
        return [str(line) for line in range(1, count + 1)]
    ids = list(ids)
    if len(ids) != count or not all(isinstance(i, str) for i in ids):
        raise BertflowError(f"need one id (a string) per item: {len(ids)} for {count}")
    if len(set(ids)) != count:
        repeated = next(i for i, n in Counter(ids).items() if n > 1)
        raise BertflowError(f"ids must be unique: {repeated!r} names more than one item")
    return ids
