"""The `bertflow` command: parse arguments, call the library, print."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, NoReturn

from .constants import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_ENCODER_NAME,
    DEFAULT_MAX_LENGTH,
    DEFAULT_POOLING,
    DTYPES,
    LINEAR_METHODS,
    METHODS,
    POOLINGS,
    TASKS,
)
from .errors import BertflowError, PeerError, first_line

__all__ = ["main"]

EXPORT_FORMATS = ("sentence-transformers", "onnx", "torch-export")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option with its default (where it has one worth showing); descriptions as
    written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if any(action.default is v for v in (None, False, argparse.SUPPRESS)) \
                or "%(default)" in text:
            return text
        return super()._get_help_string(action) or text


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bertflow", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a failure (or set BERTFLOW_DEBUG=1)")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = _command(commands, "encode", "embed a corpus (one sentence per line) into .npy", """
        Embed every line of CORPUS with a frozen encoder and a pooling into EMB.npy (float32,
        one row per line) and its sidecar EMB.meta.json; resumable, and across processes
        under torchrun.""")
    p.add_argument("corpus", type=Path, help="text file, one sentence per line")
    p.add_argument("--out", type=Path, required=True, help="EMB.npy (+ EMB.meta.json)")
    _encoder_options(p)
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted encode of the same request where it stopped")
    p.add_argument("--cache", type=Path, default=None, help=_CACHE_HELP + ", read and filled")
    p.add_argument("--no-cache", action="store_true", help="neither read nor fill the cache")
    _quiet(p)
    p.set_defaults(run=_encode)

    p = _command(commands, "fit", "fit a flow head on a corpus or on embeddings", """
        Fit a Glow by maximum likelihood on the embeddings of CORPUS (encoded and cached) or
        of EMB.npy, and save it as a head folder that records its encoder and pooling. With
        --method whitening, whitening-k or abtt, fit that baseline in closed form instead, as
        a head of the same format.""")
    p.add_argument("input", type=Path, help="CORPUS.txt, or EMB.npy made by `bertflow encode`")
    p.add_argument("--out", type=Path, required=True, help="folder to write the head to")
    p.add_argument("--method", choices=("flow", *LINEAR_METHODS), default="flow",
                   help="the flow, or a closed-form baseline: BERT-whitening, whitening to "
                        "--k components, all-but-the-top (--d directions)")
    p.add_argument("--k", type=_positive, default=None,
                   help="components kept by whitening-k (default: a third of the dimension)")
    p.add_argument("--d", type=_natural, default=None,
                   help="directions removed by abtt (default: a hundredth of the dimension)")
    _encoder_options(p, pooling_default=None,
                     pooling_help=f"the embeddings' sidecar's, else {DEFAULT_POOLING}")
    p.add_argument("--cache", type=Path, default=None, help=_CACHE_HELP)
    g = _flow_options(p)
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
    _quiet(g)
    p.set_defaults(run=_fit)

    p = _command(commands, "transform", "apply a head to sentences or embeddings", """
        Transform sentences (encoded with the head's encoder and pooling) or embeddings from
        `bertflow encode` with a head, into OUT.npy and a sidecar that records the head.""")
    p.add_argument("--head", type=Path, required=True, help=_HEAD_HELP)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--sentences", type=Path, help="text file, one sentence per line")
    source.add_argument("--embeddings", type=Path, help="EMB.npy made by `bertflow encode`")
    p.add_argument("--out", type=Path, required=True, help="OUT.npy (+ OUT.meta.json)")
    p.add_argument("--encoder", default=None, help=_ENCODER_OF_HEAD)
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="how --embeddings without a sidecar were pooled (checked against the "
                   "head)")
    p.add_argument("--encode-batch-size", dest="encode_batch_size", type=_positive,
                   default=DEFAULT_BATCH_SIZE, help="sentences per encoder batch")
    _device_options(p)
    _quiet(p)
    p.set_defaults(run=_transform)

    p = _command(commands, "eval", "score the STS tasks of a data folder", """
        Spearman correlation × 100 of cosine similarity with human scores on the STS tasks
        found in DATA (SentEval's layout), for a fitted head or for a method fit on each task's
        own sentences (no scores) or on a text file.""")
    p.add_argument("--data", type=Path, required=True, help="folder in SentEval's layout")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--head", type=Path, help="score a fitted head (its encoder and pooling)")
    which.add_argument("--method", choices=METHODS, default=None, help="default: flow")
    p.add_argument("--fit-on", default=None,
                   help="'target' (each task's own sentences, no scores; the default) or a "
                        "text file of sentences")
    p.add_argument("--k", type=_positive, default=None,
                   help="components kept by whitening-k (default: a third of the dimension)")
    p.add_argument("--d", type=_natural, default=None,
                   help="directions removed by abtt (default: a hundredth of the dimension)")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS),
                   help="tasks to score, where DATA has them")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    _encoder_options(p, pooling_default=None,
                     pooling_help=f"the head's, else {DEFAULT_POOLING}")
    p.add_argument("--cache", type=Path, default=None, help=_CACHE_HELP)
    _quiet(_flow_options(p))
    p.set_defaults(run=_eval)

    p = _command(commands, "diagnose", "plot anisotropy before and after a flow", """
        Four PNG plots of SENTENCES' embeddings before and after a head (or a flow fit on
        them): singular-value spectrum, pair cosines, token norms by frequency, projection.""")
    p.add_argument("sentences", type=Path, help="text file, one sentence per line")
    p.add_argument("--out", type=Path, required=True, help="folder for the PNG plots")
    p.add_argument("--head", type=Path, default=None,
                   help="apply this head (default: fit a flow on the sentences)")
    p.add_argument("--corpus", type=Path, default=None,
                   help="text whose token frequencies to plot (default: the sentences)")
    _encoder_options(p, pooling_default=None,
                     pooling_help=f"the head's, else {DEFAULT_POOLING}")
    p.add_argument("--cache", type=Path, default=None, help=_CACHE_HELP)
    _quiet(_flow_options(p))
    p.set_defaults(run=_diagnose)

    p = _command(commands, "export", "write a head for use without bertflow's CLI", """
        A sentence-transformers folder (encoder, pooling and head; load it with
        bertflow.pipeline.load_pipeline), a self-contained ONNX file, or a torch.export
        program.""")
    p.add_argument("--head", type=Path, required=True, help=_HEAD_HELP)
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS, help="what to write")
    p.add_argument("--out", type=Path, required=True,
                   help="a folder (sentence-transformers), HEAD.onnx or HEAD.pt2")
    p.add_argument("--encoder", default=None,
                   help="encoder of a sentence-transformers pipeline (default: the head's)")
    p.add_argument("--normalize", action="store_true",
                   help="end the sentence-transformers pipeline with L2 normalisation")
    p.set_defaults(run=_export)

    p = _command(commands, "index", "build a FAISS index of a corpus for search", """
        Encode CORPUS (one item per line), transform it with a head, and write a FAISS index
        of unit vectors (inner product = cosine) that `bertflow search` queries.""")
    p.add_argument("corpus", type=Path, help="text file, one item per line")
    p.add_argument("--out", type=Path, required=True, help="index folder")
    p.add_argument("--head", type=Path, default=None,
                   help="transform with this head (its encoder and pooling); default: raw "
                        "pooled vectors")
    _encoder_options(p, pooling_default=None,
                     pooling_help=f"the head's, else {DEFAULT_POOLING}")
    p.add_argument("--kind", choices=("flat", "hnsw"), default="flat",
                   help="exact inner product or an HNSW graph")
    p.add_argument("--dims", type=_positive, default=None,
                   help="keep this many principal components (smaller index; default: all)")
    p.add_argument("--cache", type=Path, default=None, help=_CACHE_HELP)
    _quiet(p)
    p.set_defaults(run=_index, max_length=None)  # default: the head's, else 128

    p = _command(commands, "search", "query an index built by `bertflow index`", """
        The K nearest items of each query, by cosine after the index's head, with the line
        of the corpus each item came from.""")
    p.add_argument("--index", type=Path, required=True, help="folder made by `bertflow index`")
    queries = p.add_mutually_exclusive_group(required=True)
    queries.add_argument("--query", action="append", help="a query; repeat for several")
    queries.add_argument("--queries", type=Path, help="text file, one query per line")
    p.add_argument("--k", type=_positive, default=10, help="hits per query")
    p.add_argument("--encoder", default=None, help="encoder (default: the index's)")
    _device_options(p)
    p.add_argument("--json", action="store_true", help="print JSON lines")
    p.set_defaults(run=_search)

    p = _command(commands, "info", "describe a head, or list the ready heads", """
        What a head is (encoder, pooling, flow, how it was fit). Without HEAD, the ready heads
        that come with bertflow, loadable by name.""")
    p.add_argument("head", type=Path, nargs="?", default=None, help=_HEAD_HELP)
    p.add_argument("--json", action="store_true", help="print the head's config.json")
    p.set_defaults(run=_info)
    return parser


_DESCRIPTION = """\
Isotropic sentence embeddings with a normalizing flow (BERT-flow): encode a corpus, fit a flow
head on it, and use the head to transform embeddings before cosine similarity, in STS
evaluation, plots, exports and search. `bertflow COMMAND --help` tells more."""
_HEAD_HELP = "a head folder, or the name of a ready head (`bertflow info` lists them)"
_ENCODER_OF_HEAD = ("encoder folder (default: the one the head records, checked against its "
                    "fingerprint)")
_CACHE_HELP = "embedding cache folder (default: $BERTFLOW_CACHE, else ~/.cache/bertflow)"


def _command(commands: Any, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    return commands.add_parser(name, help=summary,
                               description=textwrap.dedent(description).strip())


def _quiet(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bars or epoch lines")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from . import distributed  # after parsing: `--help` needs no torch

    debug = args.debug or os.environ.get("BERTFLOW_DEBUG", "") not in ("", "0")
    where = ""
    try:
        if distributed.launched():
            where = f"[rank {os.environ.get('RANK', '?')}] "
            _join_processes(args)
        args.run(args)
    except PeerError:
        return 1  # the process that failed says why
    except KeyboardInterrupt:
        print("bertflow: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # every failure ends in one line, unless asked for the traceback
        if debug:
            raise
        print(f"bertflow: error: {where}{_one_line(e)}", file=sys.stderr)
        return 1
    finally:
        distributed.leave()
    return 0


def _one_line(error: Exception) -> str:
    """What a failure says in one line: bertflow's own message, a file error with its file,
    or anything else with its kind and a pointer to --debug."""
    if isinstance(error, BertflowError):
        return str(error)
    from .files import disk_error

    full = disk_error(error, getattr(error, "filename", None) or "a file")
    if full is not None:
        return str(full)
    if isinstance(error, OSError):
        name = f": {error.filename}" if error.filename else ""
        return f"{error.strerror or first_line(error)}{name}"
    return (f"unexpected {type(error).__name__}: {first_line(error)} (run with --debug for "
            "the traceback)")


def _join_processes(args: argparse.Namespace) -> None:
    """Under torchrun: only encode, fit and index split their work across processes."""
    from . import distributed
    from .encoder import resolve_device

    if args.command not in ("encode", "fit", "index"):
        raise BertflowError(f"bertflow {args.command} runs in one process; under torchrun "
                            "only encode, fit and index split their work")
    device = distributed.local_device(resolve_device(args.device))
    args.device = str(device)
    distributed.init(device)


def _encoder_options(
    p: argparse.ArgumentParser,
    pooling_default: str | None = DEFAULT_POOLING,
    pooling_help: str | None = None,
) -> None:
    p.add_argument("--encoder", default=None,
                   help=f"Hugging Face encoder folder (default: {DEFAULT_ENCODER_NAME}, which "
                        "comes with bertflow)")
    p.add_argument(
        "--pooling", choices=POOLINGS, default=pooling_default,
        help="how token states become one vector" + (
            "" if pooling_default else f" (default: {pooling_help or DEFAULT_POOLING})"),
    )
    p.add_argument("--max-length", type=_max_length, default=DEFAULT_MAX_LENGTH,
                   help="tokens per sentence; longer sentences are truncated")
    p.add_argument("--encode-batch-size", dest="encode_batch_size", type=_positive,
                   default=DEFAULT_BATCH_SIZE, help="sentences per encoder batch")
    _device_options(p)


def _device_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="precision of the encoder (embeddings and files stay float32)")


def _flow_options(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    g = p.add_argument_group("flow")
    g.add_argument("--levels", type=_positive, default=3,
                   help="levels of the multi-scale Glow (half the features leave after each)")
    g.add_argument("--depth", type=_positive, default=3,
                   help="steps per level (ActNorm, mixing, coupling)")
    g.add_argument("--coupling", choices=("additive", "affine"), default="additive",
                   help="coupling layer")
    g.add_argument("--hidden", type=_positive, default=32, help="conditioner width")
    g.add_argument("--linear", choices=("reverse", "lu"), default="reverse",
                   help="mixing layer: fixed reversal (as released) or learned LU")
    g.add_argument("--no-standardize", action="store_true", help="feed raw embeddings to the flow")
    g = p.add_argument_group("training")
    g.add_argument("--seed", type=_seed, default=0, help="seeds the split, order and weights")
    g.add_argument("--epochs", type=_positive, default=None,
                   help="passes over the data (default: TrainConfig's)")
    g.add_argument("--batch-size", type=_positive, default=None,
                   help="embeddings per flow minibatch (default: TrainConfig's)")
    g.add_argument("--lr", type=_positive_float, default=None,
                   help="Adam's learning rate, decayed along a cosine (default: TrainConfig's)")
    g.add_argument("--val-fraction", type=_fraction, default=None,
                   help="held-out share of the rows, in [0, 1) (default: TrainConfig's)")
    g.add_argument("--patience", type=_natural, default=None,
                   help="epochs without a better held-out NLL before stopping; 0 never stops "
                        "(default: TrainConfig's)")
    return g


# Types of the numeric options: a bad value is argparse's one-line usage error (exit 2), given
# before any work, whatever else the command would do first.

def _integer(text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low or (high is not None and value >= high):
        bounds = f"at least {low}" if high is None else f"in [{low}, {high})"
        raise argparse.ArgumentTypeError(f"must be an integer {bounds}, got {value}")
    return value


def _positive(text: str) -> int:
    return _integer(text, 1)


def _natural(text: str) -> int:
    return _integer(text, 0)


def _max_length(text: str) -> int:
    return _integer(text, 2)


def _seed(text: str) -> int:
    return _integer(text, 0, 2**32)


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _finite(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _finite(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _flow_configs(args: argparse.Namespace) -> tuple[Any, Any]:
    from .flow import FlowConfig
    from .train import TrainConfig

    flow = FlowConfig(args.levels, args.depth, args.coupling, args.hidden, args.linear)
    overrides = {
        k: getattr(args, k)
        for k in ("epochs", "batch_size", "lr", "val_fraction", "patience")
        if getattr(args, k, None) is not None
    }
    return flow, TrainConfig(seed=args.seed, **overrides)


def _encode(args: argparse.Namespace) -> None:
    from . import distributed
    from .cache import EmbeddingCache, encode_to
    from .corpus import Corpus
    from .embeddings import check_destination

    check_destination(args.out)
    corpus = Corpus.from_file(args.corpus)
    encoder = _load_encoder(args)
    cache = None if args.no_cache else EmbeddingCache(args.cache)
    encoded = encode_to(args.out, corpus, encoder, args.pooling, args.max_length,
                        args.encode_batch_size, cache=cache, resume=args.resume,
                        progress=False if args.quiet else None)
    if distributed.is_main():
        print(f"wrote {args.out}: {len(corpus)} × {encoder.width(args.pooling)} "
              f"({encoder.id.name}, {args.pooling}, {encoder.precision}"
              f"{'' if encoded else ', from the cache'})")


def _fit(args: argparse.Namespace) -> None:
    from . import distributed
    from .head import FlowHead, check_destination
    from .train import read_checkpoint

    if args.method != "flow":
        return _fit_linear(args)
    if args.k is not None or args.d is not None:
        raise BertflowError("--k and --d apply to --method whitening-k and abtt")
    if args.checkpoint is not None and args.checkpoint.is_dir():
        raise BertflowError(f"--checkpoint {args.checkpoint} is a folder; expected a file")
    if args.resume and args.checkpoint is None:
        raise BertflowError("--resume needs --checkpoint FILE")
    if args.logdir is not None and args.logdir.exists() and not args.logdir.is_dir():
        raise BertflowError(f"--logdir {args.logdir} exists and is not a folder")
    flow, train = _flow_configs(args)
    check_destination(args.out)
    dev = _read_dev(args.dev_sts) if args.dev_sts is not None else None
    saved = None
    if args.checkpoint is not None:
        _check_checkpoint_path(args.checkpoint, _fit_paths(args))
        saved = read_checkpoint(args.checkpoint)
        if saved is None and args.checkpoint.exists():
            raise BertflowError(f"{args.checkpoint} is not a bertflow training checkpoint"
                                + ("" if args.resume else "; not overwriting it"))
    x, origin = _training_embeddings(args)
    if args.checkpoint is not None and isinstance(getattr(x, "path", None), Path):
        _check_checkpoint_path(args.checkpoint, [("the embeddings file", x.path, False),
                                                 ("its sidecar", _meta_path(x.path), False)])
    run = {
        "flow": flow.to_dict(),
        "train": train.to_dict(),
        "standardize": not args.no_standardize,
        "encoder": origin["encoder"].fingerprint if origin["encoder"] else None,
        "pooling": origin["pooling"],
        "max_length": origin["max_length"],
        "data": origin["data"],
    }
    extended = saved is not None and args.resume and _extends(saved.run, run)
    if saved is not None and saved.run != run and not extended:
        raise BertflowError(f"{args.checkpoint} was written by a run with other settings or data"
                            + ("" if args.resume else "; not overwriting it"))
    state = saved.state if saved is not None and args.resume else None
    main = distributed.is_main()
    if main and not args.quiet and extended:
        stopped = bool(train.patience) and state.bad_epochs >= train.patience
        print(f"extending the run in {args.checkpoint} from {saved.run['train']['epochs']} to "
              f"{train.epochs} epochs: from step {state.step + 1} on, the learning rate follows "
              f"the cosine over {train.epochs} epochs" + (
                  f" (but it stopped early, after {train.patience} epochs without a better "
                  "held-out NLL: it ends there)" if stopped else ""), file=sys.stderr)
    if main and not args.quiet and state is None and (saved is not None or args.resume):
        print(f"{args.checkpoint} holds an earlier state of this run: starting afresh "
              "(--resume continues it)" if saved is not None else
              f"no checkpoint at {args.checkpoint} yet: starting afresh", file=sys.stderr)
    measure = _dev_measure(args, dev, x, origin) if dev is not None else None

    logs, made = None, []  # this run's log folder, and the folders made for it
    recorded = saved.logs if saved is not None and state is not None else None
    if args.logdir is not None and main:
        logs, made = _log_folder(args.logdir, train.seed, recorded)
    written = False  # whether a checkpoint of this run names `logs`
    step = state.step if state is not None else 0  # the last step done

    def on_epoch_end(s: Any) -> None:
        nonlocal written, step
        if not main:
            return
        step = s.step
        if not args.quiet:
            e = s.history.epochs[-1]
            dev_line = f", dev Spearman {e['dev_spearman']:.2f}" if "dev_spearman" in e else ""
            print(
                f"epoch {int(e['epoch'])}/{train.epochs}: train {e['train_nll']:.3f} "
                f"val {e['val_nll']:.3f} nats ({e['val_bits_per_dim']:.4f} bits/dim), "
                f"val cosine {e['val_cosine']:.3f}{dev_line}",
                file=sys.stderr,
            )
        if args.checkpoint is not None:
            s.save(args.checkpoint, run, logs=logs.name if logs is not None else recorded)
            written = True

    done = False  # the head fitted and saved
    writer = None
    try:
        if logs is not None:
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run hides what the interrupted one logged after its checkpoint
            writer = SummaryWriter(str(logs),
                                   purge_step=state.step + 1 if state is not None else None)
        try:
            head = FlowHead.fit(
                x,
                encoder=origin["encoder"],
                pooling=origin["pooling"],
                max_length=origin["max_length"],
                flow=flow,
                train=train,
                standardize=not args.no_standardize,
                corpus=origin["corpus"],
                writer=writer,
                state=state,
                on_epoch_end=on_epoch_end,
                measure=measure,
                progress=not args.quiet,
            )
        except (RuntimeError, KeyError, TypeError, ValueError) as e:
            if state is None or isinstance(e, BertflowError):
                raise
            raise BertflowError(
                f"{args.checkpoint} does not fit this run ({first_line(e)})") from None
        if main:
            head.save(args.out)
        done = True
        if writer is not None:
            from .train import log_hparams

            hparams = {**run, "encoder": origin["encoder"].name if origin["encoder"] else None,
                       "data": origin["corpus"].get("file"),
                       "corpus_size": head.training_info["corpus"]["size"]}
            log_hparams(writer, hparams, head.history, step)
    finally:
        if writer is not None:
            writer.close()
        resumable = written or (logs is not None and state is not None and logs.name == recorded)
        if logs is not None and not done and not resumable:  # leave --logdir as it was
            _remove_made(logs, made)
    if not main:
        return
    info = head.training_info
    print(
        f"wrote {args.out}: best epoch {info['best_epoch']} of {info['epochs_run']}, "
        f"val NLL {info['val_nll']:.3f} nats ({info['val_bits_per_dim']:.4f} bits/dim)"
    )
    if logs is not None:
        print(f"TensorBoard logs in {logs}")


def _extends(saved: dict[str, Any], run: dict[str, Any]) -> bool:
    """Whether `run` is the run a checkpoint records (`saved`) asked for more epochs."""
    train = saved.get("train")
    if not isinstance(train, dict) or not isinstance(train.get("epochs"), int):
        return False
    epochs = run["train"]["epochs"]
    return train["epochs"] < epochs and {**saved, "train": {**train, "epochs": epochs}} == run


def _read_dev(data: Path) -> Any:
    """The STS-B dev pairs of `--dev-sts DATA` (DATA/STSBenchmark, or DATA itself)."""
    from .sts import read_stsb

    for folder in (data / "STSBenchmark", data):
        if (folder / "sts-dev.csv").is_file():
            return read_stsb(folder, "dev")
    raise BertflowError(f"--dev-sts {data} holds no STSBenchmark/sts-dev.csv (STS-B in "
                        "SentEval's layout)")


def _dev_measure(args: argparse.Namespace, dev: Any, x: Any,
                 origin: dict[str, Any]) -> Any:
    """What `--dev-sts` measures after each epoch: the Spearman × 100 of the STS-B dev pairs'
    cosines in the latent space of the model being fit (NaN where undefined), the sentences
    embedded with the training embeddings' encoder, precision, pooling and max length, through
    the embedding cache."""
    import numpy as np
    import torch

    from .cache import EmbeddingCache
    from .encoder import load_encoder
    from .sts import pair_spearman

    made_by = origin["encoder"]
    if made_by is None:
        raise BertflowError(f"--dev-sts needs the encoder that made {args.input}, which has no "
                            "sidecar naming one; pass --encoder with it")
    if args.encoder is None and made_by.name != DEFAULT_ENCODER_NAME:
        raise BertflowError(f"--dev-sts needs the encoder that made {args.input} "
                            f"({made_by.name}); pass --encoder with its folder")
    if args.checkpoint is not None:
        _check_checkpoint_path(args.checkpoint, [
            ("the embedding cache", EmbeddingCache(args.cache).root, True),
            ("the --dev-sts folder", args.dev_sts, True)])
    precision = (getattr(x, "meta", None) or {}).get("precision") or args.dtype
    encoder = load_encoder(args.encoder, args.device, precision)
    if encoder.id.fingerprint != made_by.fingerprint:
        raise BertflowError(f"--dev-sts: {args.input} was made by encoder {made_by}, not by "
                            f"{encoder.id}")
    sentences = dev.sentences()
    vectors = np.array(EmbeddingCache(args.cache).encode(
        sentences, encoder, origin["pooling"], origin["max_length"], args.encode_batch_size,
        progress=False if args.quiet else None), dtype=np.float32)

    def measure(model: torch.nn.Module) -> dict[str, float]:
        z = model(torch.from_numpy(vectors))[0].double().cpu().numpy()
        value = pair_spearman(dev, sentences, z)
        return {"dev_spearman": math.nan if value is None else value}

    return measure


def _fit_linear(args: argparse.Namespace) -> None:
    """`fit --method whitening|whitening-k|abtt`: a baseline head in closed form."""
    from . import distributed
    from .head import FlowHead, check_destination

    flow_only = [flag for flag, given in (("--checkpoint", args.checkpoint), ("--resume",
                 args.resume), ("--logdir", args.logdir), ("--dev-sts", args.dev_sts)) if given]
    if flow_only:
        raise BertflowError(f"{', '.join(flow_only)} apply to --method flow only")
    if (args.k is not None and args.method != "whitening-k") or (
            args.d is not None and args.method != "abtt"):
        raise BertflowError("--k applies to --method whitening-k, --d to --method abtt")
    check_destination(args.out)
    x, origin = _training_embeddings(args)
    if not distributed.is_main():
        return
    head = FlowHead.fit_linear(x, args.method, k=args.k, d=args.d, encoder=origin["encoder"],
                               pooling=origin["pooling"], max_length=origin["max_length"],
                               corpus=origin["corpus"])
    head.save(args.out)
    print(f"wrote {args.out}: {head.summary()}")


def _fit_paths(args: argparse.Namespace) -> list[tuple[str, Path, bool]]:
    """What `fit` reads and writes besides its checkpoint: (what, path, whether a folder)."""
    from .cache import EmbeddingCache

    paths = [("the input", args.input, False), ("the --out folder", args.out, True)]
    if args.input.suffix == ".npy":
        paths.append(("the input's sidecar", _meta_path(args.input), False))
    else:
        paths.append(("the embedding cache", EmbeddingCache(args.cache).root, True))
    if args.logdir is not None:
        paths.append(("the --logdir folder", args.logdir, True))
    if args.encoder is not None and Path(args.encoder).is_dir():
        paths.append(("the encoder folder", Path(args.encoder), True))
    return paths


def _check_checkpoint_path(checkpoint: Path, paths: list[tuple[str, Path, bool]]) -> None:
    """Refuse a --checkpoint that is one of `paths`, inside one that is a folder, or above one
    (compared resolved, and by inode where both exist: symbolic and hard links), or a link."""
    from .files import same_file

    for what, path, folder in paths:
        if same_file(checkpoint, path):
            raise BertflowError(f"--checkpoint {checkpoint} is {what}; give it a path of its own")
        inside = folder and path.resolve() in checkpoint.resolve().parents
        if inside or checkpoint.resolve() in path.resolve().parents:
            where = "inside" if inside else "a folder above"
            raise BertflowError(f"--checkpoint {checkpoint} is {where} {what} {path}; "
                                "give it a path of its own")
    if checkpoint.is_symlink():
        raise BertflowError(f"--checkpoint {checkpoint} is a symbolic link; give the path it "
                            "points to")


def _meta_path(npy: Path) -> Path:
    from .files import meta_path

    return meta_path(npy)


def _log_folder(logdir: Path, seed: int, recorded: str | None) -> tuple[Path, list[Path]]:
    """This run's TensorBoard folder inside `logdir`: `recorded`, the one named by the
    checkpoint a run resumes, else a new TIME-seedN; and the folders made for it, innermost
    first (the run's folder, then any missing parents, `logdir` included)."""
    made = [p for p in (logdir, *logdir.parents) if not p.exists()]
    if recorded and recorded == Path(recorded).name and recorded not in (".", ".."):
        folder = logdir / recorded
        if not folder.exists():
            made.insert(0, folder)
        folder.mkdir(parents=True, exist_ok=True)
        return folder, made
    logdir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        folder = logdir / f"{stamp}-seed{seed}{f'-{n}' if n > 1 else ''}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder, [folder, *made]
    raise AssertionError("unreachable")


def _remove_made(folder: Path, made: list[Path]) -> None:
    """Undo `_log_folder`: remove `folder` with its logs if this run made it, then the parents
    made for it while they are empty. Nothing else is touched."""
    for path in made:
        if path == folder:
            shutil.rmtree(path, ignore_errors=True)
            continue
        try:
            path.rmdir()
        except OSError:
            return


def _training_embeddings(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The embeddings to fit (read from disk as needed), and where they came from: encoder,
    pooling, max length, data."""
    from .cache import EmbeddingCache
    from .corpus import Corpus
    from .embeddings import open_embeddings
    from .encoder import check_max_length, load_encoder

    check_max_length(args.max_length)
    if args.input.suffix != ".npy":
        corpus = Corpus.from_file(args.input)
        encoder = _load_encoder(args)
        pooling = args.pooling or DEFAULT_POOLING
        x = EmbeddingCache(args.cache).files(corpus, encoder, pooling, args.max_length,
                                             args.encode_batch_size,
                                             progress=False if args.quiet else None)[pooling]
        return x, {"encoder": encoder.id, "pooling": pooling, "max_length": args.max_length,
                   "data": corpus.sha256,
                   "corpus": {"sha256": corpus.sha256, "file": args.input.name}}

    given = load_encoder(args.encoder, "cpu") if args.encoder else None
    return open_embeddings(args.input, pooling=args.pooling, encoder=given,
                           max_length=args.max_length)


def _transform(args: argparse.Namespace) -> None:
    from .embeddings import check_output, open_embeddings, write_transformed
    from .files import read_sentences, sha256_file
    from .head import FlowHead

    inputs = [args.sentences or args.embeddings, *sorted(args.head.glob("*"))]
    check_output(args.out, inputs)
    head = FlowHead.load(args.head)
    if args.sentences is not None:
        z = head.encode(read_sentences(args.sentences), _load_encoder(args, head.encoder),
                        args.encode_batch_size, progress=False if args.quiet else None)
        source = {"sentences_sha256": sha256_file(args.sentences)}
    else:
        given = _load_encoder(args) if args.encoder else None
        x, origin = open_embeddings(args.embeddings, pooling=args.pooling, encoder=given)
        head.check(x.dim, origin["encoder"], origin["pooling"])
        z = head.transform(x.load())
        source = origin["corpus"]
    write_transformed(args.out, z, head.describe(), source)
    print(f"wrote {args.out}: {z.shape[0]} × {z.shape[1]}")


def _eval(args: argparse.Namespace) -> None:
    import numpy as np

    from .cache import EmbeddingCache
    from .encoder import check_max_length
    from .evaluate import evaluate, format_table, undefined_notes
    from .files import read_sentences, write_json
    from .head import FlowHead
    from .methods import Fitted, default_d, default_k, make_method
    from .sts import load_tasks

    if args.head is not None and args.fit_on is not None:
        raise BertflowError("--fit-on does not apply to --head: the head is already fit")
    if args.json is not None and args.json.is_dir():
        raise BertflowError(f"--json {args.json} is a folder")
    check_max_length(args.max_length)
    flow, train = _flow_configs(args)
    tasks, missing = load_tasks(args.data, args.tasks)
    if not tasks:
        raise BertflowError(f"none of {', '.join(args.tasks)} is in {args.data}")
    head = FlowHead.load(args.head) if args.head is not None else None
    encoder = _load_encoder(args, head.encoder if head is not None else None)
    if head is not None:
        head.check(dim=encoder.width(head.pooling or DEFAULT_POOLING), encoder=encoder.id)
        if args.pooling is not None:
            head.check(pooling=args.pooling)
        pooling, max_length = head.pooling or DEFAULT_POOLING, head.max_length or args.max_length
        corpus = head.training_info.get("corpus")
        fit_on: Any = None
        fit_label = str((corpus or {}).get("file") or (corpus or {}).get("name") or "head")
        labels = {"method": "flow", "head": str(args.head)}

        def make() -> Any:
            return Fitted(head)
    else:
        pooling, max_length = args.pooling or DEFAULT_POOLING, args.max_length
        method = args.method or "flow"
        source = args.fit_on or "target"
        fit_on = "target" if source == "target" else read_sentences(source)
        fit_label = "target" if source == "target" else Path(source).name
        labels = {"method": method}

        width = encoder.width(pooling)
        k = args.k if args.k is not None else default_k(width)
        d = args.d if args.d is not None else default_d(width)

        def make() -> Any:
            return make_method(method, k=k, d=d, flow=flow, train=train,
                               progress=not args.quiet)

        labels.update(make().describe())
    cache = EmbeddingCache(args.cache)

    def embed(sentences: list[str]) -> np.ndarray:
        return np.asarray(cache.encode(sentences, encoder, pooling, max_length,
                                       args.encode_batch_size,
                                       progress=False if args.quiet else None))

    labels = {"encoder": encoder.id.name, "pooling": pooling, **labels, "fit_on": fit_label}
    rows = evaluate(tasks, missing, embed, make, fit_on, labels)
    if args.json is not None:
        write_json(args.json, rows)
    for aggregation in ("all", "wmean"):
        print(f"Spearman × 100 ({aggregation}):")
        print(format_table(rows, aggregation))
    for note in undefined_notes(rows):
        print(note)
    if missing:
        print(f"missing from {args.data}: {', '.join(missing)}")


def _diagnose(args: argparse.Namespace) -> None:
    import numpy as np

    from .cache import EmbeddingCache
    from .diagnose import plot_all
    from .encoder import check_max_length
    from .files import read_sentences
    from .head import FlowHead
    from .isotropy import isotropy_measures

    check_max_length(args.max_length)
    flow, train = _flow_configs(args)
    sentences = read_sentences(args.sentences)
    corpus = read_sentences(args.corpus) if args.corpus else sentences
    head = FlowHead.load(args.head) if args.head else None
    encoder = _load_encoder(args, head.encoder if head is not None else None)
    if head is not None:
        head.check(dim=encoder.width(head.pooling or args.pooling or DEFAULT_POOLING),
                   encoder=encoder.id, pooling=args.pooling)
    pooling = (head.pooling if head else None) or args.pooling or DEFAULT_POOLING
    max_length = (head.max_length if head else None) or args.max_length
    cache = EmbeddingCache(args.cache)
    x = np.asarray(cache.encode(sentences, encoder, pooling, max_length, args.encode_batch_size,
                                progress=False if args.quiet else None))
    if head is None:
        head = FlowHead.fit(x, encoder=encoder.id, pooling=pooling, max_length=max_length,
                            flow=flow, train=train, progress=not args.quiet)
    z = head.transform(x)
    title = f"{encoder.id.name}, {pooling} pooling, {len(sentences)} sentences"
    paths = plot_all(x, z, args.out, encoder=encoder, corpus=corpus, title=title)
    before, after = isotropy_measures(x), isotropy_measures(z)
    print(f"{'':18}{'before':>12}{'after':>12}")
    for key in before:
        print(f"{key:18}{_number(before[key]):>12}{_number(after[key]):>12}")
    print("wrote " + ", ".join(str(p) for p in paths))


def _number(value: float | None) -> str:
    return "inf" if value is None else f"{value:.4g}"


def _info(args: argparse.Namespace) -> None:
    from .head import FlowHead, ready_heads

    if args.head is None:
        heads = ready_heads()
        print("ready heads (load with FlowHead.load(NAME) or --head NAME):" if heads else
              "no ready heads are installed")
        for name in heads:
            head = FlowHead.load(name)
            print(f"  {name}: {head.encoder.name if head.encoder else '?'}, {head.pooling} "
                  f"pooling, {head.dim}-d, fit on {head.training_info['corpus'].get('size')} "
                  "sentences")
        return
    head = FlowHead.load(args.head)
    if args.json:
        print(json.dumps(head.config(), indent=2))
        return
    training = head.training_info
    corpus = training.get("corpus") if isinstance(training.get("corpus"), dict) else {}
    digest = next((str(corpus[k]) for k in ("sha256", "npy_sha256", "embeddings_sha256")
                   if k in corpus), "?")
    rows = [
        ("head", str(args.head)),
        ("dim", str(head.dim) if head.out_dim == head.dim else f"{head.dim} → {head.out_dim}"),
        ("encoder", str(head.encoder) if head.encoder else "unknown"),
        ("pooling", head.pooling or "unknown"),
        ("max length", str(head.max_length)),
        ("method", head.summary()),
        ("standardize", "yes" if head.standardize is not None else "no"),
        ("parameters", f"{sum(t.numel() for t in head.state_dict().values()):,}"),
        ("corpus", f"{corpus.get('size', '?')} rows, sha256 {digest[:16]}"),
        ("seed", str(training.get("seed"))),
        ("epochs", f"best {training.get('best_epoch')} of {training.get('epochs_run')}"),
        ("val NLL", _nats(training)),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _export(args: argparse.Namespace) -> None:
    from .head import FlowHead

    head = FlowHead.load(args.head)
    if args.format == "sentence-transformers":
        from .pipeline import build_pipeline, save_pipeline

        save_pipeline(build_pipeline(head, args.encoder, args.normalize), args.out)
    elif args.encoder is not None or args.normalize:
        raise BertflowError("--encoder and --normalize apply to --format sentence-transformers")
    elif args.format == "onnx":
        from .export import export_onnx

        export_onnx(head, args.out)
    else:
        from .export import export_program

        export_program(head, args.out)
    print(f"wrote {args.out} ({args.format})")


def _index(args: argparse.Namespace) -> None:
    from .cache import EmbeddingCache
    from .files import read_sentences
    from .head import FlowHead
    from .retrieval import Index, check_index_destination

    check_index_destination(args.out)
    head = FlowHead.load(args.head) if args.head else None
    if head is not None and args.pooling not in (None, head.pooling):
        raise BertflowError(f"--pooling {args.pooling} differs from the head's {head.pooling}")
    wanted = head.max_length if head is not None else None
    if args.max_length is not None and wanted is not None and args.max_length != wanted:
        raise BertflowError(f"--max-length {args.max_length} differs from the head's {wanted}")
    items = read_sentences(args.corpus)
    encoder = _load_encoder(args, head.encoder if head is not None else None)
    index = Index.build(items, encoder, head=head, pooling=args.pooling,
                        max_length=args.max_length or wanted or 128,
                        batch_size=args.encode_batch_size, cache=EmbeddingCache(args.cache),
                        kind=args.kind, dims=args.dims, progress=False if args.quiet else None)
    if index is None:  # another process of a torchrun job builds it
        return
    index.save(args.out)
    c = index.config
    print(f"wrote {args.out}: {c['count']} items, {c['kind']}, {c['dims']}-d, {c['pooling']} "
          f"pooling, {'with' if head is not None else 'without'} a head")


def _search(args: argparse.Namespace) -> None:
    from .files import read_sentences
    from .retrieval import Index

    queries = read_sentences(args.queries) if args.queries else args.query
    if any(not q.strip() for q in queries):
        raise BertflowError("empty query")
    index = Index.load(args.index)
    hits_per_query = index.search(queries, _load_encoder(args, index.encoder), args.k)
    for query, hits in zip(queries, hits_per_query, strict=True):
        if args.json:
            print(json.dumps({"query": query, "hits": [hit._asdict() for hit in hits]},
                             ensure_ascii=False))
            continue
        print(query)
        width = max((len(str(hit.line)) for hit in hits), default=1)
        for rank, hit in enumerate(hits, 1):
            print(f"  {rank:3d}  {hit.score:.4f}  line {hit.line:<{width}d}  {hit.item}")


def _nats(training: dict[str, Any]) -> str:
    nll, bits = training.get("val_nll"), training.get("val_bits_per_dim")
    if not isinstance(nll, (int, float)) or not isinstance(bits, (int, float)):
        return "unknown"
    return f"{nll:.3f} nats ({bits:.4f} bits/dim)"


def _load_encoder(args: argparse.Namespace, recorded: Any = None) -> Any:
    """--encoder, else the encoder a head or an index records (`recorded`), else the
    default."""
    from .encoder import resolve_encoder

    return resolve_encoder(args.encoder, recorded, args.device, args.dtype)


def _version() -> str:
    from . import __version__

    return f"bertflow {__version__}"


if __name__ == "__main__":
    sys.exit(main())
