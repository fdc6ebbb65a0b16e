"""What the experiment scripts share: their common options and where things live by default."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("BERTFLOW_DATA") or REPO / "data")  # make data links data/
RESULTS = REPO / "experiments" / "results"

_OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "data": ("--data", {"type": Path, "default": DATA,
                        "help": "data folder in SentEval's layout (STSBenchmark/, SICK/, ...)"}),
    "cache": ("--cache", {"type": Path, "default": REPO / "experiments" / "cache",
                          "help": "embedding cache folder"}),
    "out": ("--out", {"type": Path, "default": RESULTS, "help": "where the results go"}),
    "generic": ("--generic", {"type": Path, "default": DATA / "unlabeled" / "wiki-sample.txt",
                              "help": "a generic text file to fit on, one sentence per line"}),
    "encoder": ("--encoder", {"default": None,
                              "help": "encoder folder (default: all-MiniLM-L6-v2)"}),
    "encoders": ("--encoder", {"action": "append", "default": None,
                               "help": "encoder folder; repeat for several (default: "
                                       "all-MiniLM-L6-v2)"}),
}


def parser(doc: str, *options: str) -> argparse.ArgumentParser:
    """A parser described by the first line of a script's `doc`, with the common `options`
    (``data``, ``cache``, ``out``, ``generic``, ``encoder``, or ``encoders`` for a
    repeatable ``--encoder``)."""
    made = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name in options:
        flag, settings = _OPTIONS[name]
        made.add_argument(flag, **settings)
    return made



def beir_parser(doc: str) -> argparse.ArgumentParser:
    """A parser for a script over a BEIR task and encoders, each with its own max length
    (``--encoder DIR --max-length N``, repeated), with the cache and results folders."""
    made = parser(doc, "encoders", "cache", "out")
    made.add_argument("--max-length", type=int, action="append", default=None,
                      help="max length of each --encoder, in order (default: 256)")
    made.add_argument("--beir", type=Path, default=DATA / "beir" / "scifact")
    made.add_argument("--split", default="test")
    return made


def command_line(script: str) -> str:
    """The command that ran `script` (experiments/NAME.py), as a reader can paste it: the
    default encoder's folder as the Python that prints it, the home folder as ~."""
    from bertflow import default_encoder_path

    default = "\"$(python -c 'import bertflow; print(bertflow.default_encoder_path())')\""
    shown = [default if a == str(default_encoder_path()) else
             shlex.quote(a).replace(str(Path.home()), "~") for a in sys.argv[1:]]
    return " ".join([f"python experiments/{script}", *shown])


def onnx_graphs(encoder: Any, max_length: int, folder: Path) -> tuple[Any, dict[str, Path]]:
    """The pipeline as one ONNX graph (`bertflow export --format onnx-pipeline` of an identity
    head after mean pooling) in `folder`, and the same with its weights quantised to int8 by
    onnxruntime's dynamic quantisation, per channel: the graph's tokenizer, and each model's
    path by precision."""
    import numpy as np
    import tokenizers
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from bertflow import Head
    from bertflow.export.graphs import export_pipeline

    x = encoder.encode(["A first sentence.", "Another one, longer than the first.", "A third.",
                        "Rain again today."], "mean", max_length, progress=False)
    head = Head.fit_linear(np.asarray(x), "identity", encoder=encoder.id, pooling="mean",
                           max_length=max_length)
    graph = export_pipeline(head, folder / "graph", encoder)
    quantize_dynamic(graph / "model.onnx", folder / "int8.onnx", weight_type=QuantType.QInt8,
                     per_channel=True)
    tokenizer = tokenizers.Tokenizer.from_file(str(graph / "tokenizer.json"))
    return tokenizer, {"float32": graph / "model.onnx", "int8": folder / "int8.onnx"}


def onnx_session(model: Path, threads: int) -> Any:
    import onnxruntime

    settings = onnxruntime.SessionOptions()
    settings.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(str(model), settings, providers=["CPUExecutionProvider"])


def onnx_embed(session: Any, tokenizer: Any, sentences: list[str], batch_size: int) -> Any:
    """`sentences` through an ONNX pipeline, longest first in batches (as
    sentence-transformers orders them, by characters), tokenizing included."""
    import numpy as np

    order = np.argsort([-len(s) for s in sentences], kind="stable")
    out = None
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        batch = tokenizer.encode_batch([sentences[i] for i in rows])
        z = session.run(None, {
            "input_ids": np.array([e.ids for e in batch], np.int64),
            "attention_mask": np.array([e.attention_mask for e in batch], np.int64)})[0]
        out = np.empty((len(sentences), z.shape[1]), np.float32) if out is None else out
        out[rows] = z
    return out
