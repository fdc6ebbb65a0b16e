"""Where an artifact may be written: a folder (`FolderFormat`) is written atomically with a
`manifest.json` of its kind and every file's sha256, and a non-empty folder without one listing
everything in it is the user's, never replaced; a file (`FileFormat`) replaces only a file of
its kind."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BertflowError
from .files import atomic_directory, read_json, refuse_link, sha256_file, write_json

__all__ = ["HEAD_FOLDER", "INDEX_FOLDER", "MANIFEST", "PIPELINE_FOLDER", "PLOTS_FOLDER",
           "FileFormat", "FolderFormat", "write_manifest"]

MANIFEST = "manifest.json"
_FORMAT = "bertflow-manifest"


def write_manifest(folder: Path, kind: str) -> None:
    """List every file under `folder` with its sha256 in `manifest.json`, sorted by name."""
    files = {name: sha256_file(folder / name) for name in sorted(_files(folder))
             if name != MANIFEST}
    write_json(folder / MANIFEST, {"format": _FORMAT, "kind": kind, "files": files})


@dataclass(frozen=True)
class FolderFormat:
    """One kind of artifact folder: `kind` names it in its manifest and its `config` file;
    `name` and `noun` in messages; `files` are those it may hold, where they are fixed."""

    kind: str
    name: str
    noun: str
    version: int | None = None
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

    def verify(self, path: str | os.PathLike) -> dict[str, str] | None:
        """Check every file the manifest lists and return the listing; None without one."""
        path = Path(path)
        if not (path / MANIFEST).is_file():
            return None
        manifest = _manifest(path)
        if manifest.get("kind") != self.kind:
            raise BertflowError(f"{path} is {_name(str(manifest.get('kind')))}, not {self.name}")
        for name, digest in manifest["files"].items():
            file = path / str(name)
            if Path(name).is_absolute() or ".." in Path(name).parts or file.is_symlink():
                raise BertflowError(f"{path / MANIFEST} lists a file outside the folder: {name}")
            if not file.is_file():
                raise BertflowError(f"{path} is missing {name}, which its manifest lists")
            if sha256_file(file) != digest:
                raise BertflowError(f"{file} does not match the checksum in {MANIFEST}: "
                                    "altered or truncated")
        return {str(k): str(v) for k, v in manifest["files"].items()}

    def read(self, path: str | os.PathLike) -> dict[str, Any]:
        """The config of the folder at `path`, after checking the manifest, format and version."""
        path = Path(path)
        if self.verify(path) is None:
            raise BertflowError(f"{path} has no {MANIFEST}: the {self.noun} is incomplete or "
                                "altered")
        config = read_json(path / str(self.config))
        if config.get("format") != self.kind:
            raise BertflowError(f"{path / str(self.config)} is not a bertflow {self.noun} config")
        version = config.get("format_version")
        if version != self.version:
            raise BertflowError(f"{path} has {self.noun} format version {version}; this "
                                f"bertflow reads version {self.version}")
        return config


@dataclass(frozen=True)
class FileFormat:
    """One kind of artifact file: `name` says it in messages, `recognise(path)` whether a file
    is one (a failure to read it says no), `suffix` how its name ends (None: any), `option`
    the option that names it."""

    name: str
    recognise: Callable[[Path], bool]
    suffix: str | None = None
    option: str = "--out"

    def check_destination(self, path: str | os.PathLike) -> Path:
        """`path` if absent or a file of this kind; a folder, a link or another file is
        refused."""
        path = Path(path)
        if self.suffix is not None and path.suffix != self.suffix:
            raise BertflowError(f"{self.option} {path} must end in {self.suffix}")
        if path.is_dir():
            raise BertflowError(f"{self.option} {path} is a folder")
        refuse_link(path)
        if path.exists() and not self._recognised(path):
            raise BertflowError(f"{path} exists and is not {self.name}; not replacing it")
        return path

    def _recognised(self, path: Path) -> bool:
        try:
            return bool(self.recognise(path))
        except Exception:  # noqa: BLE001 - a file of any kind, read as this one
            return False


def _name(kind: str) -> str:
    return _FORMATS[kind].name if kind in _FORMATS else f"a {kind} folder"


def _manifest(path: Path) -> dict[str, Any]:
    """The manifest of `path`, checked to be a bertflow one."""
    manifest = read_json(path / MANIFEST)
    if manifest.get("format") != _FORMAT or not isinstance(manifest.get("files"), dict):
        raise BertflowError(f"{path / MANIFEST} is not a bertflow manifest")
    return manifest


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


HEAD_FOLDER = FolderFormat("bertflow-head", "a flow head", "head", 2, "config.json")
INDEX_FOLDER = FolderFormat("bertflow-index", "an index", "index", 3, "config.json")
PIPELINE_FOLDER = FolderFormat("bertflow-pipeline", "a bertflow sentence-transformers export",
                               "sentence-transformers export")
PLOTS_FOLDER = FolderFormat("bertflow-plots", "a folder of bertflow plots", "plots", files=(
    "spectrum.png", "cosines.png", "token_norms.png", "projection.png", "alignment_uniformity.png",
    "token_projection.png", "token_spectrum.png"))
_FORMATS = {f.kind: f for f in (HEAD_FOLDER, INDEX_FOLDER, PIPELINE_FOLDER, PLOTS_FOLDER)}
