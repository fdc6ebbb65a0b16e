"""The flow head as a standalone graph: embeddings (batch, dim) → transformed embeddings.

`export_onnx` writes one self-contained ONNX file (weights inside, the head's config.json in its
metadata under ``bertflow_head``) that onnxruntime runs without torch, nflows or bertflow;
`export_program` writes a `torch.export` program (.pt2) that `torch.export.load` runs without
bertflow or nflows. Both have a dynamic batch dimension.
"""

from __future__ import annotations

import io
import json
import logging
import os
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from .errors import BertflowError, first_line
from .files import atomic_file
from .head import FlowHead

__all__ = ["INPUT_NAME", "OUTPUT_NAME", "export_onnx", "export_program"]

INPUT_NAME, OUTPUT_NAME = "embeddings", "z"


class _Transform(nn.Module):
    def __init__(self, head: FlowHead):
        super().__init__()
        self.head = head

    def forward(self, embeddings: Tensor) -> Tensor:
        return self.head.latents(embeddings)


def _program(head: FlowHead) -> torch.export.ExportedProgram:
    """The head's forward as a graph with a dynamic batch dimension; both formats start here."""
    example = torch.zeros(2, head.dim)
    batch = torch.export.Dim("batch", min=1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.export.export(_Transform(head).eval(), (example,),
                                   dynamic_shapes=({0: batch},))


def export_program(head: FlowHead, path: str | os.PathLike) -> Path:
    """Write the head as a `torch.export` program: `torch.export.load(path).module()(x)`."""
    path = _check_out(path, ".pt2")
    program = _program(head)
    buffer = io.BytesIO()  # torch's writer aborts the process on a failed write: none to file
    torch.export.save(program, buffer)
    with atomic_file(path, suffix=".tmp.pt2") as tmp:
        tmp.write_bytes(buffer.getbuffer())
    return path


def export_onnx(head: FlowHead, path: str | os.PathLike, opset: int | None = None) -> Path:
    """Write the head as one ONNX file: input ``embeddings`` (batch, dim) float32, output
    ``z`` (batch, dim) float32; the head's config in the model metadata."""
    try:
        import onnx
    except ImportError:
        raise BertflowError(
            "ONNX export needs onnx and onnxscript: pip install 'bertflow[export]'"
        ) from None
    path = _check_out(path, ".onnx")
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
    with atomic_file(path) as tmp:
        program.save(str(tmp), external_data=False)
        model = onnx.load(str(tmp))
        onnx.helper.set_model_props(model, {"bertflow_head": json.dumps(head.config())})
        onnx.save(model, str(tmp))
    return path


def _check_out(path: str | os.PathLike, suffix: str) -> Path:
    path = Path(path)
    if path.suffix != suffix:
        raise BertflowError(f"--out {path} must end in {suffix}")
    if path.is_dir():
        raise BertflowError(f"--out {path} is a folder")
    return path
