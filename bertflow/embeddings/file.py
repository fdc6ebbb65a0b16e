"""Embeddings on disk: a float `.npy` beside a `.meta.json` sidecar that says how it was made
(`embeddings_meta`), read back a few rows at a time (`EmbeddingFile`). `writer` writes them."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..constants import DTYPES
from ..encoders.batches import check_max_length
from ..encoders.encoder import Encoder
from ..encoders.identity import EncoderId
from ..encoders.pooling import check_pooling
from ..errors import BertflowError, first_line
from ..storage.artifacts import EMBEDDINGS, TRANSFORMED, counts
from ..storage.corpus import Corpus
from ..storage.files import check_finite, meta_path, read_json, sha256_file

__all__ = ["EmbeddingFile", "embeddings_meta", "finished", "open_embeddings", "other_request",
           "read_header", "read_meta"]

_READ_ROWS = 16384


def embeddings_meta(corpus: Corpus, encoder: Encoder, pooling: str,
                    max_length: int) -> dict[str, Any]:
    """The record that identifies the embeddings of `corpus` by `encoder` with `pooling`: who
    made them, how, and from what (a max length beyond the encoder's is refused)."""
    max_length = encoder.check_max_length(max_length)
    return {**EMBEDDINGS.stamp(), "encoder": encoder.id.to_dict(),
            "pooling": pooling, "max_length": max_length, "precision": encoder.precision,
            "corpus_sha256": corpus.sha256, "count": len(corpus), "dim": encoder.width(pooling),
            "dtype": "float32"}


def other_request(stored: dict[str, Any], meta: dict[str, Any]) -> str | None:
    """What differs between `stored` (a sidecar or a record's request) and the request `meta`
    (an encoder by its fingerprint, wherever it was loaded from), or None."""
    for key, ours in meta.items():
        theirs = stored.get(key)
        if key == "encoder":
            ours, theirs = ours["fingerprint"], (theirs or {}).get("fingerprint")
        if theirs != ours:
            return f"{key} {_show(stored.get(key))}, not {_show(meta[key])}"
    return None


def _show(value: Any) -> str:
    if isinstance(value, dict) and "name" in value:
        return str(value["name"])
    text = str(value)
    return text[:12] + "…" if len(text) > 16 else text


def read_meta(npy: str | os.PathLike) -> dict[str, Any] | None:
    """The sidecar of `npy`, checked to be an embeddings record of this version, or None where
    there is none. Vectors a head transformed are refused: no encoder made them."""
    path = meta_path(npy)
    if not path.exists():
        return None
    meta = read_json(path)
    if meta.get("format") == TRANSFORMED.kind:
        raise BertflowError(f"{npy} holds vectors transformed by a flow head, not embeddings "
                            "from an encoder; give the embeddings they were made from")
    EMBEDDINGS.check(meta, path, advice=": encode again")
    missing = {"encoder", "pooling", "max_length", "precision", "count", "dim"} - meta.keys()
    if missing:
        raise BertflowError(f"{path} lacks {', '.join(sorted(missing))}")
    try:
        EncoderId.from_dict(meta["encoder"])
        check_pooling(meta["pooling"])
        check_max_length(meta["max_length"])
        counts(meta, "count", "dim")
        if meta["precision"] not in DTYPES:
            raise BertflowError(f"unknown precision {meta['precision']!r}")
    except ValueError as e:  # a BertflowError among them
        raise BertflowError(f"{path} is malformed: {e}") from None
    return meta


def finished(npy: str | os.PathLike, meta: dict[str, Any]) -> EmbeddingFile | None:
    """The embeddings at `npy`, verified, if its sidecar records the request `meta`; else None."""
    try:
        stored = read_meta(npy)
        if stored is None or other_request(stored, meta) is not None:
            return None
        return EmbeddingFile(npy).verify()
    except BertflowError:
        return None


class EmbeddingFile:
    """A 2-D float `.npy` file read by rows (`read`, `take`) into float32 arrays, in bounded
    memory; `meta` is its sidecar, or None. Opening checks the header, the shape and the size;
    `verify` reads every row to check that all are finite and the sidecar's checksum, and keeps
    the file's sha256 (`sha256`) where those rows are all its bytes (C order, nothing after)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise BertflowError(f"no such file: {self.path}")
        self._file = open(self.path, "rb")  # noqa: SIM115 - held for the object's lifetime
        try:
            self.shape, self.dtype, self.offset, self.fortran = read_header(self._file, self.path)
        except BaseException:
            self._file.close()
            raise
        self.dim = self.shape[1]
        self.meta = read_meta(self.path)

    def __len__(self) -> int:
        return self.shape[0]

    def __enter__(self) -> EmbeddingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows `start` to `stop` as a new float32 array."""
        return self._rows(start, stop).astype(np.float32, copy=False)

    def take(self, rows: np.ndarray | Sequence[int]) -> np.ndarray:
        """The rows at `rows`, in that order, as a new float32 array."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.fortran:
            return np.array(self.load()[rows], dtype=np.float32)
        out = np.empty((len(rows), self.dim), dtype=self.dtype)
        for j, row in enumerate(rows):
            self._read_into(out[j : j + 1], int(row))
        return out.astype(np.float32, copy=False)

    def verify(self) -> EmbeddingFile:
        """Check that every value is finite and, when the sidecar records one, the checksum."""
        digest = hashlib.sha256()
        self._file.seek(0)
        digest.update(self._file.read(self.offset))
        for start in range(0, len(self), _READ_ROWS):
            block = self._rows(start, start + _READ_ROWS)
            digest.update(block.tobytes())
            check_finite(block, str(self.path), offset=start)
        size = self.offset + len(self) * self.dim * self.dtype.itemsize
        whole = not self.fortran and os.fstat(self._file.fileno()).st_size == size
        self.sha256 = digest.hexdigest() if whole else None
        expected = (self.meta or {}).get("sha256")
        if expected is not None and digest.hexdigest() != expected:
            raise BertflowError(
                f"{meta_path(self.path)} does not describe {self.path} (checksum differs): "
                "one of the two was replaced or altered; encode again")
        if self.meta is not None and (self.meta["count"], self.meta["dim"]) != self.shape:
            raise BertflowError(f"{self.path} has shape {self.shape} but its sidecar says "
                                f"({self.meta['count']}, {self.meta['dim']})")
        return self

    def load(self) -> np.ndarray:
        """The whole array, memory-mapped read-only from the file opened (and verified), not
        from whatever is at its path now."""
        return np.memmap(self._file, self.dtype, "r", self.offset, self.shape,
                         "F" if self.fortran else "C")

    def _rows(self, start: int, stop: int) -> np.ndarray:
        """Rows `start` to `stop` in the file's dtype, C-contiguous."""
        start, stop = max(0, start), min(stop, len(self))
        if self.fortran:
            return np.ascontiguousarray(self.load()[start:stop])
        out = np.empty((max(0, stop - start), self.dim), dtype=self.dtype)
        self._read_into(out, start)
        return out

    def _read_into(self, out: np.ndarray, start: int) -> None:
        view = memoryview(out).cast("B")
        position = self.offset + start * self.dim * self.dtype.itemsize
        while len(view):
            got = os.preadv(self._file.fileno(), [view], position)
            if got <= 0:
                raise BertflowError(f"{self.path} ended early (it is truncated or was replaced)")
            view, position = view[got:], position + got


def open_embeddings(path: str | os.PathLike, *, pooling: str | None = None,
                    encoder: Encoder | None = None,
                    max_length: int | None = None) -> tuple[EmbeddingFile, dict[str, Any]]:
    """An embeddings file to fit or transform, verified, and where it came from: its encoder (an
    `EncoderId`, or None when unknown), pooling, max length and data digest. A `pooling` or
    `encoder` given must agree with the sidecar; without one, `pooling` is needed (the caller's
    word for how it was made) and the width is checked against `encoder`'s."""
    file = EmbeddingFile(path).verify()
    meta = file.meta
    if meta is None:
        if pooling is None:
            raise BertflowError(f"{path} has no {meta_path(path).name} sidecar; pass --pooling "
                                "(and --encoder) to say how it was made")
        check_pooling(pooling)
        if encoder is not None and encoder.width(pooling) != file.dim:
            raise BertflowError(f"{path} holds {file.dim}-d embeddings, but encoder "
                                f"{encoder.id} makes {encoder.width(pooling)}-d ones")
        digest = file.sha256 or sha256_file(path)
        return file, {"encoder": encoder.id if encoder else None, "pooling": pooling,
                      "max_length": max_length, "data": digest, "corpus": {"npy_sha256": digest}}
    made_by = EncoderId.from_dict(meta["encoder"])
    if encoder is not None and encoder.id.fingerprint != made_by.fingerprint:
        raise BertflowError(f"{path} was made by encoder {made_by}, not by --encoder "
                            f"{encoder.id}")
    if pooling is not None and pooling != meta["pooling"]:
        raise BertflowError(f"{path} holds {meta['pooling']} pooling, but --pooling {pooling} "
                            "was given")
    digest = str(meta.get("corpus_sha256"))
    return file, {"encoder": made_by, "pooling": meta["pooling"], "max_length": meta["max_length"],
                  "data": digest, "corpus": {"sha256": digest}}


def read_header(f: Any, path: Path) -> tuple[tuple[int, int], np.dtype, int, bool]:
    """The shape, dtype, data offset and Fortran order of the `.npy` open as `f`, checked to be
    a non-empty 2-D float array whose data the file holds whole."""
    try:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError(f"unsupported .npy version {version}")
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                 else np.lib.format.read_array_header_2_0)(f)
    except (ValueError, OSError, EOFError, SyntaxError) as e:
        raise BertflowError(f"{path} is not a readable .npy array ({first_line(e)})") from None
    if dtype.hasobject:
        raise BertflowError(f"{path} is not a readable .npy array (it holds Python objects)")
    if len(shape) != 2:
        raise BertflowError(f"{path} has shape {shape}; expected (sentences, dim)")
    if shape[0] == 0 or shape[1] == 0:
        raise BertflowError(f"{path} is empty (shape {shape})")
    if not np.issubdtype(dtype, np.floating):
        raise BertflowError(f"{path} has dtype {dtype}; expected floating-point embeddings")
    offset = f.tell()
    expected = offset + shape[0] * shape[1] * dtype.itemsize
    size = os.fstat(f.fileno()).st_size
    if size < expected:
        raise BertflowError(f"{path} is truncated: {size} bytes where its header needs "
                            f"{expected}")
    return (int(shape[0]), int(shape[1])), dtype, offset, bool(fortran)
