"""The `bertflow` command: parse arguments, call the library, print."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from . import distributed
from .embeddings import PeerError
from .encoder import DEFAULT_BATCH_SIZE, DEFAULT_POOLING, DTYPES, POOLINGS
from .errors import BertflowError, first_line
from .methods import METHODS
from .sts import TASKS

__all__ = ["main"]

EXPORT_FORMATS = ("sentence-transformers", "onnx", "torch-export")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bertflow", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = commands.add_parser("encode", help="embed a corpus (one sentence per line) into .npy")
    p.add_argument("corpus", type=Path)
    p.add_argument("--out", type=Path, required=True, help="EMB.npy (+ EMB.meta.json)")
    _encoder_options(p)
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted encode of the same request where it stopped")
    p.add_argument("--cache", type=Path, default=None,
                   help="embedding cache folder, read and filled (default: ~/.cache/bertflow)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor fill the cache")
    p.set_defaults(run=_encode)

    p = commands.add_parser("fit", help="fit a flow head on a corpus or on embeddings")
    p.add_argument("input", type=Path, help="CORPUS.txt, or EMB.npy made by `bertflow encode`")
    p.add_argument("--out", type=Path, required=True, help="folder to write the head to")
    _encoder_options(p, pooling_default=None, batch_flag="--encode-batch-size")
    p.add_argument("--cache", type=Path, default=None, help="embedding cache folder")
    g = _flow_options(p)
    g.add_argument("--logdir", type=Path, default=None, help="write TensorBoard logs here")
    g.add_argument("--checkpoint", type=Path, default=None, help="training state, saved each epoch")
    g.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    g.add_argument("--quiet", action="store_true")
    p.set_defaults(run=_fit)

    p = commands.add_parser("transform", help="apply a head to sentences or embeddings")
    p.add_argument("--head", type=Path, required=True)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--sentences", type=Path, help="text file, one sentence per line")
    source.add_argument("--embeddings", type=Path, help=".npy of embeddings")
    p.add_argument("--out", type=Path, required=True, help="OUT.npy")
    p.add_argument("--encoder", default=None, help="encoder folder (default: all-MiniLM-L6-v2)")
    p.add_argument("--batch-size", dest="encode_batch_size", type=int,
                   default=DEFAULT_BATCH_SIZE)
    _device_options(p)
    p.set_defaults(run=_transform)

    p = commands.add_parser("eval", help="score the STS tasks of a data folder")
    p.add_argument("--data", type=Path, required=True, help="folder in SentEval's layout")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--head", type=Path, help="score a fitted head (its encoder and pooling)")
    which.add_argument("--method", choices=METHODS, default=None, help="default: flow")
    p.add_argument("--fit-on", default=None,
                   help="'target' (each task's own sentences, no scores; the default) or a "
                        "text file of sentences")
    p.add_argument("--k", type=int, default=256, help="components kept by whitening-k")
    p.add_argument("--d", type=int, default=1, help="directions removed by abtt")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--json", type=Path, required=True, help="write the rows here")
    _encoder_options(p, pooling_default=None, batch_flag="--encode-batch-size")
    p.add_argument("--cache", type=Path, default=None, help="embedding cache folder")
    _flow_options(p).add_argument("--quiet", action="store_true")
    p.set_defaults(run=_eval)

    p = commands.add_parser("diagnose", help="plot anisotropy before and after a flow")
    p.add_argument("sentences", type=Path, help="text file, one sentence per line")
    p.add_argument("--out", type=Path, required=True, help="folder for the PNG plots")
    p.add_argument("--head", type=Path, default=None,
                   help="apply this head (default: fit a flow on the sentences)")
    p.add_argument("--corpus", type=Path, default=None,
                   help="text whose token frequencies to plot (default: the sentences)")
    _encoder_options(p, pooling_default=None, batch_flag="--encode-batch-size")
    p.add_argument("--cache", type=Path, default=None, help="embedding cache folder")
    _flow_options(p).add_argument("--quiet", action="store_true")
    p.set_defaults(run=_diagnose)

    p = commands.add_parser("export", help="write a head for use without bertflow's CLI")
    p.add_argument("--head", type=Path, required=True)
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    p.add_argument("--out", type=Path, required=True,
                   help="a folder (sentence-transformers), HEAD.onnx or HEAD.pt2")
    p.add_argument("--encoder", default=None,
                   help="encoder folder for a sentence-transformers pipeline (default: MiniLM)")
    p.add_argument("--normalize", action="store_true",
                   help="end the sentence-transformers pipeline with L2 normalisation")
    p.set_defaults(run=_export)

    p = commands.add_parser("index", help="build a FAISS index of a corpus for search")
    p.add_argument("corpus", type=Path, help="text file, one item per line")
    p.add_argument("--out", type=Path, required=True, help="index folder")
    p.add_argument("--head", type=Path, default=None,
                   help="transform with this head (its pooling); default: raw pooled vectors")
    _encoder_options(p, pooling_default=None, batch_flag="--encode-batch-size")
    p.add_argument("--kind", choices=("flat", "hnsw"), default="flat",
                   help="exact inner product (default) or an HNSW graph")
    p.add_argument("--dims", type=int, default=None,
                   help="keep this many principal components (smaller index)")
    p.add_argument("--cache", type=Path, default=None, help="embedding cache folder")
    p.set_defaults(run=_index, max_length=None)  # default: the head's, else 128

    p = commands.add_parser("search", help="query an index built by `bertflow index`")
    p.add_argument("--index", type=Path, required=True)
    queries = p.add_mutually_exclusive_group(required=True)
    queries.add_argument("--query", action="append", help="a query; repeat for several")
    queries.add_argument("--queries", type=Path, help="text file, one query per line")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--encoder", default=None, help="encoder folder (default: all-MiniLM-L6-v2)")
    _device_options(p)
    p.add_argument("--json", action="store_true", help="print JSON lines")
    p.set_defaults(run=_search)

    p = commands.add_parser("info", help="describe a head")
    p.add_argument("head", type=Path)
    p.add_argument("--json", action="store_true", help="print the head's config.json")
    p.set_defaults(run=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    where = ""
    try:
        if distributed.launched():
            where = f"[rank {os.environ.get('RANK', '?')}] "
            _join_processes(args)
        args.run(args)
    except PeerError:
        return 1  # the process that failed says why
    except BertflowError as e:
        print(f"bertflow: error: {where}{e}", file=sys.stderr)
        return 1
    except OSError as e:
        name = f": {e.filename}" if e.filename else ""
        print(f"bertflow: error: {where}{e.strerror or e}{name}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bertflow: interrupted", file=sys.stderr)
        return 130
    finally:
        distributed.leave()
    return 0


def _join_processes(args: argparse.Namespace) -> None:
    """Under torchrun: only encode, fit and index split their work across processes."""
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
    batch_flag: str = "--batch-size",
) -> None:
    p.add_argument("--encoder", default=None, help="encoder folder (default: all-MiniLM-L6-v2)")
    p.add_argument(
        "--pooling", choices=POOLINGS, default=pooling_default,
        help=f"default: {pooling_default or 'from the embeddings, else ' + DEFAULT_POOLING}",
    )
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument(batch_flag, dest="encode_batch_size", type=int,
                   default=DEFAULT_BATCH_SIZE,
                   help="sentences per encoder batch")
    _device_options(p)


def _device_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when present, the default), cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="precision of the encoder (embeddings and files stay float32)")


def _flow_options(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    g = p.add_argument_group("flow")
    g.add_argument("--levels", type=int, default=3)
    g.add_argument("--depth", type=int, default=3)
    g.add_argument("--coupling", choices=("additive", "affine"), default="additive")
    g.add_argument("--hidden", type=int, default=32, help="conditioner width")
    g.add_argument("--linear", choices=("reverse", "lu"), default="reverse",
                   help="mixing layer: fixed reversal (as released) or learned LU")
    g.add_argument("--no-standardize", action="store_true", help="feed raw embeddings to the flow")
    g = p.add_argument_group("training")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--epochs", type=int, default=None)
    g.add_argument("--batch-size", type=int, default=None)
    g.add_argument("--lr", type=float, default=None)
    g.add_argument("--val-fraction", type=float, default=None)
    g.add_argument("--patience", type=int, default=None, help="0 disables early stopping")
    return g


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
    from .cache import EmbeddingCache, encode_to
    from .corpus import Corpus
    from .embeddings import check_destination

    check_destination(args.out)
    corpus = Corpus.from_file(args.corpus)
    encoder = _load_encoder(args)
    cache = None if args.no_cache else EmbeddingCache(args.cache)
    encoded = encode_to(args.out, corpus, encoder, args.pooling, args.max_length,
                        args.encode_batch_size, cache=cache, resume=args.resume)
    if distributed.is_main():
        print(f"wrote {args.out}: {len(corpus)} × {encoder.dim} ({encoder.id.name}, "
              f"{args.pooling}, {encoder.precision}{'' if encoded else ', from the cache'})")


def _fit(args: argparse.Namespace) -> None:
    from .head import FlowHead, check_destination

    if args.checkpoint is not None and args.checkpoint.is_dir():
        raise BertflowError(f"--checkpoint {args.checkpoint} is a folder; expected a file")
    if args.resume and args.checkpoint is None:
        raise BertflowError("--resume needs --checkpoint FILE")
    flow, train = _flow_configs(args)
    check_destination(args.out)
    x, origin = _training_embeddings(args)
    run = {
        "flow": flow.to_dict(),
        "train": train.to_dict(),
        "standardize": not args.no_standardize,
        "encoder": origin["encoder"].fingerprint if origin["encoder"] else None,
        "pooling": origin["pooling"],
        "max_length": origin["max_length"],
        "data": origin["data"],
    }
    state = None
    main = distributed.is_main()
    if args.resume and args.checkpoint.exists():
        state = _load_checkpoint(args.checkpoint, run)
    elif args.resume and not args.quiet and main:
        print(f"no checkpoint at {args.checkpoint} yet: starting afresh", file=sys.stderr)

    def on_epoch_end(s: Any) -> None:
        if not main:
            return
        if not args.quiet:
            e = s.history.epochs[-1]
            print(
                f"epoch {int(e['epoch'])}/{train.epochs}: train {e['train_nll']:.3f} "
                f"val {e['val_nll']:.3f} nats ({e['val_bits_per_dim']:.4f} bits/dim), "
                f"val cosine {e['val_cosine']:.3f}",
                file=sys.stderr,
            )
        if args.checkpoint is not None:
            import torch

            from .files import atomic_file

            with atomic_file(args.checkpoint) as tmp:
                torch.save({"run": run, "state": s.to_dict()}, tmp)

    new_logdir = args.logdir is not None and not args.logdir.exists()
    fitted = False
    writer = None
    if args.logdir is not None and main:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(args.logdir))
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
            progress=not args.quiet,
        )
        fitted = True
    except (RuntimeError, KeyError, TypeError, ValueError) as e:
        if state is None or isinstance(e, BertflowError):
            raise
        raise BertflowError(f"{args.checkpoint} does not fit this run ({first_line(e)})") from None
    finally:
        if writer is not None:
            writer.close()
        if new_logdir and not fitted and args.checkpoint is None and main:  # nothing to resume
            shutil.rmtree(args.logdir, ignore_errors=True)
    if not main:
        return
    head.save(args.out)
    info = head.training_info
    print(
        f"wrote {args.out}: best epoch {info['best_epoch']} of {info['epochs_run']}, "
        f"val NLL {info['val_nll']:.3f} nats ({info['val_bits_per_dim']:.4f} bits/dim)"
    )


def _load_checkpoint(path: Path, run: dict[str, Any]) -> Any:
    import pickle

    import torch

    from .train import TrainState

    try:
        saved = torch.load(path, weights_only=True)
        state = TrainState.from_dict(saved["state"])
        same = saved["run"] == run
    except (pickle.UnpicklingError, RuntimeError, EOFError, KeyError, TypeError, AttributeError):
        raise BertflowError(f"{path} is not a bertflow training checkpoint") from None
    if not same:
        raise BertflowError(f"{path} was written by a run with other settings or data")
    return state


def _training_embeddings(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The embeddings to fit (read from disk as needed), and where they came from: encoder,
    pooling, max length, data."""
    from .cache import EmbeddingCache
    from .corpus import Corpus
    from .embeddings import EmbeddingFile
    from .encoder import EncoderId, check_max_length, load_encoder
    from .files import sha256_file

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

    x = EmbeddingFile(args.input).verify()
    meta = x.meta
    given = load_encoder(args.encoder, "cpu") if args.encoder else None
    if meta is None:
        if args.pooling is None:
            raise BertflowError(
                f"{args.input} has no .meta.json sidecar; pass --pooling (and --encoder) "
                "to say how it was made"
            )
        if given is not None and given.dim != x.shape[1]:
            raise BertflowError(
                f"{args.input} holds {x.shape[1]}-d embeddings, "
                f"but encoder {given.id} makes {given.dim}-d ones"
            )
        digest = sha256_file(args.input)
        return x, {"encoder": given.id if given else None, "pooling": args.pooling,
                   "max_length": args.max_length, "data": digest,
                   "corpus": {"npy_sha256": digest}}
    encoder = EncoderId.from_dict(meta["encoder"])
    if given is not None and given.id.fingerprint != encoder.fingerprint:
        raise BertflowError(
            f"{args.input} was made by encoder {encoder}, not by --encoder {given.id}"
        )
    if args.pooling is not None and args.pooling != meta["pooling"]:
        raise BertflowError(
            f"{args.input} holds {meta['pooling']} pooling, "
            f"but --pooling {args.pooling} was given"
        )
    digest = str(meta.get("corpus_sha256"))
    return x, {"encoder": encoder, "pooling": meta["pooling"], "max_length": meta["max_length"],
               "data": digest, "corpus": {"sha256": digest}}


def _transform(args: argparse.Namespace) -> None:
    from .embeddings import load_embeddings, read_meta
    from .encoder import EncoderId
    from .files import atomic_file, read_sentences
    from .head import FlowHead

    _check_npy_out(args.out)
    head = FlowHead.load(args.head)
    if args.sentences is not None:
        z = head.encode(read_sentences(args.sentences), _load_encoder(args),
                        args.encode_batch_size)
    else:
        x = load_embeddings(args.embeddings)
        meta = read_meta(args.embeddings)
        if meta is not None:
            head.check(x.shape[1], EncoderId.from_dict(meta["encoder"]), meta["pooling"])
        z = head.transform(x)
    with atomic_file(args.out) as tmp, open(tmp, "wb") as f:
        np.save(f, z)
    print(f"wrote {args.out}: {z.shape[0]} × {z.shape[1]}")


def _eval(args: argparse.Namespace) -> None:
    from .cache import EmbeddingCache
    from .encoder import check_max_length
    from .evaluate import evaluate, format_table
    from .files import read_sentences, write_json
    from .head import FlowHead
    from .methods import Fitted, make_method
    from .sts import load_tasks

    if args.head is not None and args.fit_on is not None:
        raise BertflowError("--fit-on does not apply to --head: the head is already fit")
    if args.json.is_dir():
        raise BertflowError(f"--json {args.json} is a folder")
    check_max_length(args.max_length)
    flow, train = _flow_configs(args)
    tasks, missing = load_tasks(args.data, args.tasks)
    if not tasks:
        raise BertflowError(f"none of {', '.join(args.tasks)} is in {args.data}")
    encoder = _load_encoder(args)
    if args.head is not None:
        head = FlowHead.load(args.head)
        head.check(dim=encoder.dim, encoder=encoder.id)
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

        def make() -> Any:
            return make_method(method, k=args.k, d=args.d, flow=flow, train=train)

        labels.update(make().describe())
    cache = EmbeddingCache(args.cache)

    def embed(sentences: list[str]) -> np.ndarray:
        return np.asarray(cache.encode(sentences, encoder, pooling, max_length,
                                       args.encode_batch_size,
                                       progress=False if args.quiet else None))

    labels = {"encoder": encoder.id.name, "pooling": pooling, **labels, "fit_on": fit_label}
    rows = evaluate(tasks, missing, embed, make, fit_on, labels)
    write_json(args.json, rows)
    for aggregation in ("all", "wmean"):
        print(f"Spearman × 100 ({aggregation}):")
        print(format_table(rows, aggregation))
    if missing:
        print(f"missing from {args.data}: {', '.join(missing)}")


def _diagnose(args: argparse.Namespace) -> None:
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
    encoder = _load_encoder(args)
    head = FlowHead.load(args.head) if args.head else None
    if head is not None:
        head.check(dim=encoder.dim, encoder=encoder.id, pooling=args.pooling)
    pooling = (head.pooling if head else None) or args.pooling or DEFAULT_POOLING
    max_length = (head.max_length if head else None) or args.max_length
    cache = EmbeddingCache(args.cache)
    x = np.asarray(cache.encode(sentences, encoder, pooling, max_length, args.encode_batch_size,
                                progress=False if args.quiet else None))
    if head is None:
        head = FlowHead.fit(x, encoder=encoder.id, pooling=pooling, max_length=max_length,
                            flow=flow, train=train)
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
    from .files import read_json
    from .head import FlowHead

    head = FlowHead.load(args.head)
    if args.json:
        print(json.dumps(read_json(args.head / "config.json"), indent=2))
        return
    flow, training = head.glow.config, head.training_info
    corpus = training.get("corpus") if isinstance(training.get("corpus"), dict) else {}
    digest = next((str(corpus[k]) for k in ("sha256", "npy_sha256", "embeddings_sha256")
                   if k in corpus), "?")
    rows = [
        ("head", str(args.head)),
        ("dim", str(head.dim)),
        ("encoder", str(head.encoder) if head.encoder else "unknown"),
        ("pooling", head.pooling or "unknown"),
        ("max length", str(head.max_length)),
        ("flow", f"Glow: {flow.levels} levels × depth {flow.depth}, {flow.coupling} coupling, "
                 f"width {flow.hidden}, {flow.linear} mixing"),
        ("standardize", "yes" if head.standardize is not None else "no"),
        ("parameters", f"{sum(p.numel() for p in head.parameters()):,}"),
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
    index = Index.build(items, _load_encoder(args), head=head, pooling=args.pooling,
                        max_length=args.max_length or wanted or 128,
                        batch_size=args.encode_batch_size, cache=EmbeddingCache(args.cache),
                        kind=args.kind, dims=args.dims)
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
    hits_per_query = index.search(queries, _load_encoder(args), args.k)
    for query, hits in zip(queries, hits_per_query, strict=True):
        if args.json:
            print(json.dumps({"query": query, "hits": [{"score": s, "item": t} for s, t in hits]},
                             ensure_ascii=False))
            continue
        print(query)
        for rank, (score, item) in enumerate(hits, 1):
            print(f"  {rank:3d}  {score:.4f}  {item}")


def _nats(training: dict[str, Any]) -> str:
    nll, bits = training.get("val_nll"), training.get("val_bits_per_dim")
    if not isinstance(nll, (int, float)) or not isinstance(bits, (int, float)):
        return "unknown"
    return f"{nll:.3f} nats ({bits:.4f} bits/dim)"


def _check_npy_out(path: Path) -> None:
    if path.suffix != ".npy":
        raise BertflowError(f"--out {path} must end in .npy")
    if path.is_dir():
        raise BertflowError(f"--out {path} is a folder")


def _load_encoder(args: argparse.Namespace) -> Any:
    from .encoder import load_encoder

    return load_encoder(args.encoder, args.device, args.dtype)


def _version() -> str:
    from . import __version__

    return f"bertflow {__version__}"


if __name__ == "__main__":
    sys.exit(main())
