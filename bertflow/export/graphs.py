"""The flow head as a standalone graph carrying its config, embeddings (batch, dim) → latents:
an ONNX file for onnxruntime, or a `torch.export` program (.pt2)."""

from __future__ import annotations

import io
import json
import logging
import os
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import BertflowError, first_line
from ..heads.head import Head
from ..storage.artifacts import EXPORT_MARKER, ONNX_EXPORT, PIPELINE_FOLDER, PT2_EXPORT
from ..storage.files import Checked, atomic_file

__all__ = ["INPUT_NAME", "OUTPUT_NAME", "check_destination", "export_onnx", "export_program"]

INPUT_NAME, OUTPUT_NAME = "embeddings", "z"


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
    torch.export.save(program, buffer,
                      extra_files={f"{EXPORT_MARKER}.json": json.dumps(head.config())})
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
    program.model.metadata_props[EXPORT_MARKER] = json.dumps(head.config())
    with atomic_file(out.path, recheck=out) as tmp:
        program.save(str(tmp), external_data=False)
    return out.path


def check_destination(path: str | os.PathLike, fmt: str) -> Path:
    """`path` if it is free for an export in `fmt`, or holds one of bertflow's in that format."""
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401 - needed to read an existing export, and to write one
        except ImportError:
            raise BertflowError("ONNX export needs onnx and onnxscript: "
                                "pip install 'bertflow[export]'") from None
    return _DESTINATIONS[fmt].check_destination(path)


_DESTINATIONS = {"sentence-transformers": PIPELINE_FOLDER, "onnx": ONNX_EXPORT,
                 "torch-export": PT2_EXPORT}
