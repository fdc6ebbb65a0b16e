"""`bertflow fit`: fit a flow head on a corpus or on embeddings."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from ...constants import LINEAR_METHODS, PROXY_KINDS
from ...errors import BertflowError
from ..checks import check_no_encoding, flow_flags, given_flags
from ..options import CACHE_HELP, baseline_options, encoder_options, flow_arguments, quiet
from ..shared import flow_options

SUMMARY = "fit a flow head on a corpus or on embeddings"
DESCRIPTION = """\
Fit a Glow by maximum likelihood on the embeddings of CORPUS (encoded and cached) or
of EMB.npy, and save it as a head folder that records its encoder and pooling. With
--method identity, center, no-mean-direction, whitening, whitening-k, fractional, pca or abtt,
fit that linear map in closed form instead, as a head of the same format. With
--for retrieval or --for sts, choose the head without labels: every candidate (the identity,
the linear maps, the flow, a flow after the best (fractional) whitening; at --dims K, PCA,
whitening-k and fractional whitening to K) is fit on CORPUS (and --queries), scored on a proxy
task built from CORPUS itself (a document's first sentence finds the rest of it, else its
title its text; for sts, the first three fifths of a sentence find the last three fifths), and
the baseline (the identity; PCA at --dims) is kept unless a candidate beats it by more than the
joint 95% bootstrap interval of their difference (joint: holding for all the candidates at
once) and, for sts, also beats it so on how alike it ranks the other sentences from either
crop (neighbour agreement: finding a crop's twin is not what a head for sentence similarity is
scored on). For retrieval, pseudo-relevance feedback on the baseline (k 1, 3, 5, 10 documents,
β 0.25, 0.5, 1) is a candidate too, each proxy query's own item left out of the documents it
feeds back; a head chosen with it records it, and `index` and `eval retrieval` apply it. The
table is printed, and the head saved with it in its config."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, help="CORPUS.txt, or EMB.npy made by `bertflow encode`")
    p.add_argument("--out", type=Path, required=True, help="folder to write the head to")
    p.add_argument("--for", dest="choose_for", choices=PROXY_KINDS, default=None,
                   help="choose the head on a proxy task of this kind built from CORPUS, "
                        "without labels (instead of --method)")
    p.add_argument("--queries", type=Path, default=None, metavar="LOG",
                   help="with --for: unlabeled queries (a text file, one a line, or a BEIR "
                        "queries.jsonl) that join CORPUS in every candidate's fit; a head fit "
                        "with them refuses to be scored on any of them")
    p.add_argument("--method", choices=("flow", *LINEAR_METHODS), default=None,
                   help="the flow, or a closed-form linear map: the identity (raw), the mean "
                        "removed, the mean's direction projected out, BERT-whitening, whitening "
                        "to --dims components, fractional whitening (--gamma), PCA to --dims "
                        "components, all-but-the-top (--d directions)")
    baseline_options(p)
    encoder_options(p, "the embeddings' sidecar's, else ")
    p.add_argument("--cache", type=Path, default=None, help=CACHE_HELP)
    g = flow_arguments(p)
    g.add_argument("--logdir", type=Path, default=None,
                   help="write TensorBoard logs to a new subfolder TIME-seedN of this folder "
                        "(removed if the fit fails and cannot be resumed; a run resumed from "
                        "--checkpoint continues the subfolder the checkpoint names)")
    g.add_argument("--checkpoint", type=Path, default=None,
                   help="training state, saved each epoch; a file of its own: never an input "
                        "or output of the run, nor an existing file other than a checkpoint "
                        "of this same run")
    g.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint, a run of the same settings and data; a "
                        "larger --epochs extends it (from where it resumes, the learning rate "
                        "follows the cosine over the new total)")
    g.add_argument("--dev-sts", type=Path, default=None, metavar="DATA",
                   help="after each epoch, score the STS-B dev set of DATA (SentEval's layout: "
                        "DATA/STSBenchmark/sts-dev.csv), embedded like the training "
                        "embeddings, and print and log its Spearman")
    quiet(g)


def check(args: argparse.Namespace, launched: bool) -> None:
    """Refuse the encoder's options for embeddings encoded already, and a checkpoint, resume
    or log folder that cannot be; with --for, what a choice cannot take (its --dims is kept as
    `args.dims`, the candidates')."""
    args.dims = None  # the components the candidates keep, with --for
    if args.choose_for is not None:
        given = given_flags(args, ("method", "d", "shrinkage", "gamma", "checkpoint", "resume",
                                   "logdir", "dev_sts"))
        if given:
            raise BertflowError(f"--for {args.choose_for} chooses the method: {', '.join(given)} "
                                "cannot apply")
        if launched:
            raise BertflowError(f"--for {args.choose_for} runs in one process, not under "
                                "torchrun")
        flow = flow_flags(args)
        if args.k is not None and flow:
            raise BertflowError(f"--dims chooses among linear heads: {', '.join(flow)} cannot "
                                "apply")
        args.dims, args.k = args.k, None  # not the method's: there is none yet
        return  # the rest, embeddings given included, the fit job refuses (`_proxy`)
    if args.queries is not None:
        raise BertflowError("--queries applies with --for retrieval or --for sts")
    args.method = args.method or "flow"
    if args.input.suffix == ".npy":  # --dev-sts encodes; --device places a torchrun job too
        unused = ("dtype",) if args.dev_sts else ("dtype", "encode_batch_size", "cache")
        check_no_encoding(args, f"{args.input} holds embeddings, encoded already",
                          unused if args.dev_sts or launched else ("device", *unused))
    if args.checkpoint is not None and args.checkpoint.is_dir():
        raise BertflowError(f"--checkpoint {args.checkpoint} is a folder; expected a file")
    if args.resume and args.checkpoint is None:
        raise BertflowError("--resume needs --checkpoint FILE")
    if args.logdir is not None and args.logdir.exists() and not args.logdir.is_dir():
        raise BertflowError(f"--logdir {args.logdir} exists and is not a folder")


def run(args: argparse.Namespace) -> None:
    from ...config import nll_text
    from ...export.card import summary
    from ...training.choice import format_choice
    from ...training.job import FitJob, run_fit
    from ...training.proxy import proxy_text
    from ...training.spec import MethodSpec

    method = MethodSpec(args.method or "flow", args.k, args.d, args.shrinkage,
                        flow_options(args) if args.method in (None, "flow") else None, args.gamma)
    job = FitJob(args.input, args.out, method, encoder=args.encoder, pooling=args.pooling,
                 max_length=args.max_length, batch_size=args.encode_batch_size,
                 device=args.device, dtype=args.dtype, cache=args.cache,
                 checkpoint=args.checkpoint, resume=args.resume, logdir=args.logdir,
                 dev_sts=args.dev_sts, choose_for=args.choose_for, queries=args.queries,
                 dims=args.dims)
    say = None if args.progress is False else functools.partial(print, file=sys.stderr)
    fitted = run_fit(job, say=say, progress=args.progress)
    if fitted is None:  # another process of a torchrun job
        return
    if args.choose_for is not None:
        choice = fitted.choice
        print(format_choice(choice.rows))
        print(f"wrote {args.out}: {choice.reason()}, on {proxy_text(choice.proxy)}")
        return
    if args.method != "flow":
        print(f"wrote {args.out}: {summary(fitted.head)}")
        return
    info = fitted.head.training_info
    print(f"wrote {args.out}: best epoch {info['best_epoch']} of {info['epochs_run']}, "
          f"val NLL {nll_text(info) or 'unknown'}")
    if fitted.logs is not None:
        print(f"TensorBoard logs in {fitted.logs}")
