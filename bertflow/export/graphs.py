"""The flow head as a standalone graph carrying its config, embeddings (batch, dim) → latents:
an ONNX file for onnxruntime, or a `torch.export` program (.pt2)."""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import warnings
import zipfile
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import BertflowError, first_line
from ..heads.format import FORMAT
from ..heads.head import Head
from ..storage.artifacts import PIPELINE_FOLDER, FileFormat
from ..storage.files import Checked, atomic_file

__all__ = ["INPUT_NAME", "OUTPUT_NAME", "check_destination", "export_onnx", "export_program"]

INPUT_NAME, OUTPUT_NAME = "embeddings", "z"
MARKER = "bertflow_head"  # the ONNX metadata property, and the .pt2 extra file's stem


class _Transform(nn.Module):
    def __init__(self, head: Head):
        super().__init__()
        self.head = head

    def forward(self, embeddings: Tensor) -> Tensor:
        return self.head.latents(embeddings)


def _program(head: Head) -> torch.export.ExportedProgram:
    """The head's latents as a graph with a dynamic batch dimension."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.export.export(_Transform(head).eval(), (torch.zeros(2, head.dim),),
                                   dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))


def export_program(head: Head, path: str | os.PathLike) -> Path:
    """Write the head as a `torch.export` program: `torch.export.load(path).module()(x)`."""
    out = Checked(path, lambda p: check_destination(p, "torch-export"))
    program = _program(head)
    buffer = io.BytesIO()  # torch's writer aborts the process on a failed write: none to file
    torch.export.save(program, buffer, extra_files={f"{MARKER}.json": json.dumps(head.config())})
    with atomic_file(out.path, suffix=".tmp.pt2", recheck=out) as tmp:
        tmp.write_bytes(buffer.getbuffer())
    return out.path


def export_onnx(head: Head, path: str | os.PathLike, opset: int | None = None) -> Path:
    """Write the head as one ONNX file: ``embeddings`` (batch, dim) → ``z``, both float32."""
    out = Checked(path, lambda p: check_destination(p, "onnx"))  # onnx is installed
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.onnx.export(
                _program(head), dynamo=True, verbose=False, input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME], opset_version=opset,
            )
    except ImportError as e:
        raise BertflowError(f"ONNX export needs onnxscript: {first_line(e)}") from None
    finally:
        logger.setLevel(level)
    program.model.metadata_props[MARKER] = json.dumps(head.config())
    with atomic_file(out.path, recheck=out) as tmp:
        program.save(str(tmp), external_data=False)
    return out.path


def check_destination(path: str | os.PathLike, fmt: str) -> Path:
    """`path` if it is free for an export in `fmt`, or holds one of bertflow's in that format."""
    if fmt == "sentence-transformers":
        return PIPELINE_FOLDER.check_destination(path)
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401 - needed to read an existing export, and to write one
        except ImportError:
            raise BertflowError("ONNX export needs onnx and onnxscript: "
                                "pip install 'bertflow[export]'") from None
    return _FILES[fmt].check_destination(path)


def _is_export(path: Path, fmt: str) -> bool:
    """Whether `path` holds a head's config in `fmt`; any failure to read it says no. A .pt2 is
    read as a zip: `torch.export.load` would unpickle it."""
    try:
        if fmt == "onnx":
            import onnx

            model = onnx.load(str(path), load_external_data=False)
            text = {p.key: p.value for p in model.metadata_props}[MARKER]
        else:
            with zipfile.ZipFile(path) as archive:
                name, = (n for n in archive.namelist()
                         if n.split("/", 1)[-1] == f"extra/{MARKER}.json")
                text = archive.read(name).decode("utf-8")
        config = json.loads(text)
    except Exception:  # noqa: BLE001 - a file of any kind: a corrupt archive or protobuf
        return False
    return isinstance(config, dict) and config.get("format") == FORMAT


_FILES = {fmt: FileFormat("a bertflow export", functools.partial(_is_export, fmt=fmt), suffix)
          for fmt, suffix in (("onnx", ".onnx"), ("torch-export", ".pt2"))}
