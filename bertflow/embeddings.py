"""Embeddings on disk: a float32 `.npy` beside a `.meta.json` sidecar, written chunk by chunk
(resumably, by one process or several) and read back a few rows at a time.

While a file is being written its rows go into `EMB.npy.partial`, preallocated at its final
size, and each process records how far it got, with a checksum of those rows, in
`EMB.npy.progress-R-of-N.json` after every chunk. A run that stops for any reason (an error,
kill -9, a full disk) is continued by the same request with `resume=True` once the records
agree with the partial file, and the finished file is bit for bit the one an uninterrupted run
writes. When every row is in, the sidecar is written with the partial file's sha256 and then
the partial file is renamed onto `EMB.npy`, so a process killed at any point leaves a run to
finish or the finished pair, and a reader refuses a sidecar that does not belong to the array
beside it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from . import distributed
from .constants import PROGRESS_FROM
from .corpus import Corpus
from .encoder import (
    CHUNK_SIZE,
    DTYPES,
    Encoder,
    EncoderId,
    check_batch_size,
    check_max_length,
    check_pooling,
)
from .errors import BertflowError, PeerError, first_line
from .files import (
    Checked,
    atomic_file,
    check_finite,
    fsync,
    identity,
    meta_path,
    read_json,
    refuse_link,
    remove_stale_temporaries,
    sha256_file,
    write_json,
)

__all__ = [
    "FORMAT",
    "EmbeddingFile",
    "PeerError",
    "check_destination",
    "check_output",
    "embeddings_meta",
    "load_embeddings",
    "open_embeddings",
    "place_embeddings",
    "read_meta",
    "write_embeddings",
    "write_transformed",
]

FORMAT = "bertflow-embeddings"
FORMAT_VERSION = 2
PROGRESS = "bertflow-embeddings-progress"
TRANSFORMED = "bertflow-transformed"
_READ_ROWS = 16384


def embeddings_meta(encoder: EncoderId, pooling: str, max_length: int, corpus: str, count: int,
                    dim: int, precision: str = "float32") -> dict[str, Any]:
    """The record that identifies a set of embeddings: who made them, how, and from what."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "encoder": encoder.to_dict(),
        "pooling": pooling,
        "max_length": max_length,
        "precision": precision,
        "corpus_sha256": corpus,
        "count": count,
        "dim": dim,
        "dtype": "float32",
    }


def read_meta(npy: str | os.PathLike) -> dict[str, Any] | None:
    """The sidecar of `npy` if it has one, checked to be an embeddings record (version 1
    records, from before `precision` and `sha256`, read as float32 and unchecked). Vectors a
    head transformed are refused: they are not embeddings an encoder made."""
    path = meta_path(npy)
    if not path.exists():
        return None
    meta = read_json(path)
    if meta.get("format") == TRANSFORMED:
        raise BertflowError(f"{npy} holds vectors transformed by a flow head, not embeddings "
                            "from an encoder; give the embeddings they were made from")
    if meta.get("format") != FORMAT:
        raise BertflowError(f"{path} is not a bertflow embeddings record")
    missing = {"encoder", "pooling", "max_length", "count", "dim"} - meta.keys()
    if missing:
        raise BertflowError(f"{path} lacks {', '.join(sorted(missing))}")
    meta.setdefault("precision", "float32")
    try:
        EncoderId.from_dict(meta["encoder"])
        check_pooling(meta["pooling"])
        check_max_length(meta["max_length"])
        if not all(isinstance(meta[k], int) and meta[k] > 0 for k in ("count", "dim")):
            raise BertflowError("count and dim must be positive integers")
        if meta["precision"] not in DTYPES:
            raise BertflowError(f"unknown precision {meta['precision']!r}")
    except BertflowError as e:
        raise BertflowError(f"{path} is malformed: {e}") from None
    return meta


class EmbeddingFile:
    """A 2-D float `.npy` file read by rows (`read`, `take`, `chunks`) into float32 arrays,
    with positioned reads rather than a mapping of the whole file, so that memory stays
    bounded however large the file; `meta` is its sidecar, or None.

    Opening checks the header, the shape and the file's size; `verify` reads every row once
    to check that all are finite and that the sidecar's checksum is this file's.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise BertflowError(f"no such file: {self.path}")
        self._file = open(self.path, "rb")  # noqa: SIM115 - held for the object's lifetime
        try:
            self.shape, self.dtype, self.offset, self.fortran = _header(self._file, self.path)
        except BaseException:
            self._file.close()
            raise
        self.meta = read_meta(self.path)

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def dim(self) -> int:
        return self.shape[1]

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> EmbeddingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows `start` to `stop` as a new float32 array."""
        start, stop = max(0, start), min(stop, len(self))
        if self.fortran:
            return np.array(self._mapped()[start:stop], dtype=np.float32)
        out = np.empty((max(0, stop - start), self.dim), dtype=self.dtype)
        self._read_into(out, start)
        return out.astype(np.float32, copy=False)

    def take(self, rows: np.ndarray | Sequence[int]) -> np.ndarray:
        """The rows at `rows`, in that order, as a new float32 array."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.fortran:
            return np.array(self._mapped()[rows], dtype=np.float32)
        out = np.empty((len(rows), self.dim), dtype=self.dtype)
        for j, row in enumerate(rows):
            self._read_into(out[j : j + 1], int(row))
        return out.astype(np.float32, copy=False)

    def chunks(self, rows: int = _READ_ROWS) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, float32 rows) over the whole file, `rows` at a time."""
        for start in range(0, len(self), rows):
            yield start, self.read(start, start + rows)

    def verify(self) -> EmbeddingFile:
        """Check that every value is finite and, when the sidecar records one, the checksum."""
        digest = hashlib.sha256()
        self._file.seek(0)
        digest.update(self._file.read(self.offset))
        for start, block in self._raw_chunks():
            digest.update(block.tobytes())
            check_finite(block, str(self.path), offset=start)
        expected = (self.meta or {}).get("sha256")
        if expected is not None and digest.hexdigest() != expected:
            raise BertflowError(
                f"{meta_path(self.path)} does not describe {self.path} (checksum differs): "
                "one of the two was replaced or altered; encode again"
            )
        if self.meta is not None and (self.meta["count"], self.meta["dim"]) != self.shape:
            raise BertflowError(f"{self.path} has shape {self.shape} but its sidecar says "
                                f"({self.meta['count']}, {self.meta['dim']})")
        return self

    def load(self) -> np.ndarray:
        """The whole array, memory-mapped read-only."""
        return self._mapped()

    def _raw_chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        for start in range(0, len(self), _READ_ROWS):
            stop = min(start + _READ_ROWS, len(self))
            if self.fortran:
                yield start, np.ascontiguousarray(self._mapped()[start:stop])
                continue
            block = np.empty((stop - start, self.dim), dtype=self.dtype)
            self._read_into(block, start)
            yield start, block

    def _read_into(self, out: np.ndarray, start: int) -> None:
        view = memoryview(out).cast("B")
        position = self.offset + start * self.dim * self.dtype.itemsize
        while len(view):
            got = os.preadv(self._file.fileno(), [view], position)
            if got <= 0:
                raise BertflowError(f"{self.path} ended early (it is truncated or was replaced)")
            view, position = view[got:], position + got

    def _mapped(self) -> np.ndarray:
        return np.load(self.path, mmap_mode="r", allow_pickle=False)


def open_embeddings(path: str | os.PathLike, *, pooling: str | None = None,
                    encoder: Encoder | None = None,
                    max_length: int | None = None) -> tuple[EmbeddingFile, dict[str, Any]]:
    """An embeddings file to fit or transform, verified, and where it came from: its encoder
    (an `EncoderId`, or None when unknown), pooling, max length and data digest.

    The sidecar says how the file was made, and a `pooling` or `encoder` given besides must
    agree with it. A file without a sidecar needs `pooling` (the caller's word for how it was
    made) and is checked against `encoder`'s width when one is given."""
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
        digest = sha256_file(path)
        return file, {"encoder": encoder.id if encoder else None, "pooling": pooling,
                      "max_length": max_length, "data": digest,
                      "corpus": {"npy_sha256": digest}}
    made_by = EncoderId.from_dict(meta["encoder"])
    if encoder is not None and encoder.id.fingerprint != made_by.fingerprint:
        raise BertflowError(f"{path} was made by encoder {made_by}, not by --encoder "
                            f"{encoder.id}")
    if pooling is not None and pooling != meta["pooling"]:
        raise BertflowError(f"{path} holds {meta['pooling']} pooling, but --pooling {pooling} "
                            "was given")
    digest = str(meta.get("corpus_sha256"))
    return file, {"encoder": made_by, "pooling": meta["pooling"],
                  "max_length": meta["max_length"], "data": digest,
                  "corpus": {"sha256": digest}}


def write_transformed(path: str | os.PathLike, z: np.ndarray, head: dict[str, Any],
                      source: dict[str, Any], checked: Checked | None = None) -> dict[str, Any]:
    """Write vectors a head transformed to `path` (a `.npy`) with their sidecar, which says so
    (format `bertflow-transformed`, with the head's encoder and pooling and the source's
    digest), so that they are never taken for raw embeddings.

    As `encode` does, the sidecar is written first, with the sha256 of the data in its
    temporary file, and then the data is renamed into place: a process killed at any point
    leaves the old pair, the new pair, or the new sidecar beside old data (or none), which its
    checksum does not describe and which `check_output` lets a rerun replace. Two processes
    writing `path` take turns (the last one's pair stays). With `checked` (`check_output` of
    `path`, its sidecar watched, run before the work), a pair changed since is checked again
    just before the sidecar's rename; data made at `path` after that is kept, and the new
    sidecar removed from beside it."""
    path, sidecar = Path(path), meta_path(path)
    z = np.ascontiguousarray(z, dtype=np.float32)
    placed = None  # what this call renamed onto the sidecar

    def keep_new_data(p: Path) -> None:
        try:
            checked.unchanged(p)
        except BertflowError:
            if identity(sidecar) == placed:
                sidecar.unlink()
            raise

    with (_writing(path, wait=True),
          atomic_file(path, recheck=keep_new_data if checked is not None else None) as tmp):
        with open(tmp, "wb") as f:  # not np.save, whose short write loses the error's errno
            np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(z))
            f.write(memoryview(z).cast("B"))
        fsync(tmp)  # before the sidecar: nothing slow is left between the two renames
        meta = {"format": TRANSFORMED, "format_version": 1, "head": head, "source": source,
                "count": int(z.shape[0]), "dim": int(z.shape[1]), "dtype": "float32",
                "sha256": sha256_file(tmp)}
        write_json(sidecar, meta, recheck=checked)
        placed = identity(sidecar)
    return meta


@contextlib.contextmanager
def _writing(path: Path, wait: bool) -> Iterator[None]:
    """Hold `.NAME.npy.lock` beside `path` exclusively: one writer of `path` at a time (another
    holder is waited for with `wait`, else refused). The lock is an empty file: it is opened
    without following a symbolic link and never written, anything else at its path is refused
    as it is (`_check_lock`), and only the lock this process holds is removed at the end."""
    lock = _lock(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        _check_lock(path)  # by its name first: a FIFO or a device is never opened
        try:
            fd = os.open(lock, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o666)
        except OSError as e:
            _check_lock(path)  # a link or a folder put there meanwhile
            raise _disk_error(e, f"creating {lock}") from None
        try:
            held = os.fstat(fd)
            _check_lock(path, held)
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise BertflowError(
                f"another process is writing {path}; wait for it to finish") from None
        except BaseException:
            os.close(fd)
            raise
        if _same_inode(lock, held):
            break
        os.close(fd)  # the holder removed it as we waited: lock the new one
    try:
        yield
    finally:
        if _same_inode(lock, held):
            lock.unlink(missing_ok=True)
        os.close(fd)


def _check_lock(path: Path, status: os.stat_result | None = None) -> None:
    """Refuse what is at the lock path of `path` (or `status`, of a file opened there) unless
    it is free or a lock bertflow made, an empty file: a symbolic link, a folder, a file with
    data in it (an input given by that name, say) are left as they are."""
    lock = _lock(path)
    if status is None:
        try:
            status = os.lstat(lock)
        except FileNotFoundError:
            return
    if stat.S_ISLNK(status.st_mode):
        raise BertflowError(f"{lock} is a symbolic link; writing {path} would lock it: remove "
                            "it or write elsewhere")
    if not stat.S_ISREG(status.st_mode) or status.st_size:
        raise BertflowError(f"{lock} is not a lock bertflow made (an empty file); writing "
                            f"{path} would lock it: remove it or write elsewhere")


def _same_inode(path: Path, status: os.stat_result) -> bool:
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (status.st_dev, status.st_ino)


def check_output(path: str | os.PathLike) -> Path:
    """`path` if a `.npy` output may be written there: free, or a bertflow output's (its sidecar
    is an embeddings or transformed-vectors record, whether or not the data beside it is
    there and agrees: so a write killed between the two is rerun), where neither `path` nor
    its sidecar is a symbolic link and its lock path is free or holds a lock (`_check_lock`).
    Anything else, a sidecar alone included, is the user's and is left alone. (That it is none
    of a command's inputs is `files.check_outputs`' to check.)"""
    path = Path(path)
    if path.suffix != ".npy":
        raise BertflowError(f"--out {path} must end in .npy")
    if path.is_dir():
        raise BertflowError(f"--out {path} is a folder")
    sidecar = meta_path(path)
    refuse_link(path)
    if sidecar.is_symlink():
        raise BertflowError(f"{sidecar} is a symbolic link; writing {path} would replace it: "
                            "remove it or write elsewhere")
    _check_lock(path)
    if not path.exists() and not sidecar.exists():
        return path
    if not sidecar.exists():
        raise BertflowError(f"{path} exists and is not a bertflow output (no {sidecar.name}); "
                            "not replacing it")
    try:
        ours = read_json(sidecar).get("format") in (FORMAT, TRANSFORMED)
    except BertflowError:
        ours = False
    if not ours:
        beside = f" nor {path.name}" if path.exists() else ""
        raise BertflowError(f"{sidecar} exists and is not a bertflow sidecar; not replacing "
                            f"it{beside}")
    return path


def load_embeddings(path: str | os.PathLike) -> np.ndarray:
    """A 2-D float array from a `.npy` file, checked (shape, finiteness, the sidecar's
    checksum) and memory-mapped."""
    with EmbeddingFile(path) as file:
        return file.verify().load()


def _header(f: Any, path: Path) -> tuple[tuple[int, int], np.dtype, int, bool]:
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
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


def write_embeddings(
    targets: Mapping[str, str | os.PathLike],
    corpus: Corpus,
    encoder: Encoder,
    max_length: int = 128,
    batch_size: int = 32,
    *,
    resume: bool = False,
    restart: bool = False,
    wait: bool = False,
    progress: bool | None = None,
    copies: Mapping[str, EmbeddingFile] | None = None,
) -> dict[str, dict[str, Any]]:
    """Encode `corpus` once with every pooling in `targets` (pooling → `.npy` path) and write
    each pooling's embeddings to its path, returning the sidecars written.

    A target where a run stopped (its partial file and progress records) is refused unless
    `resume` continues it (the records must belong to this very request and agree with the
    rows in the partial file) or `restart` discards it; a run that stopped with every row in
    is finished either way. Both together (what the cache does with its own files) continue a
    stopped run where it can be continued, else start afresh. With `resume`, a target already
    complete is left as it is. `copies` maps a pooling to a finished file of the same request
    (the cache's), put at its target instead of encoding, after the same checks: what a
    stopped run left there is removed where `resume` or `restart` would take it. `wait` waits
    for another process writing the same target instead of refusing. Under torchrun every
    rank calls this: rank 0 prepares and finishes the files (its errors are raised on every
    rank), and each rank encodes its own contiguous share of the chunks into them.
    """
    rank, world = distributed.rank(), distributed.world_size()
    encoder.check_max_length(max_length)
    check_batch_size(batch_size)
    copies = copies or {}
    outputs = {p: _Output(Path(path), embeddings_meta(
        encoder.id, check_pooling(p), max_length, corpus.sha256, len(corpus), encoder.width(p),
        encoder.precision), {"chunk_size": CHUNK_SIZE, "batch_size": batch_size, "world": world})
        for p, path in targets.items()}
    with contextlib.ExitStack() as locks:

        def prepare() -> None:
            for p, output in outputs.items():
                locks.enter_context(output.lock(wait))
                output.prepare(resume, restart, copy=copies.get(p))

        def finish() -> None:
            for output in pending.values():
                output.finish()

        _on_rank_0(prepare)
        pending = {p: o for p, o in outputs.items() if o.record_path(rank).exists()}
        _encode_share(pending, corpus, encoder, max_length, batch_size, rank, world, progress)
        distributed.barrier()
        _on_rank_0(finish)
    return {p: o.meta for p, o in outputs.items()}


def _on_rank_0(work: Callable[[], None]) -> None:
    """Do `work` on rank 0 only, and raise its error, if any, on every rank."""
    error = None
    if distributed.is_main():
        try:
            work()
        except BertflowError as e:
            error = str(e)
    error = distributed.broadcast_error(error)
    if error is not None:
        raise BertflowError(error) if distributed.is_main() else PeerError(error)


def place_embeddings(source: EmbeddingFile, path: str | os.PathLike, *, copy: bool) -> None:
    """Put the finished embeddings `source` at `path` with their sidecar, as a hard link (else,
    with `copy`, as a copy), under the writer's lock; refused while another process writes
    `path`. What a stopped run left there is let be."""
    path = Path(path)
    with _writing(path, wait=False):
        _place(source, path, copy)


def _place(source: EmbeddingFile, path: Path, copy: bool) -> None:
    """`place_embeddings` under the lock. The sidecar is written before the data is renamed
    into place: a process killed at any point leaves the old pair, the new one, or a sidecar
    that the data beside it (if any) fails, which readers refuse and a rerun replaces."""
    with atomic_file(path) as temporary:
        temporary.unlink()
        try:
            os.link(source.path, temporary)
        except OSError:
            if not copy:
                raise
            shutil.copyfile(source.path, temporary)
        check_destination(path)  # what is there now may not be what was checked at the start
        write_json(meta_path(path), source.meta)


def _encode_share(outputs: Mapping[str, _Output], corpus: Corpus, encoder: Encoder,
                  max_length: int, batch_size: int, rank: int, world: int,
                  progress: bool | None) -> None:
    start, stop = _share(len(corpus), rank, world, CHUNK_SIZE)
    reached = {p: o.progress(rank) for p, o in outputs.items()}  # rows done, their checksum
    done = min((d for d, _ in reached.values()), default=stop)
    if done >= stop:
        return
    show = len(corpus) >= PROGRESS_FROM if progress is None else progress
    label = f"encoding (rank {rank})" if world > 1 else "encoding"
    files = {p: open(o.partial, "r+b") for p, o in outputs.items()}  # noqa: SIM115
    offsets = {p: _header(files[p], o.partial)[2] for p, o in outputs.items()}
    try:
        with tqdm(total=stop - start, initial=done - start, desc=label, unit="sent",
                  disable=not show or rank != 0) as bar:
            for chunk in corpus.chunks(done, stop, CHUNK_SIZE):
                vectors = encoder.encode_chunk(chunk, list(outputs), max_length, batch_size,
                                               bar.update)
                # an output a kill left a chunk ahead of the others already holds these rows
                behind = [p for p in outputs if reached[p][0] == done]
                for p in behind:
                    checksum = outputs[p].write(files[p], offsets[p], done, vectors[p],
                                                reached[p][1])
                    reached[p] = (done + len(chunk), checksum)
                for p in behind:
                    outputs[p].record(rank, *reached[p])
                done += len(chunk)
    finally:
        for f in files.values():
            f.close()


def check_destination(path: str | os.PathLike) -> Path:
    """`path` if embeddings may be written there (`check_output`: free, or a bertflow output of
    either kind), where none of the files a write makes (the `.npy`, its sidecar, partial file,
    lock and progress records) is a symbolic link. Anything else is left alone."""
    path = check_output(path)
    for companion in (_partial(path), *_records(path)):
        if companion.is_symlink():
            raise BertflowError(f"{companion} is a symbolic link; writing {path} would replace "
                                "it: remove it or write elsewhere")
    return path


def _share(count: int, rank: int, world: int, chunk: int) -> tuple[int, int]:
    """Rank `rank`'s contiguous run of whole chunks, as rows [start, stop)."""
    chunks = -(-count // chunk)
    first, last = chunks * rank // world, chunks * (rank + 1) // world
    return min(first * chunk, count), min(last * chunk, count)


def _partial(path: Path) -> Path:
    return path.with_name(path.name + ".partial")


def _lock(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def _records(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.progress-*.json"))


_NO_ROWS = hashlib.sha256().hexdigest()


def _chained(checksum: str, rows: bytes | memoryview) -> str:
    """The checksum of a share's rows after one more chunk: sha256 of the checksum before it
    (`_NO_ROWS` for none) followed by the chunk's bytes."""
    digest = hashlib.sha256(bytes.fromhex(checksum))
    digest.update(rows)
    return digest.hexdigest()


class _Output:
    """One `.npy` being written: its partial file, progress records and lock.

    Each process's record holds its share of the rows, how many of them are in the partial
    file (`done`) and their checksum (`rows_sha256`, chained chunk by chunk), which a run that
    keeps the partial file checks against it first.
    """

    def __init__(self, path: Path, meta: dict[str, Any], layout: dict[str, int]):
        if path.suffix != ".npy" or path.is_dir():
            check_destination(path)
        self.path, self.meta, self.layout = path, meta, layout
        self.partial = _partial(path)

    def record_path(self, rank: int) -> Path:
        return self.path.with_name(
            f"{self.path.name}.progress-{rank}-of-{self.layout['world']}.json")

    def lock(self, wait: bool) -> contextlib.AbstractContextManager[None]:
        return _writing(self.path, wait)

    def prepare(self, resume: bool, restart: bool, copy: EmbeddingFile | None = None) -> None:
        """Make the partial file and the records for a run (rank 0, under the lock), or keep
        those a stopped run of this request left, once checked, to continue it; or, given a
        `copy` of the finished file, remove them where they would be continued or discarded
        and put the copy in place."""
        if copy is not None and (other := self._other_request(copy.meta)) is not None:
            raise BertflowError(f"{copy.path} holds other embeddings ({other})")
        check_destination(self.path)
        remove_stale_temporaries(self.path)  # left by a kill as the cache linked it, say
        for litter in self.path.parent.glob(f".{self.path.name}.progress-*.json.*.tmp"):
            litter.unlink()  # left by a kill during a record's atomic write
        records = {record: self._read_record(record) for record in _records(self.path)}
        if records and not self.partial.exists():
            # no rows to continue: a kill came before the partial file was made, or after it
            # was moved into place
            for record in records:
                record.unlink()
            records = {}
        if self.partial.exists() and not records:
            raise BertflowError(f"{self.partial} exists but was not left by bertflow; "
                                "remove it or choose another output")
        if records and (resume or not restart):
            try:
                self._check_records(records, resume)
                if copy is None:
                    self._check_rows(records)
                    return
            except BertflowError:
                if not restart:
                    raise
        if copy is None and not records and resume and self._complete():
            return
        self.partial.unlink(missing_ok=True)  # first: records without it are litter
        for record in records:
            record.unlink()
        if copy is not None:
            _place(copy, self.path, copy=True)
            return
        count, dim = self.meta["count"], self.meta["dim"]
        for rank in range(self.layout["world"]):
            start, _ = _share(count, rank, self.layout["world"], self.layout["chunk_size"])
            self.record(rank, start, _NO_ROWS)
        size = count * dim * 4
        try:
            with open(self.partial, "wb") as f:
                np.lib.format.write_array_header_1_0(f, {
                    "descr": np.lib.format.dtype_to_descr(np.dtype("<f4")),
                    "fortran_order": False, "shape": (count, dim)})
                size += f.tell()
                os.posix_fallocate(f.fileno(), 0, size)
                os.fsync(f.fileno())
            fsync(self.path.parent)
        except OSError as e:
            self.partial.unlink(missing_ok=True)
            for record in _records(self.path):
                record.unlink()
            raise _disk_error(e, f"preparing {self.partial} ({size / 2**20:.0f} MiB)") from None

    def progress(self, rank: int) -> tuple[int, str]:
        """How many rows of its share rank `rank` has written, and their checksum."""
        value = read_json(self.record_path(rank))
        return int(value["done"]), str(value["rows_sha256"])

    def write(self, f: Any, offset: int, start: int, rows: np.ndarray, checksum: str) -> str:
        """Write `rows` from row `start` on and flush them to the disk; the checksum of the
        share's rows with them."""
        data = memoryview(np.ascontiguousarray(rows, dtype=np.float32)).cast("B")
        position = offset + start * self.meta["dim"] * 4
        try:
            view = data
            while len(view):
                written = os.pwrite(f.fileno(), view, position)
                view, position = view[written:], position + written
            os.fsync(f.fileno())
        except OSError as e:
            raise _disk_error(e, f"writing {self.partial}") from None
        return _chained(checksum, data)

    def record(self, rank: int, done: int, checksum: str) -> None:
        value = {"format": PROGRESS, "request": self.meta, "layout": self.layout,
                 "rows": list(_share(self.meta["count"], rank, self.layout["world"],
                                     self.layout["chunk_size"])),
                 "done": done, "rows_sha256": checksum}
        try:
            write_json(self.record_path(rank), value)
        except OSError as e:
            raise _disk_error(e, f"writing {self.record_path(rank)}") from None

    def finish(self) -> None:
        """Check that every share is done, write the sidecar with the partial file's sha256,
        then move the data into place and drop the records. A process killed at any point
        leaves the partial file and its records to finish from (beside a sidecar that the old
        data, if any, fails) or the finished pair."""
        records = {record: read_json(record) for record in _records(self.path)}
        self._check_records(records, resume=True)
        for record, value in records.items():
            if value["done"] != value["rows"][1]:
                raise BertflowError(f"{record} is unfinished: rows {value['done']} to "
                                    f"{value['rows'][1]} were never written")
        try:
            digest = sha256_file(self.partial)
            check_destination(self.path)  # what is there now may not be what was there at first
            write_json(meta_path(self.path), {**self.meta, "sha256": digest})
            os.replace(self.partial, self.path)
            fsync(self.path.parent)
        except OSError as e:
            raise _disk_error(e, f"writing {self.path}") from None
        for record in records:
            record.unlink()

    def _read_record(self, record: Path) -> dict[str, Any]:
        try:
            value = read_json(record)
        except BertflowError:
            value = {}
        if value.get("format") != PROGRESS:
            raise BertflowError(f"{record} is not a bertflow progress record; not touching it")
        return value

    def _check_records(self, records: dict[Path, dict[str, Any]], resume: bool) -> None:
        """Refuse `records` unless they are every record of a stopped run of this request with
        these settings, to continue (`resume`) or to finish (every row in), saying what to do
        instead."""
        for record, value in records.items():
            if not _well_formed(value):
                raise BertflowError(f"{record} is malformed; start afresh with --restart")
        done = sum(v["done"] - v["rows"][0] for v in records.values())
        total = sum(v["rows"][1] - v["rows"][0] for v in records.values())
        for record, value in records.items():
            other = self._other_request(value["request"])
            if other is not None and resume:
                raise BertflowError(f"{record} belongs to another run ({other}); start afresh "
                                    "with --restart")
            if other is not None:
                raise BertflowError(f"{self.path} holds an interrupted encode of another "
                                    f"request ({other}; {done} of {total} rows done); discard "
                                    "it with --restart, or --resume it with its own settings")
        if not resume and done < total:
            raise BertflowError(f"{self.path} holds an interrupted encode of this request "
                                f"({done} of {total} rows done); continue it with --resume, "
                                "or discard it with --restart")
        for record, value in records.items():
            for key in ("chunk_size", "batch_size", "world"):
                if value["layout"].get(key) != self.layout[key]:
                    raise BertflowError(
                        f"{record} was written with {key} {value['layout'].get(key)}, not "
                        f"{self.layout[key]}; resume with the same settings, or start afresh "
                        "with --restart")
        ranks = {self.record_path(r).name: r for r in range(self.layout["world"])}
        if {r.name for r in records} != set(ranks):
            found = ", ".join(r.name for r in records)
            raise BertflowError(
                f"{self.path}'s progress records ({found}) are not those of a "
                f"{self.layout['world']}-process run; resume with as many processes as the "
                "run had, or start afresh with --restart")
        for record, value in records.items():
            share = _share(self.meta["count"], ranks[record.name], self.layout["world"],
                           self.layout["chunk_size"])
            if value["rows"] != list(share):
                raise BertflowError(f"{record} is malformed; start afresh with --restart")
            if "rows_sha256" not in value:
                raise BertflowError(f"{record} was written by an older bertflow, without a "
                                    "checksum of its rows; start afresh with --restart")

    def _other_request(self, request: dict[str, Any]) -> str | None:
        """What differs between `request` and this output's, or None."""
        for key in ("corpus_sha256", "count", "encoder", "pooling", "max_length",
                    "precision", "dim"):
            if key == "encoder":  # the same weights, wherever they were loaded from
                same = (request.get(key) or {}).get("fingerprint") == \
                    self.meta[key]["fingerprint"]
            else:
                same = request.get(key) == self.meta[key]
            if not same:
                return f"{key} {_show(request.get(key))}, not {_show(self.meta[key])}"
        return None

    def _check_rows(self, records: dict[Path, dict[str, Any]]) -> None:
        """Check the partial file's header against this output's shape, and each record's
        checksum against the rows of the partial file it says are done (read once)."""
        count, dim, chunk = self.meta["count"], self.meta["dim"], self.layout["chunk_size"]
        with open(self.partial, "rb") as f:
            try:
                shape, dtype, offset, fortran = _header(f, self.partial)
            except BertflowError:
                shape = None
            if shape != (count, dim) or dtype != np.float32 or fortran:
                raise BertflowError(f"{self.partial} does not hold {count} × {dim} float32 "
                                    "rows; start afresh with --restart")
            for record, value in records.items():
                (start, _), done = value["rows"], value["done"]
                checksum = _NO_ROWS
                for first in range(start, done, chunk):
                    size = (min(first + chunk, done) - first) * dim * 4
                    checksum = _chained(checksum, os.pread(f.fileno(), size,
                                                           offset + first * dim * 4))
                if checksum != value["rows_sha256"]:
                    raise BertflowError(f"{record} does not agree with {self.partial}: rows "
                                        f"{start} to {done} are not the ones it recorded; "
                                        "start afresh with --restart")

    def _complete(self) -> bool:
        try:
            meta = read_meta(self.path)
            if meta is None or any(meta.get(k) != v for k, v in self.meta.items()
                                   if k != "format_version"):
                return False
            EmbeddingFile(self.path).verify()
        except BertflowError:
            return False
        return True


def _well_formed(record: dict[str, Any]) -> bool:
    rows, done = record.get("rows"), record.get("done")
    return (isinstance(record.get("request"), dict) and isinstance(record.get("layout"), dict)
            and isinstance(record["request"].get("encoder"), dict) and isinstance(rows, list)
            and len(rows) == 2 and all(isinstance(x, int) for x in (*rows, done))
            and rows[0] <= done <= rows[1])


def _show(value: Any) -> str:
    if isinstance(value, dict) and "name" in value:
        return str(value["name"])
    text = str(value)
    return text[:12] + "…" if len(text) > 16 else text


def _disk_error(error: OSError, doing: str) -> BertflowError:
    if error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        reason = "no space left on the device" if error.errno != errno.EFBIG else "file too large"
        return BertflowError(f"{reason} while {doing}")
    return BertflowError(f"{error.strerror or error} while {doing}")
