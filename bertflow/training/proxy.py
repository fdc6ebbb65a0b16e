"""A task built from a corpus alone, no labels: each query's one relevant item is the other half
of the same text. For retrieval, a document's first sentence finds the rest of it (its title
finds its text where it has one sentence); for sentence similarity, the first three fifths of a
sentence's words find the last three fifths. Scored per query by nDCG@10, and for sentence
similarity also by how alike the two halves rank other sentences (`proxy_agreement`): finding a
sentence's own crop says nothing of how similar it is to the rest, which is what it is scored
on."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import rankdata

from ..constants import PROXY_KINDS
from ..cosine import unit_rows
from ..errors import BertflowError

__all__ = ["MIN_PAIRS", "PARTNERS", "Proxy", "build_proxy", "proxy_agreement", "proxy_ndcg",
           "proxy_text"]

MIN_PAIRS = 100  # fewer pairs than this give no interval worth the name
MIN_PART = 20  # characters in each half of a split document
MIN_WORDS = 6  # words in a sentence cropped in two
PARTNERS = 100  # other texts each query's neighbours are ranked over (`proxy_agreement`)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass
class Proxy:
    """Pairs (query, its relevant item) from a corpus, by where they come from (``first
    sentence → rest``, ``title → text``, ``two crops``), in corpus order; `skipped`: the
    items that gave none; `items`: how many were read."""

    kind: str
    groups: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    items: int = 0
    skipped: int = 0

    def __len__(self) -> int:
        return sum(len(queries) for queries, _ in self.groups.values())

    def embed(self, embed: Callable[[list[str]], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(queries, items) embedded by `embed`, one call per group and side (a group's list
        is cached as itself, whatever the others hold)."""
        parts = [(embed(q), embed(d)) for q, d in self.groups.values() if q]
        return np.concatenate([q for q, _ in parts]), np.concatenate([d for _, d in parts])

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "items": self.items, "skipped": self.skipped,
                "pairs": {name: len(q) for name, (q, _) in self.groups.items()}}


def build_proxy(kind: str, documents: Iterable[tuple[str, str]], limit: int = 10_000,
                seed: int = 0, name: str = "the corpus") -> Proxy:
    """The proxy of `kind` from (title, text) `documents`, read once, at most `limit` pairs (a
    seeded uniform sample, kept in corpus order) and never two with one relevant text; fewer
    than `MIN_PAIRS` pairs are refused, naming what would apply."""
    if kind not in PROXY_KINDS:
        raise BertflowError(f"unknown proxy {kind!r}; choose one of {', '.join(PROXY_KINDS)}")
    rng, kept, seen = np.random.default_rng(seed), [], set()
    proxy = Proxy(kind)
    for title, text in documents:
        proxy.items += 1
        pair = _split(text, title) if kind == "retrieval" else _crops(text)
        key = None if pair is None else hashlib.blake2b(pair[2].encode(), digest_size=8).digest()
        if key is None or key in seen:  # a repeated item would be two relevant ones
            proxy.skipped += 1
            continue
        seen.add(key)
        if len(kept) < limit:  # a uniform sample of `limit` pairs, streamed (reservoir)
            kept.append((len(seen), pair))
        elif (slot := int(rng.integers(len(seen)))) < limit:
            kept[slot] = (len(seen), pair)
    if len(seen) < MIN_PAIRS:
        what = ("distinct documents with a first sentence and a rest of more than "
                f"{MIN_PART} characters each, or a title and a text" if kind == "retrieval"
                else f"distinct sentences of {MIN_WORDS} words or more")
        hint = (": a corpus of single sentences without titles gives no retrieval proxy; "
                "--for sts crops sentences instead" if kind == "retrieval" else "")
        raise BertflowError(f"{name} is too small for a {kind} proxy: {len(seen)} of its "
                            f"{proxy.items} items are {what}; it needs {MIN_PAIRS}{hint}")
    pairs = [pair for _, pair in sorted(kept)]  # in corpus order
    for source, query, item in pairs:
        queries, items = proxy.groups.setdefault(source, ([], []))
        queries.append(query)
        items.append(item)
    return proxy


def _split(text: str, title: str) -> tuple[str, str, str] | None:
    """(source, query, relevant) of a document: its first sentence and the rest, else its
    title and its text, else None."""
    parts = _SENTENCE_END.split(text, maxsplit=1)
    if len(parts) == 2 and min(len(parts[0]), len(parts[1])) > MIN_PART:
        return "first sentence → rest", parts[0], parts[1]
    if title and text:
        return "title → text", title, text
    return None


def _crops(text: str) -> tuple[str, str, str] | None:
    """("two crops", the first 3/5 of the words, the last 3/5), overlapping by a fifth."""
    words = text.split()
    if len(words) < MIN_WORDS:
        return None
    cut = -(-3 * len(words) // 5)
    return "two crops", " ".join(words[:cut]), " ".join(words[len(words) - cut:])


def proxy_ndcg(queries: np.ndarray, items: np.ndarray, block: int = 1024) -> np.ndarray:
    """Per query, nDCG@10 of its one relevant item (the item of its row) when every item is
    ranked by cosine: 1 / log2(1 + rank) within the top 10, else 0; an item tied with the
    relevant one ranks above it, so that vectors that tell nothing apart score nothing."""
    if queries.shape != items.shape or queries.ndim != 2:
        raise BertflowError(f"proxy queries {queries.shape} and items {items.shape} differ")
    q, d = unit_rows(queries), unit_rows(items)
    ranks = np.empty(len(q), np.int64)
    for start in range(0, len(q), block):
        s = q[start:start + block] @ d.T
        own = s[np.arange(len(s)), np.arange(start, start + len(s))]
        ranks[start:start + block] = (s >= own[:, None]).sum(1)  # ties and itself
    return np.where(ranks <= 10, 1 / np.log2(1 + ranks), 0.0)


def proxy_agreement(queries: np.ndarray, items: np.ndarray, partners: int = PARTNERS,
                    seed: int = 0, block: int = 256) -> np.ndarray:
    """Per query, how alike its two halves rank other texts: the Spearman correlation, over
    `partners` other pairs drawn at random (seeded), of query i's cosines to their queries with
    item i's cosines to their items (0 where either side ties them all). A map that finds each
    crop's twin by what is particular to the sentence ranks the others by noise; one that keeps
    what sentences share ranks them alike from either half."""
    if queries.shape != items.shape or queries.ndim != 2 or len(queries) <= partners:
        raise BertflowError(f"proxy queries {queries.shape} and items {items.shape} give no "
                            f"{partners} partners a query")
    q, d, n = unit_rows(queries), unit_rows(items), len(queries)
    others = np.random.default_rng(seed).integers(0, n - 1, (n, partners))
    others += others >= np.arange(n)[:, None]  # never the query itself
    agreement = np.empty(n)
    for start in range(0, n, block):
        rows, picked = slice(start, start + block), others[start:start + block]
        a = rankdata(np.einsum("ij,ikj->ik", q[rows], q[picked]), axis=1)
        b = rankdata(np.einsum("ij,ikj->ik", d[rows], d[picked]), axis=1)
        a, b = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
        scale = np.sqrt((a * a).sum(1) * (b * b).sum(1))
        agreement[rows] = np.divide((a * b).sum(1), scale, out=np.zeros(len(a)),
                                    where=scale > 0)
    return agreement


def proxy_text(described: dict[str, object]) -> str:
    """A proxy's `Proxy.describe` in words: its pairs by source, and the items left out."""
    pairs = ", ".join(f"{n} {source}" for source, n in described["pairs"].items())
    return f"a {described['kind']} proxy of {pairs} pairs ({described['skipped']} of " \
           f"{described['items']} items gave none)"
