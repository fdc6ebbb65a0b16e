"""Vector search over transformed embeddings with FAISS; an index folder holds `index.faiss`,
`items.json` (the items and their ids), `config.json`, the head in `head/` and the manifest."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..constants import DEFAULT_BATCH_SIZE, DEFAULT_MAX_LENGTH, DEFAULT_POOLING, HNSW_DEFAULTS
from ..embeddings.cache import EmbeddingCache
from ..encoders.batches import check_max_length
from ..encoders.encoder import Encoder
from ..encoders.identity import EncoderId
from ..encoders.loading import resolve_encoder
from ..encoders.pooling import check_pooling
from ..errors import BertflowError, first_line
from ..heads.format import load_head, weights_sha256
from ..heads.head import Head
from ..runtime import distributed
from ..storage.artifacts import INDEX_FOLDER, counts
from ..storage.corpus import Corpus
from ..storage.files import check_finite, read_json, sha256_file, write_json
from ..training.feedback import Feedback
from . import kinds
from .feedback import check_index, search_index

__all__ = ["Hit", "Index"]

_INDEX, _ITEMS, _CONFIG, _HEAD = "index.faiss", "items.json", "config.json", "head"


class Hit(NamedTuple):
    """One search result: the cosine `score`, the `item`, its line (position + 1) and its `id`
    (a BEIR document's `_id`; for a text corpus, the line as text)."""

    score: float
    item: str
    line: int
    id: str


class Index:
    """Sentences, their ids and their vectors (encoder → pooling → head → optional PCA → unit
    length) in a FAISS inner-product index: exact (`flat`), approximate (`hnsw`) or any FAISS
    `index_factory` string (`IVF1024,PQ32`, ...; see `bertflow.search.kinds`)."""

    def __init__(self, faiss_index: Any, items: list[str], config: dict[str, Any],
                 head: Head | None = None, ids: list[str] | None = None):
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

    @property
    def nprobe(self) -> int | None:
        """Inverted lists visited per query (IVF kinds; `kinds.default_nprobe` unless set,
        saved with the index); None without."""
        ivf = kinds.inverted_lists(self.faiss_index)
        return None if ivf is None else int(ivf.nprobe)

    @nprobe.setter
    def nprobe(self, value: int) -> None:
        kinds.set_nprobe(self.faiss_index, self.config["kind"], value)
        if "nprobe" in self.config:
            self.config["nprobe"] = int(value)

    @property
    def ef_search(self) -> int | None:
        """Candidates kept while searching an HNSW graph (more: better recall, slower); None
        for kinds without one. Saved with the index."""
        found = kinds.graph(self.faiss_index)
        return None if found is None else int(found.efSearch)

    @ef_search.setter
    def ef_search(self, value: int) -> None:
        kinds.set_ef_search(self.faiss_index, self.config["kind"], value)
        if "hnsw" in self.config:
            self.config["hnsw"] = {**self.config["hnsw"], "ef_search": int(value)}

    @property
    def feedback(self) -> Feedback | None:
        """The pseudo-relevance feedback (`Feedback`) every search applies, in the space of
        the vectors the index stores (`bertflow.search.feedback`); None: plain search. Saved
        with the index."""
        value = self.config.get("feedback")
        return None if value is None else Feedback.from_dict(value)

    @feedback.setter
    def feedback(self, value: Feedback | None) -> None:
        if value is None:
            self.config.pop("feedback", None)
            return
        value.check_count(len(self.items))
        check_index(self.faiss_index, self.config["kind"])
        self.config["feedback"] = value.to_dict()

    @classmethod
    def from_embeddings(cls, x: np.ndarray, items: Sequence[str], *,
                        ids: Sequence[str] | None = None, head: Head | None = None,
                        encoder: EncoderId | None = None,
                        pooling: str = DEFAULT_POOLING, max_length: int = DEFAULT_MAX_LENGTH,
                        kind: str = "flat", dims: int | None = None,
                        hnsw: dict[str, int] | None = None,
                        feedback: Feedback | None = None) -> Index:
        """Index pooled embeddings `x` of `items` (named by `ids`, by default their lines),
        after `head`, keeping `dims` components. A trained `kind` (IVF, PQ) learns from a
        seeded sample of the vectors (`kinds.training_rows`); kind `hnsw` builds its graph
        with `hnsw` (M, ef_construction, ef_search; `kinds.HNSW_DEFAULTS`), and an IVF kind
        visits `kinds.default_nprobe` lists a query: each recorded, as is `feedback`, which its
        searches then apply (`Index.feedback`)."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[0] != len(items) or not len(items):
            raise BertflowError(f"need one embedding row per item: {x.shape} for {len(items)}")
        ids = _check_ids(ids, len(items))
        check_pooling(pooling)
        if head is not None:
            head.check(encoder=encoder, pooling=pooling)
            x = head.transform(x)  # checks its width, input and output
        else:
            check_finite(x, "the embeddings to index")
        dim = x.shape[1]
        index, rows = _plan(kind, dim, dims, len(items), hnsw, feedback)
        z, rows = np.ascontiguousarray(x, dtype=np.float32), 0 if index.is_trained else rows
        try:
            if rows:
                index.train(z[kinds.sample(len(z), rows)])
            index.add(z)
        except RuntimeError as e:
            raise BertflowError(f"FAISS could not build a {kind!r} index "
                                f"({kinds.faiss_reason(e)})") from None
        if index.ntotal != len(items):
            raise BertflowError(f"index kind {kind!r} does not hold vectors added to it")
        config = {**INDEX_FOLDER.stamp(),
                  "encoder": encoder.to_dict() if encoder else None, "pooling": pooling,
                  "max_length": max_length, "kind": kind, "dim": dim, "dims": dims or dim,
                  "count": len(items), "trained_on": rows,
                  "head": weights_sha256(head) if head is not None else None}
        if kind == "hnsw":
            config["hnsw"] = {**HNSW_DEFAULTS, **(hnsw or {})}
        nprobe = kinds.default_nprobe(index)
        if nprobe is not None:
            kinds.set_nprobe(index, kind, nprobe)
            config["nprobe"] = nprobe
        made = cls(index, list(items), config, head, ids)
        made.feedback = feedback
        return made

    @classmethod
    def build(cls, sentences: Sequence[str] | Corpus,
              encoder: Encoder | str | os.PathLike | None = None, *,
              ids: Sequence[str] | None = None, head: Head | None = None,
              pooling: str | None = None,
              max_length: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
              cache: EmbeddingCache | None = None, progress: bool | None = None,
              **options: Any) -> Index | None:
        """Embed `sentences` (a list, or a `Corpus`, read streamed, whose ids are the default
        `ids`), then index them. Under torchrun, with a `cache` the processes share the encoding
        and rank 0 alone gets the index (the others None). The kind, `dims` and the number of
        sentences are checked before anything is encoded."""
        encoder = resolve_encoder(encoder, head.encoder if head is not None else None)
        pooling, max_length = head.settings(encoder, pooling, max_length) if head is not None \
            else encoder.defaults(pooling and check_pooling(pooling), max_length)
        if not isinstance(sentences, Corpus | list | tuple):
            sentences = list(sentences)
        _plan(options.get("kind", "flat"), head.out_dim if head is not None else
              encoder.width(pooling), options.get("dims"), len(sentences), options.get("hnsw"),
              options.get("feedback"))
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
        """Cosine scores and item ids (rows, k), best first, for pooled query embeddings;
        with the index's `feedback`, those of the queries it moves."""
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
        x, k = np.ascontiguousarray(x, dtype=np.float32), min(k, len(self.items))
        if self.feedback is not None:
            return search_index(self.faiss_index, self.config["kind"], self.feedback, x, k)
        return self.faiss_index.search(x, k)

    def search(self, queries: Sequence[str], encoder: Encoder | str | os.PathLike | None = None,
               k: int = 10, batch_size: int = DEFAULT_BATCH_SIZE, *,
               cache: EmbeddingCache | None = None, progress: bool | None = None
               ) -> list[list[Hit]]:
        """For each query, the `k` nearest items as `Hit(score, item, line, id)`, best first;
        the queries' embeddings are read from (and kept in) `cache` where one is given."""
        if isinstance(queries, str):
            raise BertflowError("expected a list of queries, got one string: pass [query]")
        encoder = resolve_encoder(encoder, self.encoder)
        mine = self.encoder
        if mine is not None and mine.fingerprint != encoder.id.fingerprint:
            raise BertflowError(f"index was built with encoder {mine}; got encoder {encoder.id}")
        settings = self.pooling, self.config["max_length"], batch_size, progress
        x = encoder.encode(list(queries), *settings) if cache is None else cache.files(
            Corpus.from_sentences(list(queries), "queries"), encoder, *settings)[
            self.pooling].load()
        scores, ids = self.search_embeddings(x, k)
        return [[Hit(float(s), self.items[i], int(i) + 1, self.ids[i])
                 for s, i in zip(row_s, row_i, strict=True) if i >= 0]
                for row_s, row_i in zip(scores, ids, strict=True)]

    def save(self, path: str | os.PathLike) -> Path:
        """Write the index folder atomically (see `artifacts.FolderFormat.write`)."""
        faiss = kinds.faiss_module()

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
        faiss = kinds.faiss_module()
        path = Path(path)
        if not (path / _INDEX).is_file():
            raise BertflowError(f"no index at {path} (no {_INDEX})")
        config, files = INDEX_FOLDER.load(path)
        if not {_INDEX, _ITEMS} <= files.keys():
            raise BertflowError(f"{path}'s manifest does not list {_INDEX} and {_ITEMS}")
        try:
            dim, dims, count = counts(config, "dim", "dims", "count")
            encoder = EncoderId.from_dict(config["encoder"]) if config["encoder"] else None
            check_pooling(config["pooling"])
            check_max_length(config["max_length"])
            if dims > dim:
                raise ValueError(f"dims {dims} exceeds dim {dim}")
            if not isinstance(config["head"], bool | str | None):
                raise ValueError("bad head record")
            hnsw = config.get("hnsw")  # absent: written before M was settable, which was 32
            if hnsw is not None and (not isinstance(hnsw, dict) or set(hnsw) != set(HNSW_DEFAULTS)):
                raise ValueError("bad hnsw settings")
            if config.get("feedback") is not None:
                Feedback.from_dict(config["feedback"])
            made = kinds.make(config["kind"], dim, dims, hnsw and {"M": hnsw["M"]})
            expected, least = kinds.structure(made), count * kinds.code_size(made)
        except (KeyError, TypeError, ValueError, BertflowError) as e:
            raise BertflowError(f"{path / _CONFIG} is malformed ({first_line(e)})") from None
        stored = read_json(path / _ITEMS, files[_ITEMS])
        items, ids = stored.get("items"), stored.get("ids")
        if not all(isinstance(v, list) and all(isinstance(i, str) for i in v)
                   for v in (items, ids)):
            raise BertflowError(f"{path / _ITEMS} does not hold a list of items and their ids")
        try:
            _check_ids(ids, len(items))
        except BertflowError as e:
            raise BertflowError(f"{path / _ITEMS}: {e}") from None
        data = np.frombuffer(files[_INDEX], dtype=np.uint8)
        if data.size < least:  # before FAISS allocates what the file declares
            raise BertflowError(f"{path / _INDEX} holds {data.size} bytes, fewer than the "
                                f"{count} vectors its config describes take ({least}): a "
                                "damaged index")
        kinds.check_declared_sizes(data, path / _INDEX)
        try:
            index = faiss.deserialize_index(data)
        except RuntimeError as e:
            raise BertflowError(f"{path / _INDEX} is not a valid FAISS index ({first_line(e)})") \
                from None
        if not len(items) == index.ntotal == count:
            raise BertflowError(f"{path} is inconsistent: {len(items)} items, {index.ntotal} "
                                f"vectors; its config says {count}")
        if kinds.structure(index) != expected or not index.is_trained:
            raise BertflowError(f"{path} is inconsistent: {_INDEX} is not the trained "
                                f"{config['kind']!r} index of {dim}-d vectors (PCA to {dims}, "
                                "inner product) that its config describes")
        if "nprobe" in config:  # absent: written before it was recorded; the file's own
            try:
                kinds.set_nprobe(index, config["kind"], config["nprobe"])
            except BertflowError as e:
                raise BertflowError(f"{path / _CONFIG} is malformed ({e})") from None
        record = config["head"]  # True: written before the head's weights were recorded
        head_files = {name.removeprefix(f"{_HEAD}/"): data for name, data in files.items()
                      if name.startswith(f"{_HEAD}/")}
        if bool(record) != bool(head_files):
            raise BertflowError(f"{path}: the config and the {_HEAD}/ folder disagree on a head")
        head = load_head(path / _HEAD, head_files) if record else None
        if isinstance(record, str) and weights_sha256(head) != record:
            raise BertflowError(f"{path}: its {_HEAD}/ folder is not the head its vectors went "
                                f"through (its config records weights {record[:12]}, the "
                                f"folder holds {weights_sha256(head)[:12]})")
        if head is not None:
            head.check(encoder=encoder, pooling=config["pooling"],
                       max_length=config["max_length"])
            if head.out_dim != dim:
                raise BertflowError(f"{path}: its head gives {head.out_dim}-d vectors, its "
                                    f"index holds {dim}-d ones")
        config.pop("sha256", None)  # belongs to the files on disk; `save` writes it afresh
        return cls(index, items, config, head, ids)


def _plan(kind: str, dim: int, dims: int | None, count: int,
          hnsw: dict[str, int] | None = None,
          feedback: Feedback | None = None) -> tuple[Any, int]:
    """The empty index of `kind` for `count` vectors of `dim` dimensions, PCA to `dims`, and
    how many of them it is trained on; refused where that cannot be (`feedback` too)."""
    if feedback is not None:
        feedback.check_count(count)
    dims = None if dims == dim else dims  # all of them: no PCA to train
    if dims is not None and not 1 <= dims <= min(dim, count):
        raise BertflowError(f"dims must be {dim} (all) or between 1 and {min(dim, count)} "
                            f"(the dimension and the number of items), got {dims}")
    index = kinds.make(kind, dim, dims or dim, hnsw)
    return index, kinds.training_rows(index, kind, count)


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
