"""The streaming writer: a corpus encoded chunk by chunk into `.npy` embeddings, resumably, by
one process or several (torchrun). Rows go into `EMB.npy.partial`, preallocated; after every
chunk each process records how far it got, with a checksum of those rows, in
`EMB.npy.progress-R-of-N.json`, so that a stopped run (an error, kill -9, a full disk) continues
to the very bytes of an uninterrupted one. Last the sidecar is written with the data's sha256,
then the partial file renamed onto `EMB.npy`: a kill at any point leaves a run to finish or the
pair."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..constants import PROGRESS_FROM
from ..encoders.batches import check_batch_size
from ..encoders.encoder import CHUNK_SIZE, Encoder
from ..errors import BertflowError, PeerError
from ..runtime import distributed
from ..storage.artifacts import EMBEDDINGS, PROGRESS
from ..storage.corpus import Corpus
from ..storage.files import (
    disk_errors,
    fsync,
    meta_path,
    read_json,
    remove_stale_temporaries,
    sha256_file,
    write_json,
)
from .file import EmbeddingFile, embeddings_meta, finished, other_request, read_header
from .outputs import check_destination, lock, partial_path, place, record_paths

__all__ = ["write_embeddings"]


def write_embeddings(targets: Mapping[str, str | os.PathLike], corpus: Corpus, encoder: Encoder,
                     max_length: int = 128, batch_size: int = 32, *, resume: bool = False,
                     restart: bool = False, wait: bool = False, progress: bool | None = None,
                     copies: Mapping[str, EmbeddingFile] | None = None,
                     own: bool = False) -> dict[str, dict]:
    """Encode `corpus` once per pooling in `targets` (pooling → `.npy` path); return the sidecars.

    A stopped run at a target is refused unless `resume` continues it (its records must be of
    this request and agree with the partial file) or `restart` discards it; one with every row
    in is finished either way; both (the cache's way) continue what can be, else start afresh.
    With `resume`, a complete target is kept. A stopped run that wrote no row (it failed on its
    first chunk) holds nothing to continue: it is replaced whatever its request, and a run that
    fails before its first row removes what it made. `copies` maps a pooling to a finished file
    of the same request, put at its target instead; `wait` waits for another writer of a target
    rather than refusing; `own` says the targets lie in bertflow's own folder (the cache), where
    whatever fails its check (a damaged or missing sidecar, a partial file or record that is
    not bertflow's) is replaced, not refused. Under torchrun rank 0 prepares and finishes the
    files (its errors raised on every rank) and each rank encodes its share of the chunks."""
    rank, world = distributed.rank(), distributed.world_size()
    encoder.check_max_length(max_length)
    check_batch_size(batch_size)
    copies = copies or {}
    outputs = {p: _Output(Path(path), embeddings_meta(corpus, encoder, p, max_length),
                          {"chunk_size": CHUNK_SIZE, "batch_size": batch_size, "world": world})
               for p, path in targets.items()}
    with contextlib.ExitStack() as locks:

        def prepare() -> None:
            for p, output in sorted(outputs.items(), key=lambda item: item[1].path):
                locks.enter_context(lock(output.path, wait))
                output.prepare(resume, restart, copy=copies.get(p), own=own)

        def finish() -> None:
            for output in pending.values():
                output.finish()

        _on_rank_0(prepare)
        pending = {p: o for p, o in outputs.items() if o.record_path(rank).exists()}
        try:
            _encode_share(pending, corpus, encoder, max_length, batch_size, rank, world, progress)
        except BaseException:
            if world == 1:  # under torchrun another process may have written rows
                for output in pending.values():
                    with contextlib.suppress(OSError):
                        output.discard(unstarted=True)
            raise
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


def _encode_share(outputs: Mapping[str, _Output], corpus: Corpus, encoder: Encoder,
                  max_length: int, batch_size: int, rank: int, world: int,
                  progress: bool | None) -> None:
    start, stop = _share(len(corpus), rank, world, CHUNK_SIZE)
    records = {p: read_json(o.record_path(rank)) for p, o in outputs.items()}
    reached = {p: (int(r["done"]), str(r["rows_sha256"])) for p, r in records.items()}
    done = min((d for d, _ in reached.values()), default=stop)
    if done >= stop:
        return
    show = len(corpus) >= PROGRESS_FROM if progress is None else progress
    label = f"encoding (rank {rank})" if world > 1 else "encoding"
    with contextlib.ExitStack() as opened:
        files = {p: opened.enter_context(open(o.partial, "r+b")) for p, o in outputs.items()}
        offsets = {p: read_header(files[p], o.partial)[2] for p, o in outputs.items()}
        bar = opened.enter_context(tqdm(total=stop - start, initial=done - start, desc=label,
                                        unit="sent", disable=not show or rank != 0))
        for chunk in corpus.chunks(done, stop, CHUNK_SIZE):
            vectors = encoder.encode_chunk(chunk, list(outputs), max_length, batch_size, bar.update)
            # an output a kill left a chunk ahead of the others already holds these rows
            behind = [p for p in outputs if reached[p][0] == done]
            for p in behind:
                checksum = outputs[p].write(files[p], offsets[p], done, vectors[p], reached[p][1])
                reached[p] = (done + len(chunk), checksum)
            for p in behind:
                outputs[p].record(rank, *reached[p])
            done += len(chunk)


def _share(count: int, rank: int, world: int, chunk: int) -> tuple[int, int]:
    """Rank `rank`'s contiguous run of whole chunks, as rows [start, stop)."""
    chunks = -(-count // chunk)
    first, last = chunks * rank // world, chunks * (rank + 1) // world
    return min(first * chunk, count), min(last * chunk, count)


_NO_ROWS = hashlib.sha256().hexdigest()


def _chained(checksum: str, rows: bytes | memoryview | np.ndarray) -> str:
    """A share's checksum after one more chunk: sha256 of the one before, then the rows."""
    digest = hashlib.sha256(bytes.fromhex(checksum))
    digest.update(rows)
    return digest.hexdigest()


class _Output:
    """One `.npy` being written: its partial file and progress records, each process's holding
    its share of the rows, how many are done and their checksum (`rows_sha256`)."""

    def __init__(self, path: Path, meta: dict[str, Any], layout: dict[str, int]):
        self.path, self.meta, self.layout = path, meta, layout
        self.partial = partial_path(path)

    def share(self, rank: int) -> tuple[int, int]:
        return _share(self.meta["count"], rank, self.layout["world"], self.layout["chunk_size"])

    def record_path(self, rank: int) -> Path:
        return self.path.with_name(
            f"{self.path.name}.progress-{rank}-of-{self.layout['world']}.json")

    def prepare(self, resume: bool, restart: bool, copy: EmbeddingFile | None = None,
                own: bool = False) -> None:
        """Make the partial file and records of a run (rank 0, under the lock), or keep those a
        stopped run of this request left, once checked; or put the finished `copy` in place,
        removing them where they would be continued or discarded. With `own`, what fails its
        check at the target is removed first (`write_embeddings`)."""
        if own:
            self._remove_debris()
        check_destination(self.path)
        remove_stale_temporaries(self.path)  # left by a kill as the cache linked it, say
        for litter in self.path.parent.glob(f".{self.path.name}.progress-*.json.*.tmp"):
            litter.unlink()  # left by a kill during a record's atomic write
        records = {record: self._read_record(record) for record in record_paths(self.path)}
        if records and not self.partial.exists():  # killed before it was made, or after it moved
            for record in records:
                record.unlink()
            records = {}
        if self.partial.exists() and not records:
            raise BertflowError(f"{self.partial} exists but was not left by bertflow; "
                                "remove it or choose another output")
        if records and not _unstarted(records) and (resume or not restart):
            try:
                self._check_records(records, resume)
                if copy is None:
                    self._check_rows(records)
                    return
            except BertflowError:
                if not restart:
                    raise
        if copy is None and not records and resume and finished(self.path, self.meta):
            return
        self.discard()
        if copy is not None:
            place(copy, self.path, copy=True)
        else:
            self._start()

    def discard(self, unstarted: bool = False) -> None:
        """Remove the partial file and its records; with `unstarted`, only a run's that wrote
        no row."""
        records = {record: PROGRESS.record(record) for record in record_paths(self.path)}
        if unstarted and not (records and _unstarted(records)):
            return
        self.partial.unlink(missing_ok=True)  # first: records without it are litter
        for record in records:
            record.unlink()

    def _remove_debris(self) -> None:
        """Remove what fails its check at the target: the pair where its sidecar is damaged or
        missing, the partial file where no record is bertflow's, every record where one is
        not (its partial file with them)."""
        try:
            EMBEDDINGS.check_destination(self.path)
        except BertflowError:
            self.path.unlink(missing_ok=True)
            meta_path(self.path).unlink(missing_ok=True)
        records = [PROGRESS.record(record) for record in record_paths(self.path)]
        if not records or None in records:
            self.discard()

    def _start(self) -> None:
        """Write a record per process and the partial file, preallocated at its final size."""
        count, dim = self.meta["count"], self.meta["dim"]
        for rank in range(self.layout["world"]):
            self.record(rank, self.share(rank)[0], _NO_ROWS)
        try:
            with (disk_errors(f"preparing {self.partial} ({count * dim * 4 / 2**20:.0f} MiB)"),
                  open(self.partial, "wb") as f):
                np.lib.format.write_array_header_1_0(
                    f, {"descr": "<f4", "fortran_order": False, "shape": (count, dim)})
                os.posix_fallocate(f.fileno(), 0, f.tell() + count * dim * 4)
                os.fsync(f.fileno())
            fsync(self.path.parent)
        except (OSError, BertflowError):
            self.partial.unlink(missing_ok=True)
            for record in record_paths(self.path):
                record.unlink()
            raise

    def write(self, f: Any, offset: int, start: int, rows: np.ndarray, checksum: str) -> str:
        """Write `rows` from row `start` on and flush them; the share's checksum with them."""
        data = memoryview(np.ascontiguousarray(rows, dtype=np.float32)).cast("B")
        position, view = offset + start * self.meta["dim"] * 4, data
        with disk_errors(f"writing {self.partial}"):
            while len(view):
                written = os.pwrite(f.fileno(), view, position)
                view, position = view[written:], position + written
            os.fsync(f.fileno())
        return _chained(checksum, data)

    def record(self, rank: int, done: int, checksum: str) -> None:
        write_json(self.record_path(rank), {
            **PROGRESS.stamp(), "request": self.meta, "layout": self.layout,
            "rows": list(self.share(rank)), "done": done, "rows_sha256": checksum})

    def finish(self) -> None:
        """Check that every share is done, write the sidecar with the partial file's sha256,
        then move the data into place and drop the records."""
        records = {record: read_json(record) for record in record_paths(self.path)}
        self._check_records(records, resume=True)
        for record, value in records.items():
            if value["done"] != value["rows"][1]:
                raise BertflowError(f"{record} is unfinished: rows {value['done']} to "
                                    f"{value['rows'][1]} were never written")
        digest = sha256_file(self.partial)
        check_destination(self.path)  # what is there now may not be what was there at first
        write_json(meta_path(self.path), {**self.meta, "sha256": digest})
        os.replace(self.partial, self.path)
        fsync(self.path.parent)
        for record in records:
            record.unlink()

    def _read_record(self, record: Path) -> dict[str, Any]:
        value = PROGRESS.record(record)
        if value is not None:
            return value
        raise BertflowError(f"{record} is not a bertflow progress record; not touching it")

    def _check_records(self, records: dict[Path, dict[str, Any]], resume: bool) -> None:
        """Refuse `records` unless they are every record of a stopped run of this request and
        settings, to continue (`resume`) or finish (every row in), saying what to do instead."""
        for record, value in records.items():
            if not _well_formed(value):
                raise BertflowError(f"{record} is malformed; start afresh with --restart")
        done = sum(v["done"] - v["rows"][0] for v in records.values())
        total = sum(v["rows"][1] - v["rows"][0] for v in records.values())
        for record, value in records.items():
            other = other_request(value["request"], self.meta)
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
            raise BertflowError(f"{self.path}'s progress records ({found}) are not those of a "
                                f"{self.layout['world']}-process run; resume with as many "
                                "processes as the run had, or start afresh with --restart")
        for record, value in records.items():
            if value["rows"] != list(self.share(ranks[record.name])):
                raise BertflowError(f"{record} is malformed; start afresh with --restart")

    def _check_rows(self, records: dict[Path, dict[str, Any]]) -> None:
        """Check the partial file's shape, and each record's checksum against its rows."""
        count, dim, chunk = self.meta["count"], self.meta["dim"], self.layout["chunk_size"]
        try:
            file = EmbeddingFile(self.partial)
        except BertflowError:
            file = None
        if file is None or file.shape != (count, dim) or file.dtype != np.float32 or file.fortran:
            raise BertflowError(f"{self.partial} does not hold {count} × {dim} float32 rows; "
                                "start afresh with --restart")
        with file:
            for record, value in records.items():
                (start, _), done = value["rows"], value["done"]
                checksum = _NO_ROWS
                for first in range(start, done, chunk):
                    checksum = _chained(checksum, file.read(first, min(first + chunk, done)))
                if checksum != value["rows_sha256"]:
                    raise BertflowError(f"{record} does not agree with {self.partial}: rows "
                                        f"{start} to {done} are not the ones it recorded; "
                                        "start afresh with --restart")


def _unstarted(records: Mapping[Path, Any]) -> bool:
    """Whether `records` are a run's that wrote no row: nothing to continue or to lose."""
    return all(isinstance(v, dict) and _well_formed(v) and v["done"] == v["rows"][0]
               for v in records.values())


def _well_formed(record: dict[str, Any]) -> bool:
    rows, done = record.get("rows"), record.get("done")
    return (isinstance(record.get("request"), dict) and isinstance(record.get("layout"), dict)
            and isinstance(record["request"].get("encoder"), dict) and isinstance(rows, list)
            and len(rows) == 2 and all(isinstance(x, int) for x in (*rows, done))
            and rows[0] <= done <= rows[1] and isinstance(record.get("rows_sha256"), str))
