"""Reading user files with clear errors, and writing files and folders atomically."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BertflowError, first_line

__all__ = ["Checked", "Recheck", "atomic_directory", "atomic_file", "check_finite", "check_outputs",
           "disk_errors", "fsync", "identity", "iter_sentences", "meta_path", "parse_json",
           "read_json", "read_sentences", "refuse_link", "remove_stale_temporaries", "sha256_file",
           "write_json"]


# `atomic_file`'s last check, `recheck(path, tmp)`: it raises to keep what is at `path`
Recheck = Callable[[Path, Path], object]


def read_sentences(path: str | os.PathLike) -> list[str]:
    """One sentence per line of a UTF-8 text file; an empty file or a blank line is an error."""
    sentences = list(iter_sentences(path))
    if not sentences:
        raise BertflowError(f"{path} is empty: expected one sentence per line")
    return sentences


def iter_sentences(path: str | os.PathLike, start: int = 0, blank_ok: bool = False,
                   what: str = "one sentence") -> Iterator[str]:
    """The sentences of a UTF-8 text file, read lazily from sentence `start` on (earlier lines
    are checked too), a leading byte-order mark dropped; a blank line (unless `blank_ok`: the
    file holds `what` per line) or a byte that is not UTF-8 is an error naming its line. Only
    `\\n`, `\\r\\n`, `\\r` end lines."""
    path = _check_file(path)
    with open(path, "rb") as f:
        for number, raw in enumerate(_raw_lines(f), start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise BertflowError(
                    f"{path} is not UTF-8 text (bad byte on line {number})") from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            if not line.strip() and not blank_ok:
                raise BertflowError(f"{path} line {number} is blank: expected {what} per line")
            if number > start:
                yield line


_NEWLINE = re.compile(rb"\r\n|\r|\n")
_BLOCK_SIZE = 1 << 20


def _raw_lines(f: Any) -> Iterator[bytes]:
    """The lines of binary file `f`, their endings dropped, read `_BLOCK_SIZE` bytes at
    a time. Cutting bytes is safe: no UTF-8 multibyte sequence holds a `\\r` or `\\n` byte."""
    tail = b""
    for block in iter(lambda: f.read(_BLOCK_SIZE), b""):
        data = tail + block
        # a block may end between the two bytes of a \r\n: keep a last \r for the next one
        end = len(data) - data.endswith(b"\r")
        *lines, tail = _NEWLINE.split(data[:end])
        tail += data[end:]
        yield from lines
    if tail:  # a last line, its ending (a \r at most) optional
        yield tail.removesuffix(b"\r")


def check_finite(array: np.ndarray, what: str, chunk: int = 65536, offset: int = 0) -> None:
    """Refuse `array`, naming its first row (from `offset`) that holds a NaN or an infinity."""
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


def read_json(path: str | os.PathLike, data: bytes | None = None) -> dict[str, Any]:
    """The JSON object in file `path`, or in `data` (its bytes, already read)."""
    if data is None:
        path = _check_file(path)
        data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BertflowError(f"{path} is not valid JSON ({first_line(e)})") from None
    value = parse_json(text, str(path))
    if not isinstance(value, dict):
        raise BertflowError(f"{path} is not a JSON object")
    return value


def parse_json(text: str, where: str) -> Any:
    """The JSON value of `text`, refused in one line naming `where` where it is not JSON or
    holds an integer longer than Python converts (`sys.get_int_max_str_digits`)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BertflowError(f"{where} is not valid JSON ({first_line(e)})") from None
    except ValueError:  # int() of too many digits
        raise BertflowError(f"{where} holds an integer of over {sys.get_int_max_str_digits()} "
                            "digits") from None


def write_json(path: str | os.PathLike, value: Any, recheck: Recheck | None = None) -> None:
    """Write `value` as JSON to `path` atomically (`atomic_file`, with its `recheck`)."""
    with atomic_file(Path(path), recheck=recheck) as tmp:
        tmp.write_text(json.dumps(value, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_file(path: Path, suffix: str = ".tmp",
                recheck: Recheck | None = None) -> Iterator[Path]:
    """Yield a temporary file beside `path`; if the block succeeds, flush it, rename it onto
    `path` and flush the folder: `path` holds the old file or the whole new one, even after a
    power loss. `recheck(path, tmp)`, just before the rename, keeps what is there by raising."""
    path = Path(path)
    refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, name = tempfile.mkstemp(prefix=_temporary_prefix(path), suffix=suffix, dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)
    os.close(fd)
    tmp = Path(name)
    try:
        with disk_errors(f"writing {path}"):
            yield tmp
            fsync(tmp)
        if recheck is not None:
            recheck(path, tmp)
        os.replace(tmp, path)
        fsync(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def identity(path: str | os.PathLike) -> tuple[int, int, int, int] | None:
    """What is at `path` now (not following a link): its device, inode, size and modification
    time, or None where nothing is."""
    try:
        s = os.lstat(path)
    except FileNotFoundError:
        return None
    return s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns


class Checked:
    """An output that `check(path)` (raising where not) says may be replaced, checked when made,
    noting what is at `path` and `also` (files the check reads: a sidecar) in `seen`, `path`'s
    first. As `atomic_file`'s recheck it checks again where any changed meanwhile, until none
    did: only a file made between that last look and the rename is replaced unchecked."""

    def __init__(self, path: str | os.PathLike, check: Callable[[Path], object],
                 also: Collection[str | os.PathLike] = ()):
        self.path, self.check = Path(path), check
        self.watched = (self.path, *map(Path, also))
        self.seen = self._now()
        check(self.path)

    def __call__(self, renamed: Path, placed: Path) -> None:
        """Check `path` again where anything watched changed; `placed` then replaces `renamed`."""
        now = self._now()
        while now != self.seen:
            self.check(self.path)
            self.seen, now = now, self._now()
        self.seen[self.watched.index(Path(renamed))] = identity(placed)  # kept by the rename

    def _now(self) -> list[tuple[int, int, int, int] | None]:
        return [identity(p) for p in self.watched]


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike,
                     recheck: Callable[[Path], object] | None = None) -> Iterator[Path]:
    """Yield an empty temporary folder that, on success, replaces the folder (or nothing) at
    `path`, checked by the caller, in one step: on Linux one `renameat2(RENAME_EXCHANGE)`, so
    that a kill at any moment leaves the old folder or the new one, even after a power loss (the
    new folder's files are flushed first). `recheck(path)` decides whether a folder another
    process made meanwhile may be replaced."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = Path(tempfile.mkdtemp(prefix=_temporary_prefix(path), suffix=".tmp", dir=path.parent))
    try:
        with disk_errors(f"writing {path}"):
            yield tmp
            for written in [*tmp.rglob("*"), tmp]:  # rglob enters no linked folder
                if not written.is_symlink():
                    fsync(written)
        os.chmod(tmp, 0o777 & ~_UMASK)
        _replace_directory(tmp, path, recheck)
        fsync(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _replace_directory(new: Path, target: Path, recheck: Callable[[Path], object] | None) -> None:
    """Put folder `new` at `target`; after an exchange `new` holds the old folder."""
    if not target.exists():
        try:
            os.rename(new, target)
            return
        except OSError as e:  # another process made `target` since it was checked
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    if recheck is not None:  # what is there now may not be what was checked at the start
        recheck(target)
    if not _exchange(new, target):
        old = new.with_suffix(".old")  # named as a temporary: removed if this process dies
        os.rename(target, old)
        os.rename(new, target)
        shutil.rmtree(old, ignore_errors=True)


def fsync(path: str | os.PathLike) -> None:
    """Flush the file or folder `path` to the disk (a folder: the names in it). A file system
    that cannot flush folders is let be."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP) or not os.path.isdir(path):
            raise
    finally:
        os.close(fd)


def refuse_link(path: Path) -> None:
    """Refuse to write over a symbolic link: replacing it would not write where it points."""
    if path.is_symlink():
        raise BertflowError(f"{path} is a symbolic link; give the path it points to")


@contextlib.contextmanager
def disk_errors(doing: str) -> Iterator[None]:
    """Make a failure for want of space inside the block one line: "... while `doing`". Some
    writers (FAISS, tokenizers) report it only in words."""
    try:
        yield
    except BertflowError:
        raise
    except Exception as e:
        code, text = getattr(e, "errno", None), str(e)
        if code == errno.EFBIG or "File too large" in text or "os error 27" in text:
            raise BertflowError(f"file too large (a file size limit) while {doing}") from None
        if (code in (errno.ENOSPC, errno.EDQUOT)
                or any(word in text for word in ("No space left", "os error 28", "Disk quota"))
                or ("fwrite" in text and "written" in text)):
            raise BertflowError(f"no space left on the device while {doing}") from None
        raise


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary files and folders that writes of `path` by processes of this
    machine that no longer run left beside it; nothing else."""
    name, host = re.escape(path.name), re.escape(_HOST)
    pattern = re.compile(rf"\.{name}\.(\d+)@{host}\.[a-z0-9_]{{8}}\.")
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}@{_HOST}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:  # another user's process is alive, but not ours to signal
        return not isinstance(e, ProcessLookupError)
    return True


_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


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


def _check_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.exists():
        raise BertflowError(f"no such file: {path}")
    if not path.is_file():
        raise BertflowError(f"{path} is not a file")
    return path


_UMASK = os.umask(0)  # read once, at import: reading it sets it, which races with threads
os.umask(_UMASK)


def check_outputs(outputs: Mapping[str, str | os.PathLike | None], inputs: Mapping[str, Any],
                  grows: Mapping[str, Collection[str]] | None = None) -> None:
    """Refuse, before any work and in one line naming both, an output that is one of `inputs`
    (also through a link), lies inside one or holds one; and two outputs that overlap so, except
    where `grows` maps an output folder the command only adds to (a log folder) to the outputs
    that may lie inside it. Paths are named by option or role (``--out``, ``the corpus``); an
    input may be a list; a `.npy` stands with its sidecar; None is left out."""
    given_outputs, given_inputs = _with_sidecars(outputs), _with_sidecars(inputs)
    for i, (flag, out) in enumerate(given_outputs):
        others = [(name, path, "an input") for name, path in given_inputs]
        others += [(name, path, "another output") for name, path in given_outputs[i + 1:]]
        for name, other, role in others:
            relation = _overlap(out, other)
            folder, inside = (flag, name) if relation == "holds" else (name, flag)
            if (role == "another output" and relation in ("holds", "is inside")
                    and inside in (grows or {}).get(folder, ())):
                continue
            if relation is not None:
                raise BertflowError(f"{flag} {out} {relation} {role} of this command ({name} "
                                    f"{other}); give {flag} a path of its own")


def _with_sidecars(paths: Mapping[str, Any]) -> list[tuple[str, Path]]:
    """(name, path) of each path given (a list: each path) and of each `.npy`'s sidecar."""
    named = [(name, Path(path)) for name, value in paths.items() if value is not None
             for path in (value if isinstance(value, (list, tuple)) else [value])]
    return [*named, *((f"{name}'s sidecar", meta_path(path)) for name, path in named
                      if path.suffix == ".npy")]


def _overlap(a: Path, b: Path) -> str | None:
    """How path `a` overlaps path `b`: it "is" `b`, "is inside" it, or "holds" it; else None."""
    a, b = _resolved(a), _resolved(b)
    with contextlib.suppress(OSError):
        if a == b or os.path.samefile(a, b):
            return "is"
    if b in a.parents:
        return "is inside"
    if a in b.parents:
        return "holds"
    return None


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a loop of symbolic links
        return path.absolute()
