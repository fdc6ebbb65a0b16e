"""`bertflow index`: build a FAISS index of a corpus for search."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...constants import HNSW_DEFAULTS
from ..checks import check_paths, feedback_of
from ..options import (
    CACHE_HELP,
    CORPUS_HELP,
    encoder_options,
    feedback_options,
    integer,
    positive,
    quiet,
)
from ..shared import head_and_encoder

SUMMARY = "build a FAISS index of a corpus for search"
DESCRIPTION = """\
Encode CORPUS (one item per line, or a BEIR corpus.jsonl), transform it with a head,
and write a FAISS index of unit vectors (inner product = cosine) and the items' ids
(a BEIR document's _id, else its line) that `bertflow search` queries."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("corpus", type=Path, help=CORPUS_HELP)
    p.add_argument("--out", type=Path, required=True, help="index folder")
    p.add_argument("--head", type=Path, default=None, help="transform with this head, its "
                   "encoder and pooling (default: raw pooled vectors)")
    encoder_options(p, "the head's, else ")
    p.add_argument("--kind", default="flat", help="flat (exact), hnsw, or a FAISS index_factory "
                   "string (IVF1024,PQ32; trained on a seeded sample of the corpus)")
    p.add_argument("--dims", type=positive, default=None,
                   help="keep this many principal components, for a smaller index (default: all)")
    g = p.add_argument_group("hnsw", "The graph of --kind hnsw (FAISS's names; recorded)")
    g.add_argument("--hnsw-m", type=integer(2), default=None, metavar="M",
                   help=f"neighbours a node (default: {HNSW_DEFAULTS['M']})")
    g.add_argument("--ef-construction", type=positive, default=None, metavar="N",
                   help=f"candidates kept while building (default: "
                   f"{HNSW_DEFAULTS['ef_construction']})")
    g.add_argument("--ef-search", type=positive, default=None, metavar="N",
                   help=f"candidates kept while searching, saved with the index (default: "
                   f"{HNSW_DEFAULTS['ef_search']})")
    feedback_options(p, recorded="the head")  # the index records it: its searches repeat it
    p.add_argument("--cache", type=Path, default=None, help=CACHE_HELP)
    quiet(p)


def check(args: argparse.Namespace, launched: bool) -> None:
    """Refuse the sizes of --kind that no index can have, before anything is encoded."""
    from ...search.kinds import check_sizes

    check_sizes(args.kind)


def run(args: argparse.Namespace) -> None:
    from ...embeddings.cache import EmbeddingCache
    from ...search.index import Index
    from ...storage.artifacts import INDEX_FOLDER
    from ...storage.corpus import Corpus
    from ...training.choice import recorded_feedback

    INDEX_FOLDER.check_destination(args.out)
    check_paths(args)
    corpus = Corpus.from_file(args.corpus)
    head, encoder = head_and_encoder(args)
    hnsw = {k: v for k, v in (("M", args.hnsw_m), ("ef_construction", args.ef_construction),
                              ("ef_search", args.ef_search)) if v is not None}
    index = Index.build(corpus, encoder, head=head, pooling=args.pooling,
                        max_length=args.max_length, cache=EmbeddingCache(args.cache),
                        kind=args.kind, dims=args.dims, hnsw=hnsw or None,
                        feedback=feedback_of(args, recorded_feedback(head),
                                             source=args.head and "the head"),
                        batch_size=args.encode_batch_size, progress=args.progress)
    if index is None:  # another process of a torchrun job builds it
        return
    index.save(args.out)
    c = index.config
    trained = f" (trained on {c['trained_on']})" if c["trained_on"] else ""
    graph = ", ".join(f"{k} {v}" for k, v in c["hnsw"].items()) if "hnsw" in c else ""
    feedback = ", ".join(f"{k} {v}" for k, v in c["feedback"].items()) if "feedback" in c else ""
    print(f"wrote {args.out}: {c['count']} items, {c['kind']}{trained}"
          f"{f' ({graph})' if graph else ''}, {c['dims']}-d, {c['pooling']} pooling, "
          f"{'with' if head is not None else 'without'} a head"
          f"{f', feedback ({feedback})' if feedback else ''}")
