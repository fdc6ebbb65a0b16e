"""A `.npy` output beside its sidecar: where one may be written (`check_destination`), one
writer at a time (`lock`), and the writes of a finished array (`write_transformed`, `place`).
The sidecar is renamed into place before the data: a kill at any point leaves the old pair, the
new pair, or a new sidecar beside data (or none) that its checksum does not describe, which
readers refuse and a rerun replaces."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BertflowError
from ..storage.artifacts import EMBEDDINGS, TRANSFORMED
from ..storage.files import (
    Checked,
    atomic_file,
    fsync,
    identity,
    meta_path,
    write_json,
)
from .file import EmbeddingFile

__all__ = ["check_destination", "lock", "partial_path", "place", "record_paths",
           "write_transformed"]


def partial_path(path: Path) -> Path:
    """Where the streaming writer writes the rows of `path`; `record_paths`: its records."""
    return path.with_name(path.name + ".partial")


def record_paths(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.progress-*.json"))


def check_destination(path: str | os.PathLike) -> Path:
    """`path` if a `.npy` output may be written there (`EMBEDDINGS.check_destination`: free, or
    a bertflow output, whether or not its data agrees: a write killed between the two is rerun),
    no file a write makes a symbolic link, the lock path free or a lock."""
    path = EMBEDDINGS.check_destination(path)
    for companion in (partial_path(path), *record_paths(path)):
        if companion.is_symlink():
            raise BertflowError(f"{companion} is a symbolic link; writing {path} would replace "
                                "it: remove it or write elsewhere")
    _check_lock(path)
    return path


@contextlib.contextmanager
def lock(path: Path, wait: bool) -> Iterator[None]:
    """Hold `.NAME.npy.lock` beside `path`: one writer of `path` at a time (another is waited
    for with `wait`, else refused). The lock is an empty file, opened without following a link;
    anything else there is refused and kept, and only the lock held is removed at the end."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        name = _check_lock(path)  # by its name first: a FIFO or a device is never opened
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o666)
        except OSError:
            _check_lock(path)  # a link or a folder put there meanwhile
            raise
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
        if (identity(name) or ())[:2] == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # the holder removed it as we waited: lock the new one
    try:
        yield
    finally:
        if (identity(name) or ())[:2] == (held.st_dev, held.st_ino):
            name.unlink(missing_ok=True)
        os.close(fd)


def _check_lock(path: Path, status: os.stat_result | None = None) -> Path:
    """The lock path of `path`, `.NAME.npy.lock`; what is there (or `status`, of a file opened
    there) is refused unless it is nothing or an empty file."""
    name = path.with_name(f".{path.name}.lock")
    if status is None:
        try:
            status = os.lstat(name)
        except FileNotFoundError:
            return name
    if stat.S_ISLNK(status.st_mode):
        raise BertflowError(f"{name} is a symbolic link; writing {path} would lock it: remove "
                            "it or write elsewhere")
    if not stat.S_ISREG(status.st_mode) or status.st_size:
        raise BertflowError(f"{name} is not a lock bertflow made (an empty file); writing "
                            f"{path} would lock it: remove it or write elsewhere")
    return name


def write_transformed(path: str | os.PathLike, z: np.ndarray, head: dict[str, Any],
                      source: dict[str, Any], checked: Checked | None = None) -> dict[str, Any]:
    """Write vectors a head transformed to `path` with a sidecar that says so (never taken for
    embeddings) and holds the data's sha256. Writers of `path` take turns. With `checked`
    (`check_destination` of `path`, its sidecar watched), a pair changed since is checked again
    before the sidecar's rename; data made at `path` after that is kept, the sidecar removed."""
    path, sidecar = Path(path), meta_path(path)
    z = np.ascontiguousarray(z, dtype=np.float32)
    placed = None  # what this call renamed onto the sidecar

    def keep_new_data(p: Path, _: Path) -> None:  # p is `path`, which `checked` watches first
        if identity(p) not in (None, checked.seen[0]):
            if identity(sidecar) == placed:
                sidecar.unlink()
            raise BertflowError(f"{p} was made or changed by another process while this one "
                                "wrote it; not replacing it")

    header, data = io.BytesIO(), memoryview(z).cast("B")
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(z))
    digest = hashlib.sha256(header.getvalue())  # the file's bytes, hashed without reading it
    digest.update(data)
    with (lock(path, wait=True),
          atomic_file(path, recheck=keep_new_data if checked is not None else None) as tmp):
        with open(tmp, "wb") as f:  # not np.save, whose short write loses the error's errno
            f.write(header.getvalue())
            f.write(data)
        fsync(tmp)  # before the sidecar: nothing slow is left between the two renames
        meta = {**TRANSFORMED.stamp(), "head": head, "source": source,
                "count": int(z.shape[0]), "dim": int(z.shape[1]), "dtype": "float32",
                "sha256": digest.hexdigest()}
        write_json(sidecar, meta, recheck=checked)
        placed = identity(sidecar)
    return meta


def place(source: EmbeddingFile, path: Path, copy: bool) -> None:
    """Put the finished embeddings `source` at `path` (its `lock` held) with their sidecar: a hard
    link, else with `copy` a copy; what a stopped run left there is let be."""
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
