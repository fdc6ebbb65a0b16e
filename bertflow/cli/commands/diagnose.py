"""`bertflow diagnose`: plot anisotropy before and after a flow."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checks import check_paths
from ..options import head_or_flow_options
from ..shared import flow_options, head_and_encoder

SUMMARY = "plot anisotropy before and after a flow"
DESCRIPTION = """\
PNG plots of SENTENCES' embeddings before and after a head (or a flow fit on them):
singular-value spectrum, pair cosines, projection; of the encoder's input word
embeddings: norms by token frequency, top two singular directions coloured by
frequency, singular values; and, with --data, every method's alignment against
uniformity on STS-B."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sentences", type=Path, help="text file, one sentence per line")
    p.add_argument("--out", type=Path, required=True, help="folder for the PNG plots")
    p.add_argument("--head", type=Path, default=None,
                   help="apply this head (default: fit a flow on the sentences)")
    p.add_argument("--corpus", type=Path, default=None,
                   help="text whose token frequencies to plot (default: the sentences)")
    p.add_argument("--data", type=Path, default=None,
                   help="folder in SentEval's layout: also plot alignment_uniformity.png, every "
                        "method fit on SENTENCES (the flow: --head, if given) placed by its "
                        "uniformity and alignment on the STS-B dev and test pairs (alignment: "
                        "those with gold ≥ 4); without it, that plot is left out")
    head_or_flow_options(p)


def run(args: argparse.Namespace) -> None:
    from ...embeddings.cache import EmbeddingCache
    from ...evaluation.diagnose import diagnose
    from ...storage.files import read_sentences

    check_paths(args)
    sentences = read_sentences(args.sentences)
    corpus = read_sentences(args.corpus) if args.corpus else None
    head, encoder = head_and_encoder(args, flow=True)
    paths = diagnose(
        sentences, args.out, encoder, head=head, pooling=args.pooling, max_length=args.max_length,
        corpus=corpus, cache=EmbeddingCache(args.cache), recipe=flow_options(args),
        batch_size=args.encode_batch_size, progress=args.progress, data=args.data, say=print)[0]
    print("wrote " + ", ".join(str(p) for p in paths))
