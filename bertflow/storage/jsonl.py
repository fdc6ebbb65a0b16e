"""JSON-lines files, one object a line, read streamed with their string fields and ids, a bad
line refused in one line naming its file and line number."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import BertflowError
from .files import iter_sentences, parse_json

__all__ = ["field", "is_jsonl", "record_id", "records", "unicode_text"]


def is_jsonl(path: Path) -> bool:
    """Whether the file at `path` is read as JSON lines (its name ends in `.jsonl`) rather than
    as text, one item a line; a name ending in `.json` is refused, being neither."""
    if path.suffix == ".json":
        raise BertflowError(f"{path} is named .json: name a file of one JSON object a line "
                            "*.jsonl, and a file of one item a line anything else")
    return path.suffix == ".jsonl"


def records(path: Path, start: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) of each line of a JSON-lines file from line `start` on."""
    for number, line in enumerate(iter_sentences(path, start, what="one JSON object"), start + 1):
        record = parse_json(line, f"{path} line {number}")
        if not isinstance(record, dict):
            raise BertflowError(f"{path} line {number} is not a JSON object")
        yield number, record


def field(path: Path, number: int, record: dict[str, Any], key: str) -> str:
    if key not in record:
        raise BertflowError(f"{path} line {number} has no {key!r}")
    value = record[key]
    if isinstance(value, int) and not isinstance(value, bool) and key == "_id":
        return str(value)
    if not isinstance(value, str):
        raise BertflowError(f"{path} line {number}: {key!r} is not a string")
    return unicode_text(path, number, key, value)


def unicode_text(path: Path, number: int, key: str, value: str) -> str:
    """`value`, refused where JSON's escapes made it no Unicode text (a lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BertflowError(f"{path} line {number}: {key!r} is not valid Unicode (a lone "
                            "surrogate)") from None
    return value


def record_id(path: Path, number: int, record: dict[str, Any], seen: dict[str, int]) -> str:
    """The `_id` of `record`, refused where empty or on an earlier line (`seen`: id → line)."""
    key = field(path, number, record, "_id")
    if not key.strip():
        raise BertflowError(f"{path} line {number}: '_id' is empty")
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in key):
        raise BertflowError(f"{path} line {number}: '_id' {key!r} holds a control character")
    if key in seen:
        raise BertflowError(f"{path} line {number}: duplicate id {key!r} (also on line "
                            f"{seen[key]})")
    return key
