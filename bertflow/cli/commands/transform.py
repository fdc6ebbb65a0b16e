"""`bertflow transform`: apply a head to sentences or embeddings."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...constants import DEFAULT_BATCH_SIZE, POOLINGS
from ...errors import BertflowError
from ..checks import check_no_encoding, check_paths
from ..options import CACHE_HELP, HEAD_HELP, device_options, positive, quiet
from ..shared import head_and_encoder, load_encoder_of

SUMMARY = "apply a head to sentences or embeddings"
DESCRIPTION = """\
Transform sentences (encoded with the head's encoder and pooling) or embeddings from
`bertflow encode` with a head, into OUT.npy and a sidecar that records the head."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", type=Path, required=True, help=HEAD_HELP)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--sentences", type=Path, help="text file, one sentence per line")
    source.add_argument("--embeddings", type=Path, help="EMB.npy made by `bertflow encode`")
    p.add_argument("--out", type=Path, required=True, help="OUT.npy (+ OUT.meta.json)")
    p.add_argument("--encoder", default=None, help="encoder folder (default: the one the head "
                   "records, checked against its fingerprint)")
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="how --embeddings without a sidecar were pooled (checked against the "
                   "head)")
    p.add_argument("--encode-batch-size", dest="encode_batch_size", type=positive,
                   default=DEFAULT_BATCH_SIZE, help="sentences per encoder batch")
    p.add_argument("--cache", type=Path, default=None, help=CACHE_HELP + " (--sentences)")
    device_options(p)
    quiet(p)


def check(args: argparse.Namespace, launched: bool) -> None:
    """Refuse the encoder's options with --embeddings, which are not encoded."""
    if args.embeddings is not None:
        check_no_encoding(args, f"--embeddings {args.embeddings} are transformed as they are")


def run(args: argparse.Namespace) -> None:
    from ...embeddings.cache import EmbeddingCache
    from ...embeddings.file import open_embeddings
    from ...embeddings.outputs import check_destination, write_transformed
    from ...heads.head import Head
    from ...storage.corpus import Corpus
    from ...storage.files import Checked, meta_path, read_sentences, sha256_file

    check_paths(args)
    out = Checked(args.out, check_destination, also=[meta_path(args.out)])
    if args.sentences is not None:  # --pooling: how the sentences are encoded
        head, encoder = head_and_encoder(args)
        if head.pooling is None:
            raise BertflowError(f"{args.head} does not record its pooling: encode the "
                                "sentences, then transform --embeddings")
        pooling, max_length = head.settings(encoder)
        corpus = Corpus.from_sentences(read_sentences(args.sentences), str(args.sentences))
        x = EmbeddingCache(args.cache).files(corpus, encoder, pooling, max_length,
                                             args.encode_batch_size, args.progress)[pooling]
        z = head.transform(x.load())
        source = {"sentences_sha256": sha256_file(args.sentences)}
    else:  # --pooling: how the embeddings were (`head.check`)
        head = Head.load(args.head)
        given = load_encoder_of(args) if args.encoder else None
        x, origin = open_embeddings(args.embeddings, pooling=args.pooling, encoder=given)
        head.check(x.dim, origin["encoder"], origin["pooling"], origin["max_length"])
        z, source = head.transform(x.load()), origin["corpus"]
    write_transformed(args.out, z, head.describe(), source, out)
    print(f"wrote {args.out}: {z.shape[0]} × {z.shape[1]}")
