"""`bertflow encode`: embed a corpus (one sentence per line, or BEIR's) into .npy."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checks import check_paths
from ..options import CACHE_HELP, CORPUS_HELP, encoder_options, quiet
from ..shared import load_encoder_of

SUMMARY = "embed a corpus (one sentence per line, or BEIR's) into .npy"
DESCRIPTION = """\
Embed every line of CORPUS (of a BEIR corpus.jsonl: title and text) with a frozen
encoder and a pooling into EMB.npy (float32, one row per line) and its sidecar
EMB.meta.json; resumable, and across processes
under torchrun. An encode interrupted at --out is neither continued nor discarded
without --resume or --restart."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("corpus", type=Path, help=CORPUS_HELP)
    p.add_argument("--out", type=Path, required=True, help="EMB.npy (+ EMB.meta.json)")
    encoder_options(p)
    interrupted = p.add_mutually_exclusive_group()
    interrupted.add_argument("--resume", action="store_true",
                             help="continue an interrupted encode of the same request where "
                                  "it stopped")
    interrupted.add_argument("--restart", action="store_true",
                             help="discard an interrupted encode at --out and start afresh")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--cache", type=Path, default=None, help=CACHE_HELP + ", read and filled")
    cache.add_argument("--no-cache", action="store_true", help="neither read nor fill the cache")
    quiet(p)


def run(args: argparse.Namespace) -> None:
    from ...embeddings.cache import EmbeddingCache, encode_to
    from ...embeddings.outputs import check_destination
    from ...runtime import distributed
    from ...storage.corpus import Corpus

    check_destination(args.out)
    check_paths(args)
    corpus = Corpus.from_file(args.corpus)
    encoder = load_encoder_of(args)
    args.pooling, args.max_length = encoder.defaults(args.pooling, args.max_length)
    cache = None if args.no_cache else EmbeddingCache(args.cache)
    encoded = encode_to(args.out, corpus, encoder, args.pooling, args.max_length,
                        args.encode_batch_size, cache=cache, resume=args.resume,
                        restart=args.restart, progress=args.progress)
    if distributed.is_main():
        print(f"wrote {args.out}: {len(corpus)} × {encoder.width(args.pooling)} "
              f"({encoder.id.name}, {args.pooling}, {encoder.precision}"
              f"{'' if encoded else ', from the cache'})")
