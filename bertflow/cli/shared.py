"""What several commands do when they run: the flow options given, the head and encoder
they name, and text made safe for a terminal."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ..errors import BertflowError
from .checks import FLOW_FIELDS, TRAIN_FIELDS

__all__ = ["flow_options", "head_and_encoder", "load_encoder_of", "printable"]


def flow_options(args: argparse.Namespace) -> dict[str, Any]:
    """The flow, training and --before options given, as changes to the pooling's recipe."""
    given = {part: {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
             for part, names in (("flow", FLOW_FIELDS), ("train", TRAIN_FIELDS))}
    return {**given, "before": args.before, "isotropic": args.isotropic}


def printable(text: str) -> str:
    """`text` for a terminal, one line: control characters (newlines, escape sequences), line
    separators and bidirectional overrides written as escapes, so that no text can forge a row
    or reach the terminal as a command."""
    return "".join(c.encode("unicode_escape").decode("ascii") if _CONTROL.match(c) else c
                   for c in text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def head_and_encoder(args: argparse.Namespace, flow: bool = False) -> tuple[Any, Any]:
    """--head loaded (or None), whose pooling and max length those given must be, and the
    encoder; with `flow` and no head, refuse a flow too large for the encoder's width."""
    from ..heads.head import Head
    from ..training.recipes import choose

    head = None if args.head is None else Head.load(args.head)
    for flag, name in (("--pooling", "pooling"), ("--max-length", "max_length")):
        given, recorded = getattr(args, name, None), getattr(head, name, None)
        if None not in (given, recorded) and given != recorded:
            raise BertflowError(f"{flag} {given} differs from the head's {recorded}")
    encoder = load_encoder_of(args, head)
    if flow and head is None:  # before anything is encoded
        pooling = encoder.defaults(args.pooling, getattr(args, "max_length", None))[0]
        choose(flow_options(args), pooling)[0].flow.check(encoder.width(pooling))
    return head, encoder


def load_encoder_of(args: argparse.Namespace, owner: Any = None) -> Any:
    """--encoder, else the encoder `owner` (a head or an index) records, else the default."""
    from ..encoders.loading import resolve_encoder

    return resolve_encoder(args.encoder, getattr(owner, "encoder", None), args.device,
                           args.dtype)
