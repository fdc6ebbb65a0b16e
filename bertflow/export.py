"""The flow head as a standalone graph: embeddings (batch, dim) → transformed embeddings.

`export_onnx` writes one self-contained ONNX file (the head's config in its metadata under
``bertflow_head``) that onnxruntime runs without torch or bertflow; `export_program` a
`torch.export` program (.pt2, the config in its extra file ``bertflow_head.json``) that
`torch.export.load` runs without bertflow. Both have a dynamic batch dimension. A file at the
destination is replaced only when it is such an export (`check_destination`), checked before the
export and again, where it has changed meanwhile, just before it is replaced.
"""

from __future__ import annotations

import io
import json
import logging
import os
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from .errors import BertflowError, first_line
from .files import Checked, atomic_file, refuse_link
from .head import FlowHead
from .head_format import FORMAT

__all__ = ["INPUT_NAME", "OUTPUT_NAME", "check_destination", "export_onnx", "export_program"]

INPUT_NAME, OUTPUT_NAME = "embeddings", "z"
MARKER = "bertflow_head"  # the ONNX metadata property, and the .pt2 extra file's stem


class _Transform(nn.Module):
    def __init__(self, head: FlowHead):
        super().__init__()
        self.head = head

    def forward(self, embeddings: Tensor) -> Tensor:
        return self.head.latents(embeddings)


def _program(head: FlowHead) -> torch.export.ExportedProgram:
    """The head's latents as a graph with a dynamic batch dimension; both formats start here."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.export.export(_Transform(head).eval(), (torch.zeros(2, head.dim),),
                                   dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))


def export_program(head: FlowHead, path: str | os.PathLike) -> Path:
    """Write the head as a `torch.export` program: `torch.export.load(path).module()(x)`."""
    out = Checked(path, lambda p: check_destination(p, "torch-export"))
    program = _program(head)
    buffer = io.BytesIO()  # torch's writer aborts the process on a failed write: none to file
    torch.export.save(program, buffer, extra_files={f"{MARKER}.json": json.dumps(head.config())})
    with atomic_file(out.path, suffix=".tmp.pt2", recheck=out) as tmp:
        tmp.write_bytes(buffer.getbuffer())
    return out.path


def export_onnx(head: FlowHead, path: str | os.PathLike, opset: int | None = None) -> Path:
    """Write the head as one ONNX file: input ``embeddings`` (batch, dim) float32, output
    ``z`` (batch, dim) float32; the head's config in the model metadata."""
    out = Checked(path, lambda p: check_destination(p, "onnx"))  # onnx is installed
    import onnx

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
    with atomic_file(out.path, recheck=out) as tmp:
        program.save(str(tmp), external_data=False)
        model = onnx.load(str(tmp))
        onnx.helper.set_model_props(model, {MARKER: json.dumps(head.config())})
        onnx.save(model, str(tmp))
    return out.path


def check_destination(path: str | os.PathLike, fmt: str) -> Path:
    """`path` if an export in `fmt` (``onnx``, ``torch-export`` or ``sentence-transformers``)
    may be written there: free, or an export of that format by bertflow. Anything else is
    refused, before any work."""
    path = Path(path)
    if fmt == "sentence-transformers":
        from .folders import PIPELINE_FOLDER

        return PIPELINE_FOLDER.check_destination(path)
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401 - needed to read an existing export, and to write one
        except ImportError:
            raise BertflowError("ONNX export needs onnx and onnxscript: "
                                "pip install 'bertflow[export]'") from None
    suffix, ours = {"onnx": (".onnx", _onnx_head), "torch-export": (".pt2", _program_head)}[fmt]
    if path.suffix != suffix:
        raise BertflowError(f"--out {path} must end in {suffix}")
    if path.is_dir():
        raise BertflowError(f"--out {path} is a folder")
    refuse_link(path)
    if path.exists() and not _is_head_config(ours, path):
        raise BertflowError(f"{path} exists and is not a bertflow export; not replacing it")
    return path


def _onnx_head(path: Path) -> str:
    """The ``bertflow_head`` metadata of the ONNX model at `path` (read, not run)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}[MARKER]


def _program_head(path: Path) -> str:
    """The ``bertflow_head.json`` extra file of the .pt2 archive at `path`, read as a zip
    (`torch.export.load` would unpickle it)."""
    with zipfile.ZipFile(path) as archive:
        name, = (n for n in archive.namelist() if n.split("/", 1)[-1] == f"extra/{MARKER}.json")
        return archive.read(name).decode("utf-8")


def _is_head_config(read: Callable[[Path], str], path: Path) -> bool:
    """Whether `read(path)` gives a head's config; any failure to read it says no."""
    try:
        config = json.loads(read(path))
    except Exception:  # noqa: BLE001 - a file of any kind: a corrupt archive or protobuf
        return False
    return isinstance(config, dict) and config.get("format") == FORMAT
