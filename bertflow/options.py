"""Checks of parsed options that cannot apply together, and the flow settings given."""

from __future__ import annotations

import argparse
from typing import Any

from .constants import DEFAULT_BATCH_SIZE
from .errors import BertflowError

__all__ = ["check_options", "flow_options"]

_FLOW_FIELDS = ("levels", "depth", "coupling", "hidden", "linear")
_TRAIN_FIELDS = ("seed", "epochs", "batch_size", "lr", "val_fraction", "patience")
# The encoder's options, and the values allowed where nothing is encoded: the defaults, and
# what happens anyway (the CPU, where a flow trains; float32).
_WITHOUT_ENCODING = {"device": ("auto", "cpu"), "dtype": ("float32",),
                     "encode_batch_size": (DEFAULT_BATCH_SIZE,), "cache": (None,)}


def flow_options(args: argparse.Namespace) -> dict[str, Any]:
    """The flow, training and --before options given, as changes to the pooling's recipe."""
    given = {part: {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
             for part, names in (("flow", _FLOW_FIELDS), ("train", _TRAIN_FIELDS))}
    return {**given, "before": args.before}


def check_options(args: argparse.Namespace, launched: bool) -> None:
    """Refuse options that cannot apply together (`launched`: under torchrun)."""
    if launched and args.command not in ("encode", "fit", "index"):
        raise BertflowError(f"bertflow {args.command} runs in one process; under torchrun "
                            "only encode, fit and index split their work")
    method = getattr(args, "method", None) or "flow"
    given = _given(args, ("before", *_FLOW_FIELDS, *_TRAIN_FIELDS))
    if given and getattr(args, "head", None) is not None:
        raise BertflowError(f"{', '.join(given)} apply to a flow fit here, not to --head "
                            f"{args.head}, which is fit already")
    if given and method != "flow":
        raise BertflowError(f"{', '.join(given)} apply to --method flow only")
    if getattr(args, "head", None) is not None and args.command == "eval":
        if args.fit_on is not None:
            raise BertflowError("--fit-on does not apply to --head: the head is already fit")
        if args.k is not None or args.d is not None:
            raise BertflowError("--k and --d apply to --method whitening, whitening-k and abtt, "
                                f"not to --head {args.head}, which is fit already")
    if (getattr(args, "k", None) is not None and method not in ("whitening", "whitening-k")) or (
            getattr(args, "d", None) is not None and method != "abtt"):
        raise BertflowError("--k applies to --method whitening and whitening-k, --d to "
                            "--method abtt")
    if args.command == "transform" and args.embeddings is not None:
        _check_no_encoding(args, f"--embeddings {args.embeddings} are transformed as they are")
    if args.command == "export" and args.format != "sentence-transformers" and (
            args.encoder is not None or args.normalize):
        raise BertflowError("--encoder and --normalize apply to --format sentence-transformers")
    if args.command != "fit":
        return
    if args.input.suffix == ".npy":  # --dev-sts encodes; --device places a torchrun job too
        unused = ("dtype",) if args.dev_sts else ("dtype", "encode_batch_size", "cache")
        _check_no_encoding(args, f"{args.input} holds embeddings, encoded already",
                           unused if args.dev_sts or launched else ("device", *unused))
    flow_only = _given(args, ("checkpoint", "resume", "logdir", "dev_sts"))
    if flow_only and method != "flow":
        raise BertflowError(f"{', '.join(flow_only)} apply to --method flow only")
    if args.checkpoint is not None and args.checkpoint.is_dir():
        raise BertflowError(f"--checkpoint {args.checkpoint} is a folder; expected a file")
    if args.resume and args.checkpoint is None:
        raise BertflowError("--resume needs --checkpoint FILE")
    if args.logdir is not None and args.logdir.exists() and not args.logdir.is_dir():
        raise BertflowError(f"--logdir {args.logdir} exists and is not a folder")


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """The flags of options `names` given (neither None nor False)."""
    return [f"--{name.replace('_', '-')}" for name in names
            if getattr(args, name, None) not in (None, False)]


def _check_no_encoding(args: argparse.Namespace, why: str,
                       options: tuple[str, ...] = tuple(_WITHOUT_ENCODING)) -> None:
    """Refuse the encoder's `options` given where nothing is encoded, as `why` says."""
    given = [f"--{name.replace('_', '-')} {getattr(args, name)}" for name in options
             if getattr(args, name, None) not in _WITHOUT_ENCODING[name]]
    if given:
        raise BertflowError(f"{' and '.join(given)} cannot apply: {why}")
