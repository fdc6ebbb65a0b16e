"""Reading user files with clear errors, and writing files and folders atomically."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .errors import BertflowError, first_line

__all__ = [
    "atomic_directory",
    "atomic_file",
    "check_finite",
    "iter_sentences",
    "meta_path",
    "read_json",
    "read_sentences",
    "sha256_file",
    "write_json",
]


def read_sentences(path: str | os.PathLike) -> list[str]:
    """One sentence per line of a UTF-8 text file; an empty file or a blank line is an error."""
    sentences = list(iter_sentences(path))
    if not sentences:
        raise BertflowError(f"{path} is empty: expected one sentence per line")
    return sentences


def iter_sentences(path: str | os.PathLike, start: int = 0) -> Iterator[str]:
    """The sentences of a UTF-8 text file, one per line, read lazily from sentence `start` on.

    A leading byte-order mark and the `\\r` of CRLF endings are dropped; a blank line or a
    byte that is not UTF-8 is an error naming its line. Lines before `start` are checked too.
    """
    path = Path(path)
    _check_file(path)
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise BertflowError(
                    f"{path} is not UTF-8 text (bad byte on line {number})") from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            line = line.removesuffix("\n").removesuffix("\r")
            if not line.strip():
                raise BertflowError(f"{path} line {number} is blank: expected one sentence "
                                    "per line")
            if number > start:
                yield line


def check_finite(array: np.ndarray, what: str, chunk: int = 65536, offset: int = 0) -> None:
    """Raise naming the first row of `array` (numbered from `offset`) that holds a NaN or an
    infinity."""
    for start in range(0, array.shape[0], chunk):
        block = np.asarray(array[start : start + chunk])
        bad = ~np.isfinite(block)
        if bad.any():
            row = offset + start + int(np.argwhere(bad)[0][0])
            kinds = sorted({"NaN" if np.isnan(v) else "inf" for v in block[bad][:100]})
            raise BertflowError(f"{what} holds {'/'.join(kinds)} values (first in row {row})")


def meta_path(npy: str | os.PathLike) -> Path:
    """The sidecar of an embeddings file: `emb.npy` -> `emb.meta.json`."""
    npy = Path(npy)
    return npy.with_name(npy.name.removesuffix(".npy") + ".meta.json")


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    data = _read_bytes(path)
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BertflowError(f"{path} is not valid JSON ({first_line(e)})") from None
    if not isinstance(value, dict):
        raise BertflowError(f"{path} is not a JSON object")
    return value


def write_json(path: str | os.PathLike, value: Any) -> None:
    with atomic_file(Path(path)) as tmp:
        tmp.write_text(json.dumps(value, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_file(path: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it replaces `path` in one step.

    On Linux the swap is a single `renameat2(RENAME_EXCHANGE)`, so a process killed at any
    moment leaves either the old folder or the new one at `path`, never neither.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise BertflowError(f"{path} exists and is not a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        _replace_directory(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _replace_directory(new: Path, target: Path) -> None:
    if not target.exists():
        os.rename(new, target)
    elif not _exchange(new, target):
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.rename(target, old / target.name)
        os.rename(new, target)
        shutil.rmtree(old, ignore_errors=True)
    # after an exchange `new` holds the old folder; the caller removes it


def _exchange(a: Path, b: Path) -> bool:
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _read_bytes(path: Path) -> bytes:
    _check_file(path)
    return path.read_bytes()


def _check_file(path: Path) -> None:
    if not path.exists():
        raise BertflowError(f"no such file: {path}")
    if not path.is_file():
        raise BertflowError(f"{path} is not a file")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_replaceable(path: str | os.PathLike, config: str, fmt: str, what: str) -> Path:
    """`path` if a folder of kind `what` may be written there: absent, empty, or already one
    (its `config` JSON names format `fmt`). Anything else is left alone."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise BertflowError(f"{path} exists and is not a folder")
    if path.is_dir() and any(path.iterdir()):
        try:
            ours = read_json(path / config).get("format") == fmt
        except BertflowError:
            ours = False
        if not ours:
            raise BertflowError(f"{path} is a non-empty folder but not {what}; not replacing it")
    return path
