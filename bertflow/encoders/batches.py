"""Sentences tokenised once and cut into batches of similar length, which keeps padding small."""

from __future__ import annotations

import ctypes
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import BertflowError

__all__ = ["check_batch_size", "check_max_length", "clipped", "release_free_memory",
           "token_batches"]


def check_batch_size(batch_size: Any) -> int:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise BertflowError(f"batch size must be at least 1, got {batch_size}")
    return batch_size


def check_max_length(max_length: Any) -> int:
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise BertflowError(f"max_length must be an integer of at least 2, got {max_length!r}")
    return max_length


def clipped(text: str, width: int, enough: Callable[[str], bool]) -> str:
    """`text` cut after its last whole word within `width` characters, the window doubled
    until `enough` says the cut gives every token that is kept, or `text` is whole: the tokens
    kept are those of the whole text, and a line of megabytes is not tokenised whole to keep a
    few dozen. A window that is one word of over half its width is cut at `width`."""
    while len(text) > width:
        words = text[: width + 1].rsplit(maxsplit=1)
        if len(words) == 1 and len(words[0]) > width // 2:
            return text[:width]
        if len(words) == 2 and enough(words[0]):
            return words[0]
        width *= 2
    return text


def token_batches(tokenize: Callable[[Sequence[str]], Any], sentences: Sequence[str],
                  pad_id: int | None, limit: int | None, batch_size: int,
                  slice_size: int = 512, unpadded: bool = False,
                  ) -> Iterator[tuple[np.ndarray, dict[str, torch.Tensor]]]:
    """The rows of each batch, longest sentences first, and the batch: right-padded to its
    longest, rounded up by `padded_width` within the model's `limit` of positions, and masked;
    with `unpadded`, each batch holds sentences of one length alone, not padded at all.
    The sentences are `tokenize`d a slice at a time into flat int32 arrays (a tokenizer's own
    output for thousands of sentences takes tens of MB)."""
    parts: dict[str, list[np.ndarray]] = {}
    lengths = []
    for start in range(0, len(sentences), slice_size):
        tokens = tokenize(sentences[start : start + slice_size])
        lengths += [len(ids) for ids in tokens["input_ids"]]
        for key in ("input_ids", "token_type_ids", "special_tokens_mask"):
            if key in tokens:
                parts.setdefault(key, []).append(
                    np.fromiter(itertools.chain.from_iterable(tokens[key]), np.int32))
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    fields = {key: np.concatenate(values) for key, values in parts.items()}
    pads = {"input_ids": pad_id or 0, "token_type_ids": 0, "special_tokens_mask": 1}
    order = np.argsort(-lengths, kind="stable")
    runs = np.split(order, np.flatnonzero(np.diff(lengths[order])) + 1) if unpadded else [order]
    for rows in (run[i : i + batch_size] for run in runs for i in range(0, len(run), batch_size)):
        row_lengths = lengths[rows]
        longest = int(row_lengths.max())
        width = longest if unpadded else max(longest, min(padded_width(longest), limit or longest))
        batch = {key: np.full((len(rows), width), pads[key], dtype=np.int64) for key in fields}
        for j, (row, length) in enumerate(zip(rows, row_lengths, strict=True)):
            for key, values in fields.items():
                batch[key][j, :length] = values[starts[row] : starts[row] + length]
        batch["attention_mask"] = (np.arange(width) < row_lengths[:, None]).astype(np.int64)
        yield rows, {key: torch.from_numpy(value) for key, value in batch.items()}


def padded_width(longest: int, steps: int = 8) -> int:
    """`longest` rounded up to a `steps`-th of its power of two: a few dozen batch shapes
    instead of one per length keep the CPU allocator from fragmenting, so memory does not
    creep up."""
    step = max(1, (1 << (longest.bit_length() - 1)) // steps)
    return -(-longest // step) * step


def release_free_memory() -> None:
    """Return the C allocator's free pages to the system (glibc's `malloc_trim`), where freed
    tensors of varying shapes otherwise leave memory stranded."""
    if _TRIM is not None:
        _TRIM(0)


_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None) if os.name == "posix" else None
