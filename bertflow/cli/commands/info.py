"""`bertflow info`: say what a head, or anything else bertflow wrote, is; or list the ready
heads."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

SUMMARY = "describe a head or any other output, or list the ready heads"
COMPUTES = False
DESCRIPTION = """\
What a head is (encoder, pooling, flow, how it was fit), or what any other file or folder
bertflow wrote is: embeddings, transformed vectors, an index, a training checkpoint, eval rows,
an MTEB result file, an export, plots. Without PATH, the ready heads that come with bertflow,
loadable by name."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=Path, nargs="?", default=None, metavar="PATH",
                   help="a head folder or a ready head's name, or any output of bertflow")
    p.add_argument("--json", action="store_true",
                   help="print its record (a head's config.json, an embeddings sidecar, ...)")


def check(args: argparse.Namespace, launched: bool) -> None:
    from ...errors import BertflowError
    from ...heads.catalog import ready_heads

    heads = ready_heads() if args.path is not None and not args.path.exists() else None
    if heads is not None and str(args.path) not in heads:
        names = ", ".join(heads) or "none installed"
        raise BertflowError(f"nothing at {args.path}, nor a ready head of that name ({names})")


def run(args: argparse.Namespace) -> None:
    from ...export.card import details, tagline
    from ...heads.catalog import ready_heads
    from ...storage.artifacts import HEAD_FOLDER, identify

    if args.path is None:
        heads = ready_heads()
        print("ready heads (load with Head.load(NAME) or --head NAME):" if heads else
              "no ready heads are installed")
        for name, folder in heads.items():
            print(f"  {name}: {tagline(folder)}")
        return
    path = args.path if args.path.exists() else ready_heads()[str(args.path)]
    kind, record = identify(path)
    record = _plain(record)
    if args.json:
        print(json.dumps(record, indent=2))
        return
    rows = [("path", str(args.path))]
    if kind is HEAD_FOLDER:
        rows += details(path)
    else:
        rows += [("kind", kind.noun), *_fields(record)]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _plain(value: Any) -> Any:
    """`value` as JSON holds it: what JSON cannot (a checkpoint's tensors) left out, a number
    that is not finite (a held-out NLL not yet measured) as text."""
    if isinstance(value, dict):
        kept = {str(k): _plain(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not _LEFT_OUT}
    if isinstance(value, list):
        return [v for v in map(_plain, value) if v is not _LEFT_OUT]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value if isinstance(value, (str, int, float, bool, type(None))) else _LEFT_OUT


_LEFT_OUT = object()


def _fields(record: Any, prefix: str = "") -> list[tuple[str, str]]:
    """A record's fields as (name, value): a nested record's by dotted names, an encoder by its
    name, a list of records (eval's rows) by its length and tasks."""
    if isinstance(record, list):
        tasks = sorted({str(row.get("task")) for row in record})
        return [(f"{prefix}rows", str(len(record))), (f"{prefix}tasks", ", ".join(tasks))]
    fields = []
    for key, value in record.items():
        value = value["name"] if isinstance(value, dict) and "name" in value else value
        if isinstance(value, dict):
            fields += _fields(value, f"{prefix}{key}.")
        elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
            fields.append((f"{prefix}{key}", f"{len(value)} records"))
        elif key != "format" and value is not None:
            fields.append((f"{prefix}{key}", str(value)))
    return fields
