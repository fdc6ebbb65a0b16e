"""The flow head as a standalone graph carrying its config, embeddings (batch, dim) → latents:
an ONNX file for onnxruntime, or a `torch.export` program (.pt2); or the whole pipeline, token
ids → encoder → the head's pooling → head (→ unit length), as one ONNX graph in a folder with
its tokenizer, which runs with onnxruntime and tokenizers alone."""

from __future__ import annotations

import io
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..encoders.encoder import Encoder
from ..encoders.loading import resolve_encoder
from ..encoders.pooling import LAYERS, pool
from ..errors import BertflowError, first_line
from ..heads.head import Head
from ..storage.artifacts import (
    EXPORT_MARKER,
    ONNX_EXPORT,
    ONNX_PIPELINE_FOLDER,
    PIPELINE_FOLDER,
    PT2_EXPORT,
)
from ..storage.files import Checked, atomic_file, write_json

__all__ = ["INPUT_NAME", "OUTPUT_NAME", "PIPELINE_INPUTS", "PIPELINE_OUTPUT", "check_destination",
           "export_onnx", "export_pipeline", "export_program"]

INPUT_NAME, OUTPUT_NAME = "embeddings", "z"
PIPELINE_INPUTS, PIPELINE_OUTPUT = ("input_ids", "attention_mask"), "sentence_embedding"


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
    program = _onnx(head, _program(head), (), [INPUT_NAME], OUTPUT_NAME, opset=opset)
    with atomic_file(out.path, recheck=out) as tmp:
        program.save(str(tmp), external_data=False)
    return out.path


class _Pipeline(nn.Module):
    """Token ids and attention mask → the encoder's states → the head's pooling → the head
    (→ unit length): what `Head.encode` computes for a batch."""

    def __init__(self, encoder: Encoder, head: Head, pooling: str, normalize: bool):
        super().__init__()
        self.model, self.head, self.pooling, self.normalize = (encoder.model, head, pooling,
                                                               normalize)
        # the tokens the tokenizer adds around a sentence, which the static pooling leaves out
        added = encoder.tokenizer("", add_special_tokens=True)["input_ids"]
        self.register_buffer("added", torch.tensor(sorted(set(added)), dtype=torch.long))

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = words = None
        if LAYERS[self.pooling]:
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                output_hidden_states=True, return_dict=True).hidden_states
        else:
            words = self.model.get_input_embeddings()(input_ids)
        added = (input_ids.unsqueeze(-1) == self.added).any(-1)
        z = self.head.latents(pool(hidden, words, attention_mask, added, self.pooling))
        return nn.functional.normalize(z, dim=-1) if self.normalize else z


def export_pipeline(head: Head, path: str | os.PathLike,
                    encoder: Encoder | str | os.PathLike | None = None, normalize: bool = False,
                    opset: int | None = None) -> Path:
    """Write the whole pipeline as a folder: `model.onnx`, one graph from ``input_ids`` and
    ``attention_mask`` (batch, tokens), int64, to ``sentence_embedding`` (batch, out_dim),
    float32; the encoder's tokenizer (its `tokenizer.json` truncating at the head's max length
    and padding a batch, for the `tokenizers` package alone); and `bertflow_onnx.json` (the
    head's config, pooling, max length, normalisation, the graph's inputs and output)."""
    check_destination(path, "onnx-pipeline")
    encoder = resolve_encoder(encoder, head.encoder, "cpu")
    pooling, max_length = head.settings(encoder)
    if encoder.unpadded:
        raise BertflowError(f"encoder {encoder.id.name}: its hidden states change with the "
                            "padding of a batch, which one graph over padded batches would add")
    if not getattr(encoder.tokenizer, "is_fast", False):
        raise BertflowError(f"encoder {encoder.id.name} has no fast tokenizer (tokenizer.json) "
                            "to run without transformers")
    example = encoder.tokenize(["a sentence", "two words and more"], max_length, padding=True,
                               return_tensors="pt")
    tokens = torch.export.Dim("tokens", min=1, max=max_length)
    batch = torch.export.Dim("batch", min=1)
    device = encoder.device  # traced on the CPU, beside the head; the caller's encoder put back
    try:
        module = _Pipeline(encoder.to("cpu"), head.eval(), pooling, normalize).eval()
        graph = _onnx(head, module, tuple(example[k] for k in PIPELINE_INPUTS),
                      list(PIPELINE_INPUTS), PIPELINE_OUTPUT,
                      dynamic_shapes=({0: batch, 1: tokens},) * 2, opset=opset)
    finally:
        encoder.to(device)
    tokenizer = encoder.tokenizer.backend_tokenizer.__class__.from_str(
        encoder.tokenizer.backend_tokenizer.to_str())
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(pad_id=encoder.tokenizer.pad_token_id,
                             pad_token=encoder.tokenizer.pad_token)
    record = {**ONNX_PIPELINE_FOLDER.stamp(), "head": head.config(), "pooling": pooling,
              "max_length": max_length, "normalize": normalize,
              "inputs": list(PIPELINE_INPUTS), "output": PIPELINE_OUTPUT}

    def fill(tmp: Path) -> None:
        encoder.tokenizer.save_pretrained(tmp)  # for transformers' AutoTokenizer too
        tokenizer.save(str(tmp / "tokenizer.json"))
        graph.save(str(tmp / "model.onnx"), external_data=False)
        write_json(tmp / ONNX_PIPELINE_FOLDER.config, record)

    return ONNX_PIPELINE_FOLDER.write(path, fill)


def _onnx(head: Head, module: nn.Module | torch.export.ExportedProgram, args: tuple,
          inputs: list[str], output: str, opset: int | None = None, **options: Any) -> Any:
    """`module` as an ONNX program carrying the head's config (torch's logs and notices
    quiet)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)  # the exporter's notes on axis names
            program = torch.onnx.export(module, args, dynamo=True, verbose=False,
                                        input_names=inputs, output_names=[output],
                                        opset_version=opset, **options)
    except ImportError as e:
        raise BertflowError(f"ONNX export needs onnxscript: {first_line(e)}") from None
    finally:
        logger.setLevel(level)
    program.model.metadata_props[EXPORT_MARKER] = json.dumps(head.config())
    return program


def check_destination(path: str | os.PathLike, fmt: str) -> Path:
    """`path` if it is free for an export in `fmt`, or holds one of bertflow's in that format."""
    if fmt.startswith("onnx"):
        try:
            import onnx  # noqa: F401 - needed to read an existing export, and to write one
        except ImportError:
            raise BertflowError("ONNX export needs onnx and onnxscript: "
                                "pip install 'bertflow[export]'") from None
    return _DESTINATIONS[fmt].check_destination(path)


_DESTINATIONS = {"sentence-transformers": PIPELINE_FOLDER, "onnx": ONNX_EXPORT,
                 "onnx-pipeline": ONNX_PIPELINE_FOLDER, "torch-export": PT2_EXPORT}
