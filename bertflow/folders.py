"""Artifact folders (a head, an index, a pipeline, plots): one protocol for all of them.

A folder is written atomically (a new folder, swapped in whole) with `manifest.json`, which
names its kind and lists every file (sub-folders included) with its sha256, so an edited config
is caught as surely as altered weights. A folder that holds anything its manifest does not list
is the user's, and no write replaces it. A kind that has a config file records its format and
format version there; reading checks the manifest, then the format and version, and refuses a
folder of a versioned format that lost its manifest. `FolderFormat` bundles all of this for one
kind; `HEAD_FOLDER`, `INDEX_FOLDER`, `PIPELINE_FOLDER` and `PLOTS_FOLDER` are bertflow's.
"""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BertflowError
from .files import atomic_directory, read_json, refuse_link, sha256_file, write_json

__all__ = ["HEAD_FOLDER", "INDEX_FOLDER", "MANIFEST", "PIPELINE_FOLDER", "PLOTS_FOLDER",
           "FolderFormat", "check_destination", "head_folder", "legacy_files", "ready_heads",
           "verify_checksums", "verify_folder", "write_folder", "write_manifest"]

MANIFEST = "manifest.json"
_FORMAT = "bertflow-manifest"

# What a folder written before manifests existed holds, by kind: its own files, or None if
# `folder` is not one. Used only to decide whether such a folder may be replaced.
Legacy = Callable[[Path], "set[str] | None"]


def legacy_files(config: str, fmt: str, files: set[str]) -> Legacy:
    """The `Legacy` rule of a kind whose folders, before manifests, were recognised by the
    `format` their `config` JSON names, and held `files` (some of them may be absent)."""

    def own(folder: Path) -> set[str] | None:
        try:
            return set(files) if read_json(folder / config).get("format") == fmt else None
        except BertflowError:
            return None

    return own


def write_folder(path: str | os.PathLike, kind: str, fill: Callable[[Path], Any],
                 legacy: Legacy | None = None) -> Path:
    """Write folder `path` of `kind` atomically: `fill(tmp)` writes the files into a new
    folder, the manifest is added, and the folder is swapped in for `path`, which must be free,
    empty or a folder of this kind holding only its own files (checked first, and again if
    another process made `path` meanwhile)."""
    path = check_destination(path, kind, legacy)
    with atomic_directory(path, recheck=lambda p: check_destination(p, kind, legacy)) as tmp:
        fill(tmp)
        write_manifest(tmp, kind)
    return path


def write_manifest(folder: Path, kind: str) -> None:
    """List every file under `folder` (but the manifest) with its sha256 in `manifest.json`, in
    the order of their names: the same folder gives the same bytes."""
    files = {name: sha256_file(folder / name) for name in sorted(_files(folder))
             if name != MANIFEST}
    write_json(folder / MANIFEST, {"format": _FORMAT, "kind": kind, "files": files})


def verify_folder(path: str | os.PathLike, kind: str) -> dict[str, str] | None:
    """Check every file the manifest of `path` lists against its sha256 and return the listing,
    or None when the folder has no manifest (written before manifests; the caller decides)."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        return None
    manifest = read_json(path / MANIFEST)
    files = manifest.get("files")
    if manifest.get("format") != _FORMAT or not isinstance(files, dict):
        raise BertflowError(f"{path / MANIFEST} is not a bertflow manifest")
    if manifest.get("kind") != kind:
        raise BertflowError(f"{path} is {_name(str(manifest.get('kind')))}, not {_name(kind)}")
    return verify_checksums(path, files, MANIFEST)


def verify_checksums(path: Path, files: Mapping[str, str],
                     listing: str = "config.json") -> dict[str, str]:
    """Check each file of folder `path` that `listing` (the manifest, or a config that records
    checksums) names against its sha256, and return the listing."""
    source = "its manifest" if listing == MANIFEST else "its config"
    for name, digest in files.items():
        file = path / str(name)
        if Path(name).is_absolute() or ".." in Path(name).parts or file.is_symlink():
            raise BertflowError(f"{path / listing} lists a file outside the folder: {name}")
        if not file.is_file():
            raise BertflowError(f"{path} is missing {name}, which {source} lists")
        if sha256_file(file) != digest:
            where = MANIFEST if listing == MANIFEST else source
            raise BertflowError(f"{file} does not match the checksum in {where}: "
                                "altered or truncated")
    return {str(k): str(v) for k, v in files.items()}


def check_destination(path: str | os.PathLike, kind: str, legacy: Legacy | None = None) -> Path:
    """`path` if a folder of `kind` may be written there: absent, empty, or a folder of this
    kind that holds only its own files. Anything else is refused, naming what is in the way."""
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
    own = _own_files(path, kind, legacy)
    other = _manifest_kind(path)
    if own is None and other not in (None, kind):
        raise BertflowError(f"{path} is {_name(other)}, not {_name(kind)}; not replacing it")
    if own is None:
        raise BertflowError(f"{path} is a non-empty folder but not {_name(kind)}; "
                            "not replacing it")
    foreign = sorted(present - own)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5
                                          else "")
        raise BertflowError(f"{path} holds files that are not part of {_name(kind)}: {shown}; "
                            "not replacing it")
    return path


def _name(kind: str) -> str:
    known = _FORMATS.get(kind)
    return known.name if known is not None else f"a {kind} folder"


def _manifest_kind(path: Path) -> str | None:
    try:
        return str(read_json(path / MANIFEST).get("kind"))
    except BertflowError:
        return None


def _own_files(path: Path, kind: str, legacy: Legacy | None) -> set[str] | None:
    if (path / MANIFEST).is_file():
        try:
            manifest = read_json(path / MANIFEST)
        except BertflowError:
            return None
        files = manifest.get("files")
        if manifest.get("format") != _FORMAT or manifest.get("kind") != kind \
                or not isinstance(files, dict):
            return None
        return {str(name) for name in files} | {MANIFEST}
    return legacy(path) if legacy is not None else None


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


@dataclass(frozen=True)
class FolderFormat:
    """One kind of artifact folder: `kind` names it in its manifest (and as the "format" of its
    `config` file, where it has one, beside a "format_version" of at most `version`); `name`
    and `noun` name it in messages. `files` are those the first format of a kind with a config
    wrote, without a manifest: a folder written so is recognised by its config's format. A
    folder of a kind without a config is recognised by its manifest alone (its `files` only
    name what it may hold).
    """

    kind: str
    name: str
    noun: str
    version: int | None = None
    config: str | None = None
    files: tuple[str, ...] = ()

    def check_destination(self, path: str | os.PathLike) -> Path:
        """`path` if a folder of this kind may be written there (see `check_destination`)."""
        return check_destination(path, self.kind, self.legacy_files)

    def write(self, path: str | os.PathLike, fill: Callable[[Path], Any]) -> Path:
        """Write a folder of this kind at `path` atomically (see `write_folder`)."""
        return write_folder(path, self.kind, fill, self.legacy_files)

    def write_manifest(self, folder: Path) -> None:
        write_manifest(folder, self.kind)

    def verify(self, path: str | os.PathLike) -> dict[str, str] | None:
        """Check `path` against its manifest, if it has one (see `verify_folder`)."""
        return verify_folder(path, self.kind)

    def read(self, path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, str] | None]:
        """The config of the folder at `path` and its manifest's listing, checked: every file
        against the manifest, the config's format and version, and a manifest present for
        every version past 1 (the first format had none)."""
        path = Path(path)
        manifest = self.verify(path)
        config = read_json(path / str(self.config))
        if config.get("format") != self.kind:
            raise BertflowError(f"{path / str(self.config)} is not a bertflow {self.noun} config")
        version = config.get("format_version")
        if version not in range(1, (self.version or 1) + 1):
            raise BertflowError(f"{path} has {self.noun} format version {version}; this "
                                f"bertflow reads versions 1 to {self.version}")
        if version != 1 and manifest is None:
            raise BertflowError(f"{path} has no {MANIFEST}: the {self.noun} is incomplete or "
                                "altered")
        return config, manifest

    def legacy_files(self, folder: Path) -> set[str] | None:
        """The files of `folder` if it is one of this kind written before manifests, else
        None."""
        if self.config is None:
            return None
        return legacy_files(self.config, self.kind, set(self.files))(folder)


HEAD_FOLDER = FolderFormat("bertflow-head", "a flow head", "head", version=2,
                           config="config.json", files=("config.json", "model.safetensors"))
INDEX_FOLDER = FolderFormat("bertflow-index", "an index", "index", version=2,
                            config="config.json",
                            files=("config.json", "index.faiss", "items.json",
                                   "head/config.json", "head/model.safetensors"))
PIPELINE_FOLDER = FolderFormat("bertflow-pipeline", "a bertflow sentence-transformers export",
                               "sentence-transformers export")
# Every plot a plots folder may hold. A folder of plots without a manifest (as written before
# manifests) is not told from the user's own: it is not replaced.
PLOTS_FOLDER = FolderFormat("bertflow-plots", "a folder of bertflow plots", "plots",
                            files=("spectrum.png", "cosines.png", "token_norms.png",
                                   "projection.png", "alignment_uniformity.png",
                                   "token_projection.png", "token_spectrum.png"))
_FORMATS = {f.kind: f for f in (HEAD_FOLDER, INDEX_FOLDER, PIPELINE_FOLDER, PLOTS_FOLDER)}


def ready_heads() -> dict[str, Path]:
    """The heads that come with bertflow (its `heads/` package data), by name: each loads
    with `FlowHead.load(name)` and `--head NAME`."""
    folder = Path(str(importlib.resources.files(__package__) / "heads"))
    if not folder.is_dir():
        return {}
    return {p.name: p for p in sorted(folder.iterdir()) if (p / HEAD_FOLDER.config).is_file()}


def head_folder(path: str | os.PathLike) -> Path:
    """The folder of head `path`: a folder, or the name of a ready head."""
    path = Path(path)
    if not path.is_dir() and str(path) in ready_heads():
        path = ready_heads()[str(path)]
    if not path.is_dir():
        raise BertflowError(f"no flow head folder at {path}, nor a ready head of that name "
                            f"({', '.join(ready_heads()) or 'none installed'})")
    return path
