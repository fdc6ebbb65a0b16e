"""`bertflow search`: query an index built by `bertflow index`."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from ...constants import DEFAULT_BATCH_SIZE
from ...errors import BertflowError, BertflowWarning
from ..checks import feedback_of
from ..options import CACHE_HELP, Refused, device_options, feedback_options, positive, quiet
from ..shared import load_encoder_of, printable

SUMMARY = "query an index built by `bertflow index`"
DESCRIPTION = """\
The TOP nearest items of each query, by cosine after the index's head: rank, score,
id (a BEIR document's _id, else the line of the corpus) and the item. --json prints
one JSON object a query: its id, text and hits (id, score, item, line)."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", type=Path, required=True, help="folder made by `bertflow index`")
    queries = p.add_mutually_exclusive_group(required=True)
    queries.add_argument("--query", action="append", help="a query; repeat for several")
    queries.add_argument("--queries", type=Path, help="BEIR queries.jsonl, or one query a line")
    p.add_argument("--top", type=positive, default=10, help="hits per query")
    p.add_argument("--nprobe", type=positive, default=None,
                   help="inverted lists visited per query, IVF kinds (default: the index's)")
    p.add_argument("--ef-search", type=positive, default=None, metavar="N",
                   help="candidates kept while searching an HNSW graph (default: the index's)")
    feedback_options(p, recorded="the index")
    p.add_argument("--k", action=Refused, nargs="?", help=argparse.SUPPRESS,
                   const="hits per query are --top")
    p.add_argument("--encoder", default=None, help="encoder (default: the index's)")
    p.add_argument("--encode-batch-size", dest="encode_batch_size", type=positive,
                   default=DEFAULT_BATCH_SIZE, help="queries per encoder batch")
    p.add_argument("--cache", type=Path, default=None, help=CACHE_HELP)
    device_options(p)
    p.add_argument("--json", action="store_true", help="print JSON lines")
    quiet(p)


def run(args: argparse.Namespace) -> None:
    from ...data.beir import read_queries
    from ...embeddings.cache import EmbeddingCache
    from ...search.index import Index

    queries = read_queries(args.queries) if args.queries else {
        str(n): q for n, q in enumerate(args.query, 1)}
    if any(not q.strip() for q in queries.values()):
        raise BertflowError("empty query")
    index = Index.load(args.index)
    if args.nprobe is not None:
        index.nprobe = args.nprobe
    if args.ef_search is not None:
        index.ef_search = args.ef_search
    feedback = feedback_of(args, index.feedback, source="this index")
    if feedback != index.feedback:
        index.feedback = feedback
    hits_per_query = index.search(list(queries.values()), load_encoder_of(args, index), args.top,
                                  args.encode_batch_size, cache=EmbeddingCache(args.cache),
                                  progress=args.progress)
    short = sum(len(hits) < args.top for hits in hits_per_query)
    if short:
        why = (f"the index holds {len(index.items)} items" if len(index.items) < args.top else
               f"its nprobe {index.nprobe} visits too few of its lists (--nprobe)"
               if index.nprobe is not None else "the index found no more")
        warnings.warn(f"{short} of {len(queries)} queries got fewer than {args.top} hits: {why}",
                      BertflowWarning, stacklevel=1)
    for (key, query), hits in zip(queries.items(), hits_per_query, strict=True):
        if args.json:
            print(json.dumps({"id": key, "query": query, "hits": [
                {"id": h.id, "score": h.score, "item": h.item, "line": h.line} for h in hits]},
                ensure_ascii=False))
            continue
        print(printable(f"{key}  {query}" if args.queries else query))
        width = max((len(printable(hit.id)) for hit in hits), default=1)
        for rank, hit in enumerate(hits, 1):
            print(f"  {rank:3d}  {hit.score:.4f}  {printable(hit.id):<{width}}  "
                  f"{printable(hit.item)}")
