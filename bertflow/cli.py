"""The `bertflow` command: parse arguments (`bertflow.commands`), call the library, print."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .commands import build_parser as _parser
from .commands import check_fit_options, check_flow_options, check_no_encoding, flow_options
from .constants import DEFAULT_MAX_LENGTH, DEFAULT_POOLING
from .errors import BertflowError, PeerError, one_line

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command, each carrying the function below that runs it."""
    return _parser(_RUN)


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
        print(f"bertflow: error: {where}{one_line(e)}", file=sys.stderr)
        return 1
    finally:
        distributed.leave()
    return 0


def _join_processes(args: argparse.Namespace) -> None:
    """Under torchrun: only encode, fit and index split their work across processes."""
    from . import distributed

    if args.command not in ("encode", "fit", "index"):
        raise BertflowError(f"bertflow {args.command} runs in one process; under torchrun "
                            "only encode, fit and index split their work")
    args.device = distributed.join(args.device)


def _check_paths(args: argparse.Namespace, output: str = "out") -> None:
    """Refuse, before any work, the command's output (the argument `output`) where it is,
    holds or lies inside one of the command's inputs (`fit` checks its own paths, in
    `runs.fit_head`)."""
    from .files import check_outputs

    check_outputs({f"--{output}": getattr(args, output)}, _inputs(args))


_INPUTS = {"corpus": "the corpus", "sentences": "the sentences", "embeddings": "--embeddings",
           "head": "--head", "data": "--data", "encoder": "--encoder"}


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The files and folders a command reads, by how a message names them."""
    from .cache import EmbeddingCache
    from .head import ready_heads

    inputs = {name: Path(getattr(args, dest)) for dest, name in _INPUTS.items()
              if getattr(args, dest, None) is not None}
    head = inputs.get("--head")
    if head is not None and not head.exists():
        inputs["--head"] = head = ready_heads().get(str(head), head)
    if head is not None and "--encoder" not in inputs:
        inputs["the head's encoder"] = _recorded_encoder_folder(head)
    inputs["--fit-on"] = [p for p in getattr(args, "fit_on", None) or [] if p != "target"]
    if hasattr(args, "cache") and not getattr(args, "no_cache", False):
        inputs["the embedding cache"] = EmbeddingCache(args.cache).root
    return inputs


def _recorded_encoder_folder(head: Path) -> Path | None:
    """The folder of the encoder the head at `head` records, where it is a folder that exists
    (read from its config, unchecked: the head is checked when it loads)."""
    from .files import read_json

    try:
        record = read_json(head / "config.json").get("encoder")
    except BertflowError:
        return None
    kind, _, where = str(record.get("source") if isinstance(record, dict) else "").partition(":")
    return Path(where) if kind == "folder" and Path(where).is_dir() else None


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
                        restart=args.restart, progress=_progress(args))
    if distributed.is_main():
        print(f"wrote {args.out}: {len(corpus)} × {encoder.width(args.pooling)} "
              f"({encoder.id.name}, {args.pooling}, {encoder.precision}"
              f"{'' if encoded else ', from the cache'})")


def _fit(args: argparse.Namespace) -> None:
    from .runs import FitJob, fit_head

    check_fit_options(args)
    job = FitJob(args.input, args.out, args.method, args.k, args.d,
                 recipe=flow_options(args), encoder=args.encoder,
                 pooling=args.pooling, max_length=args.max_length,
                 batch_size=args.encode_batch_size, device=args.device, dtype=args.dtype,
                 cache=args.cache, checkpoint=args.checkpoint, resume=args.resume,
                 logdir=args.logdir, dev_sts=args.dev_sts)
    fitted = fit_head(job, say=None if args.quiet else _say, progress=_progress(args))
    if fitted is None:  # another process of a torchrun job
        return
    if args.method != "flow":
        print(f"wrote {args.out}: {fitted.head.summary()}")
        return
    info = fitted.head.training_info
    print(f"wrote {args.out}: best epoch {info['best_epoch']} of {info['epochs_run']}, "
          f"val NLL {info['val_nll']:.3f} nats ({info['val_bits_per_dim']:.4f} bits/dim)")
    if fitted.logs is not None:
        print(f"TensorBoard logs in {fitted.logs}")


def _transform(args: argparse.Namespace) -> None:
    from .embeddings import open_embeddings
    from .files import Checked, meta_path, read_sentences, sha256_file
    from .head import FlowHead
    from .outputs import check_destination, write_transformed

    _check_paths(args)
    out = Checked(args.out, check_destination, also=[meta_path(args.out)])
    if args.embeddings is not None:
        check_no_encoding(args, f"--embeddings {args.embeddings} are transformed as they are")
    # --pooling: how the sentences are encoded, or how the embeddings were (`head.check`)
    head = _load_head(args) if args.sentences is not None else FlowHead.load(args.head)
    if args.sentences is not None:
        z = head.encode(read_sentences(args.sentences), _load_encoder(args, head.encoder),
                        args.encode_batch_size, progress=_progress(args))
        source = {"sentences_sha256": sha256_file(args.sentences)}
    else:
        given = _load_encoder(args) if args.encoder else None
        x, origin = open_embeddings(args.embeddings, pooling=args.pooling, encoder=given)
        head.check(x.dim, origin["encoder"], origin["pooling"])
        z, source = head.transform(x.load()), origin["corpus"]
    write_transformed(args.out, z, head.describe(), source, out)
    print(f"wrote {args.out}: {z.shape[0]} × {z.shape[1]}")


def _eval(args: argparse.Namespace) -> None:
    from .cache import EmbeddingCache
    from .evaluate import evaluate_head, evaluate_method, format_table, undefined_notes
    from .files import Checked, write_json
    from .recipes import corpus_note
    from .sts import load_tasks

    if args.head is not None and args.fit_on is not None:
        raise BertflowError("--fit-on does not apply to --head: the head is already fit")
    if args.head is not None and (args.k is not None or args.d is not None):
        raise BertflowError("--k and --d apply to --method whitening, whitening-k and abtt, "
                            f"not to --head {args.head}, which is fit already")
    check_flow_options(args)
    _check_paths(args, "json")
    out = Checked(args.json, _check_rows_destination) if args.json is not None else None
    tasks, missing = load_tasks(args.data, args.tasks)
    if not tasks:
        raise BertflowError(f"none of {', '.join(args.tasks)} is in {args.data}")
    head = _load_head(args)
    encoder = _load_encoder(args, head.encoder if head is not None else None)
    common = {"max_length": args.max_length or DEFAULT_MAX_LENGTH,
              "batch_size": args.encode_batch_size, "progress": _progress(args)}
    if head is not None:
        rows = evaluate_head(tasks, missing, head, encoder, EmbeddingCache(args.cache),
                             name=str(args.head), pooling=args.pooling, **common)
    else:
        fit_on = args.fit_on or ["target"]
        if (args.method or "flow") == "flow":
            _check_flow(args, encoder)
        rows = evaluate_method(tasks, missing, args.method or "flow", encoder,
                               EmbeddingCache(args.cache), pooling=args.pooling or
                               DEFAULT_POOLING, fit_on=fit_on, k=args.k,
                               d=args.d, recipe=flow_options(args), **common)
    if args.json is not None:
        write_json(args.json, rows, recheck=out)
    for aggregation in ("all", "wmean"):
        print(f"Spearman × 100 ({aggregation}):")
        print(format_table(rows, aggregation))
    for note in undefined_notes(rows):
        print(note)
    if missing:
        print(f"missing from {args.data}: {', '.join(missing)}")
    if head is None and (args.method or "flow") == "flow":
        note = corpus_note(args.pooling or DEFAULT_POOLING, fit_on)
        if note is not None:
            print(note)


def _diagnose(args: argparse.Namespace) -> None:
    from .cache import EmbeddingCache
    from .diagnose import diagnose
    from .files import read_sentences

    check_flow_options(args)
    _check_paths(args)
    sentences = read_sentences(args.sentences)
    corpus = read_sentences(args.corpus) if args.corpus else None
    head = _load_head(args)
    encoder = _load_encoder(args, head.encoder if head is not None else None)
    if head is None:
        _check_flow(args, encoder)
    paths, before, after = diagnose(
        sentences, args.out, encoder, head=head, pooling=args.pooling,
        max_length=args.max_length or DEFAULT_MAX_LENGTH, corpus=corpus,
        cache=EmbeddingCache(args.cache),
        recipe=flow_options(args), batch_size=args.encode_batch_size, progress=_progress(args),
        data=args.data, say=print)
    print(f"{'':18}{'before':>12}{'after':>12}")
    for key in before:
        print(f"{key:18}{_number(before[key]):>12}{_number(after[key]):>12}")
    print("wrote " + ", ".join(str(p) for p in paths))


def _info(args: argparse.Namespace) -> None:
    from .head import FlowHead, ready_heads

    if args.head is None:
        heads = ready_heads()
        print("ready heads (load with FlowHead.load(NAME) or --head NAME):" if heads else
              "no ready heads are installed")
        for name in heads:
            print(f"  {name}: {FlowHead.load(name).tagline()}")
        return
    head = FlowHead.load(args.head)
    if args.json:
        print(json.dumps(head.config(), indent=2))
        return
    rows = [("head", str(args.head)), *head.details()]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _export(args: argparse.Namespace) -> None:
    from .export import check_destination
    from .head import FlowHead

    if args.format != "sentence-transformers" and (args.encoder is not None or args.normalize):
        raise BertflowError("--encoder and --normalize apply to --format sentence-transformers")
    _check_paths(args)
    check_destination(args.out, args.format)
    head = FlowHead.load(args.head)
    if args.format == "sentence-transformers":
        from .pipeline import build_pipeline, save_pipeline

        save_pipeline(build_pipeline(head, args.encoder, args.normalize), args.out)
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
    from .retrieval import Index, check_index_destination

    check_index_destination(args.out)
    _check_paths(args)
    head = _load_head(args)
    items = read_sentences(args.corpus)
    encoder = _load_encoder(args, head.encoder if head is not None else None)
    index = Index.build(items, encoder, head=head, pooling=args.pooling,
                        max_length=args.max_length or (head.max_length if head else None) or
                        DEFAULT_MAX_LENGTH,
                        batch_size=args.encode_batch_size, cache=EmbeddingCache(args.cache),
                        kind=args.kind, dims=args.dims, progress=_progress(args))
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


def _load_head(args: argparse.Namespace) -> Any:
    """--head, loaded, or None; a --pooling or --max-length given must be the head's."""
    from .head import FlowHead

    if args.head is None:
        return None
    head = FlowHead.load(args.head)
    for flag, given, recorded in (("--pooling", args.pooling, head.pooling),
                                  ("--max-length", getattr(args, "max_length", None),
                                   head.max_length)):
        if None not in (given, recorded) and given != recorded:
            raise BertflowError(f"{flag} {given} differs from the head's {recorded}")
    return head


def _check_flow(args: argparse.Namespace, encoder: Any) -> None:
    """Refuse, before anything is encoded, a flow that cannot be built on the encoder's
    width."""
    from .recipes import resolve

    pooling = args.pooling or DEFAULT_POOLING
    resolve(flow_options(args), pooling).flow.check(encoder.width(pooling))


def _check_rows_destination(path: Path) -> None:
    """--json may replace the rows of an earlier `eval`, but no other file, a folder or a
    symbolic link."""
    from .files import refuse_link

    if path.is_dir():
        raise BertflowError(f"--json {path} is a folder")
    refuse_link(path)
    if not path.exists():
        return
    try:
        rows = json.loads(path.read_bytes())
    except (OSError, ValueError):
        rows = None
    if not (isinstance(rows, list) and rows and all(
            isinstance(row, dict) and {"task", "aggregation", "spearman"} <= row.keys()
            for row in rows)):
        raise BertflowError(f"--json {path} exists and is not rows written by bertflow eval; "
                            "not replacing it")


def _load_encoder(args: argparse.Namespace, recorded: Any = None) -> Any:
    """--encoder, else the encoder a head or an index records (`recorded`), else the
    default."""
    from .encoder import resolve_encoder

    return resolve_encoder(args.encoder, recorded, args.device, args.dtype)


def _progress(args: argparse.Namespace) -> bool | None:
    """Progress bars where they help, none with --quiet."""
    return False if args.quiet else None


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def _number(value: float | None) -> str:
    return "inf" if value is None else f"{value:.4g}"


_RUN = {"encode": _encode, "fit": _fit, "transform": _transform, "eval": _eval,
        "diagnose": _diagnose, "export": _export, "index": _index, "search": _search,
        "info": _info}

if __name__ == "__main__":
    sys.exit(main())
