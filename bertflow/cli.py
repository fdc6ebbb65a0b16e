"""The `bertflow` command: parse arguments (`bertflow.commands`), refuse those that cannot apply
before torch is imported, call the library, print."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

from .commands import build_parser as _parser
from .constants import DEFAULT_BATCH_SIZE, DEFAULT_POOLING
from .errors import BertflowError, PeerError, one_line

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command, each carrying the function below that runs it."""
    return _parser(_RUN)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("BERTFLOW_DEBUG", "") not in ("", "0")
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1  # as `distributed.launched`
    try:
        _check_options(args, launched)  # and the inputs, before torch is imported
        _check_inputs(args)
        from . import distributed

        distributed.use_available_cpus()
        if launched:
            args.device = distributed.join(args.device)
        args.run(args)
    except PeerError:
        return 1  # the process that failed says why
    except KeyboardInterrupt:
        print("bertflow: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # every failure ends in one line, unless asked for the traceback
        if debug:
            raise
        where = f"[rank {os.environ.get('RANK', '?')}] " if launched else ""
        print(f"bertflow: error: {where}{one_line(e)}", file=sys.stderr)
        return 1
    finally:
        if launched:
            from . import distributed

            distributed.leave()
    return 0


_FLOW_FIELDS = ("levels", "depth", "coupling", "hidden", "linear")
_TRAIN_FIELDS = ("seed", "epochs", "batch_size", "lr", "val_fraction", "patience")
# The encoder's options, and the values allowed where nothing is encoded: the defaults, and
# what happens anyway (the CPU, where a flow trains; float32).
_WITHOUT_ENCODING = {"device": ("auto", "cpu"), "dtype": ("float32",),
                     "encode_batch_size": (DEFAULT_BATCH_SIZE,), "cache": (None,)}


def _flow_options(args: argparse.Namespace) -> dict[str, Any]:
    """The flow, training and --before options given, as changes to the pooling's recipe."""
    given = {part: {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
             for part, names in (("flow", _FLOW_FIELDS), ("train", _TRAIN_FIELDS))}
    return {**given, "before": args.before}


def _check_options(args: argparse.Namespace, launched: bool) -> None:
    """Refuse options that cannot apply together (`launched`: under torchrun)."""
    if launched and args.command not in ("encode", "fit", "index"):
        raise BertflowError(f"bertflow {args.command} runs in one process; under torchrun "
                            "only encode, fit and index split their work")
    method = getattr(args, "method", None) or "flow"
    given = _given(args, ("before", *_FLOW_FIELDS, *_TRAIN_FIELDS))
    if given and getattr(args, "head", None) is not None:
        raise BertflowError(f"{', '.join(given)} apply to a flow fit here, not to --head "
                            f"{args.head}, which is fit already")
    if given and method != "flow":
        raise BertflowError(f"{', '.join(given)} apply to --method flow only")
    if getattr(args, "head", None) is not None and args.command == "eval":
        if args.fit_on is not None:
            raise BertflowError("--fit-on does not apply to --head: the head is already fit")
        if args.k is not None or args.d is not None:
            raise BertflowError("--k and --d apply to --method whitening, whitening-k and abtt, "
                                f"not to --head {args.head}, which is fit already")
    if (getattr(args, "k", None) is not None and method not in ("whitening", "whitening-k")) or (
            getattr(args, "d", None) is not None and method != "abtt"):
        raise BertflowError("--k applies to --method whitening and whitening-k, --d to "
                            "--method abtt")
    if args.command == "transform" and args.embeddings is not None:
        _check_no_encoding(args, f"--embeddings {args.embeddings} are transformed as they are")
    if args.command == "export" and args.format != "sentence-transformers" and (
            args.encoder is not None or args.normalize):
        raise BertflowError("--encoder and --normalize apply to --format sentence-transformers")
    if args.command != "fit":
        return
    if args.input.suffix == ".npy":  # --dev-sts encodes; --device places a torchrun job too
        unused = ("dtype",) if args.dev_sts else ("dtype", "encode_batch_size", "cache")
        _check_no_encoding(args, f"{args.input} holds embeddings, encoded already",
                           unused if args.dev_sts or launched else ("device", *unused))
    flow_only = _given(args, ("checkpoint", "resume", "logdir", "dev_sts"))
    if flow_only and method != "flow":
        raise BertflowError(f"{', '.join(flow_only)} apply to --method flow only")
    if args.checkpoint is not None and args.checkpoint.is_dir():
        raise BertflowError(f"--checkpoint {args.checkpoint} is a folder; expected a file")
    if args.resume and args.checkpoint is None:
        raise BertflowError("--resume needs --checkpoint FILE")
    if args.logdir is not None and args.logdir.exists() and not args.logdir.is_dir():
        raise BertflowError(f"--logdir {args.logdir} exists and is not a folder")


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """The flags of options `names` given (neither None nor False)."""
    return [f"--{name.replace('_', '-')}" for name in names
            if getattr(args, name, None) not in (None, False)]


def _check_no_encoding(args: argparse.Namespace, why: str,
                       options: tuple[str, ...] = tuple(_WITHOUT_ENCODING)) -> None:
    """Refuse the encoder's `options` given where nothing is encoded, as `why` says."""
    given = [f"--{name.replace('_', '-')} {getattr(args, name)}" for name in options
             if getattr(args, name, None) not in _WITHOUT_ENCODING[name]]
    if given:
        raise BertflowError(f"{' and '.join(given)} cannot apply: {why}")


# The files and folders a command reads, by argument: how a message names it, and what it must
# be (an existing file, a head folder or a ready head's name, a data or index folder).
_INPUTS = {"corpus": ("the corpus", "file"), "input": ("the input", "file"),
           "sentences": ("the sentences", "file"), "embeddings": ("--embeddings", "file"),
           "queries": ("--queries", "file"), "head": ("--head", "head"),
           "data": ("--data", "data folder"), "dev_sts": ("--dev-sts", "data folder"),
           "index": ("--index", "index folder"), "encoder": ("--encoder", None)}


def _check_inputs(args: argparse.Namespace) -> None:
    """Refuse a missing input before anything is imported that takes time to import."""
    from .folders import head_folder

    given = [(dest, getattr(args, dest)) for dest in _INPUTS if getattr(args, dest, None)]
    given += [("input", p) for p in getattr(args, "fit_on", None) or [] if p != "target"]
    for dest, path in given:
        path, kind = Path(path), _INPUTS[dest][1]
        if kind == "file" and not path.is_file():
            raise BertflowError(f"{path} is not a file" if path.exists() else
                                f"no such file: {path}")
        if kind == "head":
            head_folder(path)
        elif kind is not None and kind != "file" and not path.is_dir():
            raise BertflowError(f"no {kind} at {path}")


def _check_paths(args: argparse.Namespace, output: str = "out") -> None:
    """Refuse the output (argument `output`) where it is, holds or lies inside an input."""
    from .cache import EmbeddingCache
    from .encoder_id import recorded_folder
    from .files import check_outputs, read_json
    from .folders import head_folder

    inputs = {name: Path(getattr(args, dest)) for dest, (name, _) in _INPUTS.items()
              if getattr(args, dest, None) is not None}
    if "--head" in inputs:
        inputs["--head"] = head_folder(inputs["--head"])
    if "--head" in inputs and "--encoder" not in inputs:
        with contextlib.suppress(BertflowError):  # the existing encoder folder it records
            record = read_json(inputs["--head"] / "config.json").get("encoder")
            if isinstance(record, dict):
                inputs["the head's encoder"] = recorded_folder(record.get("source"))
    inputs["--fit-on"] = [p for p in getattr(args, "fit_on", None) or [] if p != "target"]
    if hasattr(args, "cache") and not getattr(args, "no_cache", False):
        inputs["the embedding cache"] = EmbeddingCache(args.cache).root
    check_outputs({f"--{output}": getattr(args, output)}, inputs)


def _encode(args: argparse.Namespace) -> None:
    from . import distributed
    from .cache import EmbeddingCache, encode_to
    from .corpus import Corpus
    from .outputs import check_destination

    check_destination(args.out)
    _check_paths(args)
    corpus = Corpus.from_file(args.corpus)
    encoder = _load_encoder(args)
    cache = None if args.no_cache else EmbeddingCache(args.cache)
    encoded = encode_to(args.out, corpus, encoder, args.pooling, args.max_length,
                        args.encode_batch_size, cache=cache, resume=args.resume,
                        restart=args.restart, progress=args.progress)
    if distributed.is_main():
        print(f"wrote {args.out}: {len(corpus)} × {encoder.width(args.pooling)} "
              f"({encoder.id.name}, {args.pooling}, {encoder.precision}"
              f"{'' if encoded else ', from the cache'})")


def _fit(args: argparse.Namespace) -> None:
    from .card import nll_text, summary
    from .runs import FitJob, fit_head

    job = FitJob(args.input, args.out, args.method, args.k, args.d, recipe=_flow_options(args),
                 encoder=args.encoder, pooling=args.pooling, max_length=args.max_length,
                 batch_size=args.encode_batch_size, device=args.device, dtype=args.dtype,
                 cache=args.cache, checkpoint=args.checkpoint, resume=args.resume,
                 logdir=args.logdir, dev_sts=args.dev_sts)
    say = None if args.progress is False else functools.partial(print, file=sys.stderr)
    fitted = fit_head(job, say=say, progress=args.progress)
    if fitted is None:  # another process of a torchrun job
        return
    if args.method != "flow":
        print(f"wrote {args.out}: {summary(fitted.head)}")
        return
    info = fitted.head.training_info
    print(f"wrote {args.out}: best epoch {info['best_epoch']} of {info['epochs_run']}, "
          f"val NLL {nll_text(info) or 'unknown'}")
    if fitted.logs is not None:
        print(f"TensorBoard logs in {fitted.logs}")


def _transform(args: argparse.Namespace) -> None:
    from .embeddings import open_embeddings
    from .files import Checked, meta_path, read_sentences, sha256_file
    from .head import FlowHead
    from .outputs import check_destination, write_transformed

    _check_paths(args)
    out = Checked(args.out, check_destination, also=[meta_path(args.out)])
    if args.sentences is not None:  # --pooling: how the sentences are encoded
        head, encoder = _head_and_encoder(args)
        z = head.encode(read_sentences(args.sentences), encoder, args.encode_batch_size,
                        progress=args.progress)
        source = {"sentences_sha256": sha256_file(args.sentences)}
    else:  # --pooling: how the embeddings were (`head.check`)
        head = FlowHead.load(args.head)
        given = _load_encoder(args) if args.encoder else None
        x, origin = open_embeddings(args.embeddings, pooling=args.pooling, encoder=given)
        head.check(x.dim, origin["encoder"], origin["pooling"])
        z, source = head.transform(x.load()), origin["corpus"]
    write_transformed(args.out, z, head.describe(), source, out)
    print(f"wrote {args.out}: {z.shape[0]} × {z.shape[1]}")


def _eval(args: argparse.Namespace) -> None:
    from . import evaluate
    from .cache import EmbeddingCache
    from .files import Checked, write_json
    from .recipes import corpus_note
    from .sts import load_tasks

    _check_paths(args, "json")
    out = Checked(args.json, evaluate.check_rows_destination) if args.json is not None else None
    tasks, missing = load_tasks(args.data, args.tasks)
    if not tasks:
        raise BertflowError(f"none of {', '.join(args.tasks)} is in {args.data}")
    method, pooling = args.method or "flow", args.pooling or DEFAULT_POOLING
    fit_on = args.fit_on or ["target"]
    head, encoder = _head_and_encoder(args, flow=method == "flow")
    common = {"cache": EmbeddingCache(args.cache), "max_length": args.max_length,
              "progress": args.progress, "batch_size": args.encode_batch_size}
    if head is not None:
        rows = evaluate.evaluate_head(tasks, missing, head, encoder, name=str(args.head),
                                      pooling=args.pooling, **common)
    else:
        rows = evaluate.evaluate_method(tasks, missing, method, encoder, pooling=pooling,
                                        fit_on=fit_on, k=args.k, d=args.d,
                                        recipe=_flow_options(args), **common)
    if args.json is not None:
        write_json(args.json, rows, recheck=out)
    for aggregation in ("all", "wmean"):
        print(f"Spearman × 100 ({aggregation}):")
        print(evaluate.format_table(rows, aggregation))
    notes = evaluate.undefined_notes(rows)
    if missing:
        notes.append(f"missing from {args.data}: {', '.join(missing)}")
    if head is None and method == "flow":
        notes.append(corpus_note(pooling, fit_on))
    for note in filter(None, notes):
        print(note)


def _diagnose(args: argparse.Namespace) -> None:
    from .cache import EmbeddingCache
    from .diagnose import diagnose
    from .files import read_sentences

    _check_paths(args)
    sentences = read_sentences(args.sentences)
    corpus = read_sentences(args.corpus) if args.corpus else None
    head, encoder = _head_and_encoder(args, flow=True)
    paths, before, after = diagnose(
        sentences, args.out, encoder, head=head, pooling=args.pooling, max_length=args.max_length,
        corpus=corpus, cache=EmbeddingCache(args.cache), recipe=_flow_options(args),
        batch_size=args.encode_batch_size, progress=args.progress, data=args.data, say=print)
    print(f"{'':18}{'before':>12}{'after':>12}")
    for key in before:
        cells = ["inf" if v is None else f"{v:.4g}" for v in (before[key], after[key])]
        print(f"{key:18}{cells[0]:>12}{cells[1]:>12}")
    print("wrote " + ", ".join(str(p) for p in paths))


def _info(args: argparse.Namespace) -> None:
    from .card import details, tagline
    from .folders import ready_heads
    from .head import FlowHead

    if args.head is None:
        heads = ready_heads()
        print("ready heads (load with FlowHead.load(NAME) or --head NAME):" if heads else
              "no ready heads are installed")
        for name in heads:
            print(f"  {name}: {tagline(FlowHead.load(name))}")
        return
    head = FlowHead.load(args.head)
    if args.json:
        print(json.dumps(head.config(), indent=2))
        return
    rows = [("head", str(args.head)), *details(head)]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _recipes(args: argparse.Namespace) -> None:
    from .recipes import RECIPES

    for pooling, recipe in RECIPES.items():
        if args.pooling in (None, pooling):
            print(f"{pooling}:\n  before:   {recipe.before}\n  corpus:   {recipe.corpus}")
            for name, config in (("flow", recipe.flow), ("training", recipe.train)):
                settings = " ".join(f"{k}={v}" for k, v in config.to_dict().items())
                print(f"  {name + ':':<9} {settings}")


def _export(args: argparse.Namespace) -> None:
    from .export import check_destination, export_onnx, export_program
    from .head import FlowHead

    _check_paths(args)
    check_destination(args.out, args.format)
    head = FlowHead.load(args.head)
    if args.format == "sentence-transformers":
        from .pipeline import build_pipeline, save_pipeline

        save_pipeline(build_pipeline(head, args.encoder, args.normalize), args.out)
    elif args.format == "onnx":
        export_onnx(head, args.out)
    else:
        export_program(head, args.out)
    print(f"wrote {args.out} ({args.format})")


def _index(args: argparse.Namespace) -> None:
    from .cache import EmbeddingCache
    from .files import read_sentences
    from .folders import INDEX_FOLDER
    from .retrieval import Index

    INDEX_FOLDER.check_destination(args.out)
    _check_paths(args)
    items = read_sentences(args.corpus)
    head, encoder = _head_and_encoder(args)
    index = Index.build(items, encoder, head=head, pooling=args.pooling, max_length=args.max_length,
                        cache=EmbeddingCache(args.cache), kind=args.kind, dims=args.dims,
                        batch_size=args.encode_batch_size, progress=args.progress)
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
    hits_per_query = index.search(queries, _load_encoder(args, index), args.top)
    for query, hits in zip(queries, hits_per_query, strict=True):
        if args.json:
            print(json.dumps({"query": query, "hits": [hit._asdict() for hit in hits]},
                             ensure_ascii=False))
            continue
        print(query)
        width = max((len(str(hit.line)) for hit in hits), default=1)
        for rank, hit in enumerate(hits, 1):
            print(f"  {rank:3d}  {hit.score:.4f}  line {hit.line:<{width}d}  {hit.item}")


def _head_and_encoder(args: argparse.Namespace, flow: bool = False) -> tuple[Any, Any]:
    """--head loaded (or None), whose pooling and max length those given must be, and the
    encoder; with `flow` and no head, refuse a flow too large for the encoder's width."""
    from .head import FlowHead
    from .recipes import resolve

    head = None if args.head is None else FlowHead.load(args.head)
    for flag, given, recorded in (("--pooling", args.pooling, getattr(head, "pooling", None)),
                                  ("--max-length", getattr(args, "max_length", None),
                                   getattr(head, "max_length", None))):
        if None not in (given, recorded) and given != recorded:
            raise BertflowError(f"{flag} {given} differs from the head's {recorded}")
    encoder = _load_encoder(args, head)
    if flow and head is None:  # before anything is encoded
        pooling = args.pooling or DEFAULT_POOLING
        resolve(_flow_options(args), pooling).flow.check(encoder.width(pooling))
    return head, encoder


def _load_encoder(args: argparse.Namespace, owner: Any = None) -> Any:
    """--encoder, else the encoder `owner` (a head or an index) records, else the default."""
    from .encoder import resolve_encoder

    return resolve_encoder(args.encoder, getattr(owner, "encoder", None), args.device,
                           args.dtype)


_RUN = {"encode": _encode, "fit": _fit, "transform": _transform, "eval": _eval,
        "diagnose": _diagnose, "export": _export, "index": _index, "search": _search,
        "info": _info, "recipes": _recipes}

if __name__ == "__main__":
    sys.exit(main())
