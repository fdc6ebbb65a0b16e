"""`bertflow info`: describe a head, or list the ready heads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..options import HEAD_HELP

SUMMARY = "describe a head, or list the ready heads"
DESCRIPTION = """\
What a head is (encoder, pooling, flow, how it was fit). Without HEAD, the ready heads
that come with bertflow, loadable by name."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("head", type=Path, nargs="?", default=None, help=HEAD_HELP)
    p.add_argument("--json", action="store_true", help="print the head's config.json")


def run(args: argparse.Namespace) -> None:
    from ...export.card import details, tagline
    from ...heads.catalog import ready_heads
    from ...heads.head import Head

    if args.head is None:
        heads = ready_heads()
        print("ready heads (load with Head.load(NAME) or --head NAME):" if heads else
              "no ready heads are installed")
        for name in heads:
            print(f"  {name}: {tagline(Head.load(name))}")
        return
    head = Head.load(args.head)
    if args.json:
        print(json.dumps(head.config(), indent=2))
        return
    rows = [("head", str(args.head)), *details(head)]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
