"""`bertflow export`: write a head for use without bertflow's CLI."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...errors import BertflowError
from ..checks import check_paths
from ..options import HEAD_HELP

SUMMARY = "write a head for use without bertflow's CLI"
DESCRIPTION = """\
A sentence-transformers folder (encoder, pooling and head; load it with
bertflow.export.pipeline.load_pipeline), a self-contained ONNX file of the head, a folder
holding the whole pipeline as one ONNX graph (token ids → encoder → pooling → head, with its
tokenizer: runs with onnxruntime and tokenizers alone), or a torch.export program."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", type=Path, required=True, help=HEAD_HELP)
    p.add_argument("--format", required=True, choices=("sentence-transformers", "onnx",
                                                         "onnx-pipeline", "torch-export"),
                   help="what to write")
    p.add_argument("--out", type=Path, required=True,
                   help="a folder (sentence-transformers, onnx-pipeline), HEAD.onnx or HEAD.pt2")
    p.add_argument("--encoder", default=None,
                   help="encoder of a pipeline (default: the head's)")
    p.add_argument("--normalize", action="store_true",
                   help="end a pipeline with L2 normalisation")


def check(args: argparse.Namespace, launched: bool) -> None:
    """Refuse a pipeline's options with a format of the head alone."""
    if args.format in ("onnx", "torch-export") and (args.encoder is not None or args.normalize):
        raise BertflowError("--encoder and --normalize apply to --format sentence-transformers "
                            "and onnx-pipeline")


def run(args: argparse.Namespace) -> None:
    from ...export.graphs import check_destination, export_onnx, export_pipeline, export_program
    from ...heads.head import Head

    check_paths(args)
    check_destination(args.out, args.format)
    head = Head.load(args.head)
    if args.format == "sentence-transformers":
        from ...export.pipeline import build_pipeline, save_pipeline

        save_pipeline(build_pipeline(head, args.encoder, args.normalize), args.out)
    elif args.format == "onnx-pipeline":
        export_pipeline(head, args.out, args.encoder, args.normalize)
    else:
        {"onnx": export_onnx, "torch-export": export_program}[args.format](head, args.out)
    print(f"wrote {args.out} ({args.format})")
