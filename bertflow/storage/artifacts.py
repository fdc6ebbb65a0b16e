"""Every kind of file and folder bertflow writes, described once: its kind (the stamp a record
carries), its format version, its files and how one is recognised. A description says where one
may be written (`check_destination`: nothing there, or one of its kind, replaced; never a user's
file or folder), checks a record's stamp (`check`), and `identify` tells what any path holds.

A folder (`FolderFormat`) is written atomically with a `manifest.json` of its kind and every
file's sha256; a non-empty folder without one listing everything in it is the user's. A file
(`FileFormat`) is recognised by its record: its own contents, or its `.meta.json` sidecar."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import BertflowError
from .files import atomic_directory, meta_path, read_json, refuse_link, sha256_file, write_json

__all__ = ["CHECKPOINT", "EMBEDDINGS", "EXPORT_MARKER", "HEAD_FOLDER", "INDEX_FOLDER",
           "MANIFEST", "MTEB_RESULT", "ONNX_EXPORT", "ONNX_PIPELINE_FOLDER", "PIPELINE_FOLDER",
           "PLOTS_FOLDER", "PROGRESS", "PT2_EXPORT", "ROWS", "TRANSFORMED", "FileFormat",
           "FolderFormat", "counts", "identify", "mteb_file", "write_manifest"]

MANIFEST = "manifest.json"
_FORMAT = "bertflow-manifest"
EXPORT_MARKER = "bertflow_head"  # a graph's ONNX metadata property, and its .pt2 extra file


@dataclass(frozen=True)
class _Format:
    """What every kind shares: `kind` (its records' "format"), `name` and `noun` in messages
    ("a flow head", "head"), `version` (its records' "format_version"; None: unversioned)."""

    kind: str
    name: str
    noun: str
    version: int | None = None

    def stamp(self) -> dict[str, Any]:
        """The fields that mark a record as one of this kind."""
        return {"format": self.kind, "format_version": self.version}

    def check(self, record: Any, where: str | os.PathLike, advice: str = "") -> dict[str, Any]:
        """`record` if it carries this kind's stamp and version; else a one-line refusal."""
        if not isinstance(record, dict) or record.get("format") != self.kind:
            raise BertflowError(f"{where} is not {self.name}")
        if record.get("format_version") != self.version:
            raise BertflowError(f"{where} has {self.noun} format version "
                                f"{record.get('format_version')}; this bertflow reads version "
                                f"{self.version}{advice}")
        return record


def counts(record: dict[str, Any], *keys: str) -> tuple[int, ...]:
    """The fields `keys` of a record (a width, a number of rows), each a positive integer: a
    32.9, a 0, a true or a "32" is a ValueError naming the field (its reader names the file)."""
    for key in keys:
        if type(record[key]) is not int or record[key] < 1:
            raise ValueError(f"{key} must be a positive integer, got {record[key]!r}")
    return tuple(record[key] for key in keys)


def write_manifest(folder: Path, kind: str) -> None:
    """List every file under `folder` with its sha256 in `manifest.json`, sorted by name."""
    files = {name: sha256_file(folder / name) for name in sorted(_files(folder))
             if name != MANIFEST}
    write_json(folder / MANIFEST, {"format": _FORMAT, "kind": kind, "files": files})


@dataclass(frozen=True)
class FolderFormat(_Format):
    """One kind of artifact folder: its manifest names `kind`; `config` is its record's file
    (None: the manifest is its record); `files` are those it may hold, where they are fixed."""

    config: str | None = None
    files: tuple[str, ...] = ()

    def check_destination(self, path: str | os.PathLike) -> Path:
        """`path` if absent, empty, or a folder of this kind holding only what it lists."""
        path = Path(path)
        if path.name in ("", ".", "..") or _holds_working_folder(path):
            raise BertflowError(f"{path} is the current folder or one of its parents; "
                                "give a folder of its own")
        refuse_link(path)
        if path.exists() and not path.is_dir():
            raise BertflowError(f"{path} exists and is not a folder")
        present = _files(path) if path.is_dir() else set()
        if not present:
            return path
        try:
            manifest = _manifest(path)
        except BertflowError:
            manifest = {}
        other = manifest.get("kind")
        if other != self.kind:
            what = f"{_name(str(other))}, not" if other else "a non-empty folder but not"
            raise BertflowError(f"{path} is {what} {self.name}; not replacing it")
        foreign = sorted(present - set(manifest["files"]) - {MANIFEST})
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more"
                                              if len(foreign) > 5 else "")
            raise BertflowError(f"{path} holds files that are not part of {self.name}: {shown}; "
                                "not replacing it")
        return path

    def write(self, path: str | os.PathLike, fill: Callable[[Path], Any]) -> Path:
        """Write a folder of this kind at `path` atomically, `fill(tmp)` writing its files."""
        path = self.check_destination(path)
        with atomic_directory(path, recheck=self.check_destination) as tmp:
            fill(tmp)
            write_manifest(tmp, self.kind)
        return path

    def verify(self, path: str | os.PathLike) -> dict[str, bytes] | None:
        """The bytes of every file the manifest lists, by name (`load`); None without one."""
        verified = self._verified(Path(path))
        return None if verified is None else verified[1]

    def load(self, path: str | os.PathLike, within: Mapping[str, bytes] | None = None,
             ) -> tuple[dict[str, Any], dict[str, bytes]]:
        """The record of the folder at `path` (its config, else its manifest), its stamp
        checked, and the bytes of every file its manifest lists, each file read once and
        checked against its checksum: what a loader parses are the bytes checked, never a file
        opened again by path, so that a folder replaced meanwhile is refused, not read half old
        and half new. `within` holds the folder's files, already read and checked (a folder
        inside another), by their names in the folder."""
        path = Path(path)
        verified = self._verified(path, within)
        if verified is None:
            raise BertflowError(f"{path} has no {MANIFEST}: the {self.noun} is incomplete or "
                                "altered")
        manifest, files = verified
        if self.config is None:
            return manifest, files
        if self.config not in files:
            raise BertflowError(f"{path} is missing {self.config}, which its manifest lacks")
        return self.check(read_json(path / self.config, files[self.config]), path), files

    def _verified(self, path: Path, within: Mapping[str, bytes] | None = None,
                  ) -> tuple[dict[str, Any], dict[str, bytes]] | None:
        if not ((path / MANIFEST).is_file() if within is None else MANIFEST in within):
            return None
        manifest = _manifest(path, None if within is None else within[MANIFEST])
        if manifest.get("kind") != self.kind:
            raise BertflowError(f"{path} is {_name(str(manifest.get('kind')))}, not {self.name}")
        files = {}
        for name, digest in manifest["files"].items():
            file = path / str(name)
            if Path(name).is_absolute() or ".." in Path(name).parts or file.is_symlink():
                raise BertflowError(f"{path / MANIFEST} lists a file outside the folder: {name}")
            data = _read_file(file) if within is None else within.get(str(name))
            if data is None:
                raise BertflowError(f"{path} is missing {name}, which its manifest lists")
            if hashlib.sha256(data).hexdigest() != digest:
                raise BertflowError(f"{file} does not match the checksum in {MANIFEST}: "
                                    "altered or truncated (or replaced as it was read)")
            files[str(name)] = data
        return manifest, files

    def read(self, path: str | os.PathLike) -> dict[str, Any]:
        """The record of the folder at `path` (`load`'s)."""
        return self.load(path)[0]


@dataclass(frozen=True)
class FileFormat(_Format):
    """One kind of artifact file: `suffix` is how its name ends (None: any), `option` the option
    that names it. `read(path)` gives its record (of its sidecar, with `sidecar`), and
    `recognise(record)` whether that is one of this kind (the stamp's kind, by default, or one
    in `replaces`, the kinds a file of this kind may replace); a failure to read says no."""

    suffix: str | None = None
    read: Callable[[Path], Any] = read_json
    recognise: Callable[[Any], bool] | None = None
    sidecar: bool = False
    replaces: tuple[str, ...] = ()
    option: str = "--out"

    def record(self, path: str | os.PathLike, exact: bool = False) -> Any:
        """The record of the file at `path` if it is one of this kind (or, unless `exact`, of a
        kind it `replaces`); else None. A file that cannot be read at all is an `OSError`."""
        path = Path(path)
        try:
            record = self.read(meta_path(path) if self.sidecar else path)
            if self.recognise is not None:
                return record if self.recognise(record) else None
            kinds = (self.kind,) if exact else (self.kind, *self.replaces)
            return record if isinstance(record, dict) and record.get("format") in kinds else None
        except OSError:
            raise
        except Exception:  # noqa: BLE001 - a file of any kind, read as this one
            return None

    def check_destination(self, path: str | os.PathLike) -> Path:
        """`path` if nothing is there (nor its sidecar) or a file of this kind; a folder, a link
        or another file is refused."""
        path = Path(path)
        if self.suffix is not None and path.suffix != self.suffix:
            raise BertflowError(f"{self.option} {path} must end in {self.suffix}")
        if path.is_dir():
            raise BertflowError(f"{self.option} {path} is a folder")
        refuse_link(path)
        if not self.sidecar:
            if path.exists() and self.record(path) is None:
                raise BertflowError(f"{path} exists and is not {self.name}; not replacing it")
            return path
        sidecar = meta_path(path)
        if sidecar.is_symlink():
            raise BertflowError(f"{sidecar} is a symbolic link; writing {path} would replace "
                                "it: remove it or write elsewhere")
        if sidecar.exists() and self.record(path) is None:
            beside = f" nor {path.name}" if path.exists() else ""
            raise BertflowError(f"{sidecar} exists and is not a bertflow sidecar; not replacing "
                                f"it{beside}")
        if path.exists() and not sidecar.exists():
            raise BertflowError(f"{path} exists and is not a bertflow output (no "
                                f"{sidecar.name}); not replacing it")
        return path


def identify(path: str | os.PathLike) -> tuple[FolderFormat | FileFormat, Any]:
    """What bertflow wrote at `path`: the kind's description and its record (a folder's config
    or manifest, a file's sidecar or contents). Anything else is refused in one line."""
    path = Path(path)
    if path.is_dir():
        try:
            kind = _manifest(path).get("kind")
        except BertflowError:
            kind = None
        if kind not in _FOLDERS:
            raise BertflowError(f"{path} is not a folder bertflow wrote (no bertflow manifest)")
        return _FOLDERS[kind], _FOLDERS[kind].read(path)
    if not path.is_file():
        raise BertflowError(f"no such file or folder: {path}")
    for kind in _FILES:
        record = kind.record(path, exact=True) if kind.suffix in (None, path.suffix) else None
        if record is not None:  # a stamped record's version checked too
            where = meta_path(path) if kind.sidecar else path
            return kind, record if kind.recognise else kind.check(record, where)
    raise BertflowError(f"{path} is not a file bertflow wrote")


def _name(kind: str) -> str:
    return _FOLDERS[kind].name if kind in _FOLDERS else f"a {kind} folder"


def _manifest(path: Path, data: bytes | None = None) -> dict[str, Any]:
    """The manifest of `path` (or its bytes, `data`), checked to be a bertflow one."""
    manifest = read_json(path / MANIFEST, data)
    if manifest.get("format") != _FORMAT or not isinstance(manifest.get("files"), dict):
        raise BertflowError(f"{path / MANIFEST} is not a bertflow manifest")
    return manifest


def _read_file(file: Path) -> bytes | None:
    """The bytes of `file`, or None where no file is."""
    try:
        return file.read_bytes() if file.is_file() else None
    except FileNotFoundError:
        return None


def _files(folder: Path) -> set[str]:
    """Every entry under `folder` that is not a folder, as paths relative to it."""
    found = set()
    for root, dirs, names in os.walk(folder):
        base = Path(root).relative_to(folder)
        found.update((base / name).as_posix() for name in names)
        found.update((base / d).as_posix() for d in dirs if (Path(root) / d).is_symlink())
    return found


def _holds_working_folder(path: Path) -> bool:
    try:
        here, there = Path.cwd().resolve(), path.resolve()
    except OSError:
        return False
    return here == there or there in here.parents


def _are_rows(rows: Any) -> bool:
    """Rows of `bertflow eval` (a list): STS (task, aggregation, spearman) or retrieval (task,
    split, ndcg_at_10)."""
    return isinstance(rows, list) and bool(rows) and all(
        isinstance(row, dict) and ({"task", "aggregation", "spearman"} <= row.keys()
                                   or {"task", "split", "ndcg_at_10"} <= row.keys())
        for row in rows)


def _is_mteb(result: Any, task: str | None = None) -> bool:
    """An MTEB result file (of `task`, MTEB's name for it, where given)."""
    return isinstance(result, dict) and isinstance(result.get("scores"), dict) \
        and isinstance(result.get("task_name"), str) and task in (None, result["task_name"])


def mteb_file(task: str) -> FileFormat:
    """MTEB's result file of `task` (MTEB's name for it)."""
    return replace(MTEB_RESULT, name=f"{MTEB_RESULT.name} of {task}",
                   recognise=functools.partial(_is_mteb, task=task))


def _onnx_head(path: Path) -> Any:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return json.loads({p.key: p.value for p in model.metadata_props}[EXPORT_MARKER])


def _pt2_head(path: Path) -> Any:
    """A .pt2's head config, read as a zip: `torch.export.load` would unpickle it."""
    with zipfile.ZipFile(path) as archive:
        name, = (n for n in archive.namelist()
                 if n.split("/", 1)[-1] == f"extra/{EXPORT_MARKER}.json")
        return json.loads(archive.read(name).decode("utf-8"))


def _checkpoint(path: Path) -> dict[str, Any] | None:
    """A training checkpoint's saved dict, read with `weights_only=True` where its one pickle
    names the kind; None for another file."""
    with open(path, "rb") as f:
        if not zipfile.is_zipfile(f):
            return None
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pickles) != 1 or CHECKPOINT.kind.encode() not in archive.read(pickles[0]):
            return None  # someone else's torch file: not worth loading
    import torch

    saved = torch.load(path, map_location="cpu", weights_only=True)
    return saved if isinstance(saved, dict) and isinstance(saved.get("run"), dict) else None


HEAD_FOLDER = FolderFormat("bertflow-head", "a flow head", "head", 2, "config.json",
                           ("config.json", "model.safetensors"))
INDEX_FOLDER = FolderFormat("bertflow-index", "an index", "index", 3, "config.json")
ONNX_PIPELINE_FOLDER = FolderFormat("bertflow-onnx-pipeline", "a bertflow ONNX pipeline",
                                    "ONNX pipeline", 1, "bertflow_onnx.json")
PIPELINE_FOLDER = FolderFormat("bertflow-pipeline", "a bertflow sentence-transformers export",
                               "sentence-transformers export")
PLOTS_FOLDER = FolderFormat("bertflow-plots", "a folder of bertflow plots", "plots", files=(
    "spectrum.png", "cosines.png", "token_norms.png", "projection.png", "alignment_uniformity.png",
    "token_projection.png", "token_spectrum.png"))
EMBEDDINGS = FileFormat("bertflow-embeddings", "a bertflow embeddings record", "embeddings", 2,
                        ".npy", sidecar=True, replaces=("bertflow-transformed",))
TRANSFORMED = FileFormat("bertflow-transformed", "a record of vectors a head transformed",
                         "transformed vectors", 1, ".npy", sidecar=True)
PROGRESS = FileFormat("bertflow-embeddings-progress", "a bertflow progress record",
                      "progress record", suffix=".json")
CHECKPOINT = FileFormat("bertflow-train-state", "a bertflow training checkpoint",
                        "training checkpoint", 2, read=_checkpoint, option="--checkpoint")
ROWS = FileFormat("bertflow-rows", "rows written by bertflow eval", "eval rows",
                  read=lambda path: json.loads(path.read_bytes()), recognise=_are_rows)
MTEB_RESULT = FileFormat("mteb-result", "MTEB's result file", "MTEB result", None, ".json",
                         recognise=_is_mteb, option="--mteb")
ONNX_EXPORT = FileFormat("bertflow-onnx", "a bertflow export", "ONNX export", None, ".onnx",
                         read=_onnx_head, recognise=lambda c: HEAD_FOLDER.kind == c.get("format"))
PT2_EXPORT = FileFormat("bertflow-pt2", "a bertflow export", "torch.export program", None,
                        ".pt2", read=_pt2_head, recognise=ONNX_EXPORT.recognise)
_FOLDERS = {f.kind: f for f in (HEAD_FOLDER, INDEX_FOLDER, PIPELINE_FOLDER, ONNX_PIPELINE_FOLDER,
                                 PLOTS_FOLDER)}
_FILES = (EMBEDDINGS, TRANSFORMED, CHECKPOINT, PROGRESS, ROWS, MTEB_RESULT, ONNX_EXPORT, PT2_EXPORT)
