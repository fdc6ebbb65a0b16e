"""The `bertflow` command: parse arguments (`bertflow.cli.parser`), refuse those that cannot apply
before torch is imported, call the library, print."""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
import warnings
from typing import Any

from ..constants import TASKS
from ..errors import BertflowError, BertflowWarning, PeerError, one_line
from .checks import FLOW_FIELDS, TRAIN_FIELDS, check_inputs, check_options, check_paths
from .parser import build_parser as _parser
from .parser import upgrade

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command, each carrying the function below that runs it."""
    return _parser(_RUN)


def main(argv: list[str] | None = None) -> int:
    argv, notes = upgrade(sys.argv[1:] if argv is None else [str(a) for a in argv])
    for note in notes:
        print(f"bertflow: note: {note}; the old form goes in the next release", file=sys.stderr)
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = functools.partial(_show_warning, warnings.showwarning)
        return _main(args)


def _show_warning(show: Any, message: Warning | str, category: type[Warning], *args: Any,
                  **kwargs: Any) -> None:
    """bertflow's own warnings as one line on stderr; others as Python shows them."""
    if issubclass(category, BertflowWarning):
        print(f"bertflow: note: {message}", file=sys.stderr)
    else:
        show(message, category, *args, **kwargs)


def _main(args: argparse.Namespace) -> int:
    debug = args.debug or os.environ.get("BERTFLOW_DEBUG", "") not in ("", "0")
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1  # as `distributed.launched`
    try:
        check_options(args, launched)  # and the inputs, before torch is imported
        check_inputs(args)
        # oneDNN keeps memory for each matmul shape it has run (up to 1,024 of them), so an
        # encode's peak grew with the corpus's variety of batch shapes; unmeasurably slower off
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")
        from ..runtime import distributed

        distributed.use_available_cpus()
        if launched:
            args.device = distributed.join(args.device)
        args.run(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
    except PeerError:
        return 1  # the process that failed says why
    except KeyboardInterrupt:
        print("bertflow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of the output went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # every failure ends in one line, unless asked for the traceback
        if debug:
            raise
        where = f"[rank {os.environ.get('RANK', '?')}] " if launched else ""
        print(f"bertflow: error: {where}{one_line(e)}", file=sys.stderr)
        return 1
    finally:
        if launched:
            from ..runtime import distributed

            distributed.leave()
    return 0


def _flow_options(args: argparse.Namespace) -> dict[str, Any]:
    """The flow, training and --before options given, as changes to the pooling's recipe."""
    given = {part: {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
             for part, names in (("flow", FLOW_FIELDS), ("train", TRAIN_FIELDS))}
    return {**given, "before": args.before, "isotropic": args.isotropic}


def _encode(args: argparse.Namespace) -> None:
    from ..embeddings.cache import EmbeddingCache, encode_to
    from ..embeddings.outputs import check_destination
    from ..runtime import distributed
    from ..storage.corpus import Corpus

    check_destination(args.out)
    check_paths(args)
    corpus = Corpus.from_file(args.corpus)
    encoder = _load_encoder(args)
    args.pooling, args.max_length = encoder.defaults(args.pooling, args.max_length)
    cache = None if args.no_cache else EmbeddingCache(args.cache)
    encoded = encode_to(args.out, corpus, encoder, args.pooling, args.max_length,
                        args.encode_batch_size, cache=cache, resume=args.resume,
                        restart=args.restart, progress=args.progress)
    if distributed.is_main():
        print(f"wrote {args.out}: {len(corpus)} × {encoder.width(args.pooling)} "
              f"({encoder.id.name}, {args.pooling}, {encoder.precision}"
              f"{'' if encoded else ', from the cache'})")


def _fit(args: argparse.Namespace) -> None:
    from ..export.card import summary
    from ..training.job import FitJob, run_fit
    from ..training.trainer import nll_text

    job = FitJob(args.input, args.out, args.method, args.k, args.d, args.shrinkage,
                 recipe=_flow_options(args), encoder=args.encoder, pooling=args.pooling,
                 max_length=args.max_length, batch_size=args.encode_batch_size,
                 device=args.device, dtype=args.dtype, cache=args.cache,
                 checkpoint=args.checkpoint, resume=args.resume, logdir=args.logdir,
                 dev_sts=args.dev_sts)
    say = None if args.progress is False else functools.partial(print, file=sys.stderr)
    fitted = run_fit(job, say=say, progress=args.progress)
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
    from ..embeddings.cache import EmbeddingCache
    from ..embeddings.file import open_embeddings
    from ..embeddings.outputs import check_destination, write_transformed
    from ..heads.head import FlowHead
    from ..storage.corpus import Corpus
    from ..storage.files import Checked, meta_path, read_sentences, sha256_file

    check_paths(args)
    out = Checked(args.out, check_destination, also=[meta_path(args.out)])
    if args.sentences is not None:  # --pooling: how the sentences are encoded
        head, encoder = _head_and_encoder(args)
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
        head = FlowHead.load(args.head)
        given = _load_encoder(args) if args.encoder else None
        x, origin = open_embeddings(args.embeddings, pooling=args.pooling, encoder=given)
        head.check(x.dim, origin["encoder"], origin["pooling"], origin["max_length"])
        z, source = head.transform(x.load()), origin["corpus"]
    write_transformed(args.out, z, head.describe(), source, out)
    print(f"wrote {args.out}: {z.shape[0]} × {z.shape[1]}")


def _eval(args: argparse.Namespace) -> None:
    from ..data.sts import load_tasks
    from ..embeddings.cache import EmbeddingCache
    from ..evaluation.sts import (
        check_rows_destination,
        evaluate_method,
        format_table,
        undefined_notes,
    )
    from ..storage.files import Checked, write_json
    from ..training.recipes import close_call, corpus_note, rule_note

    check_paths(args)
    out = Checked(args.out, check_rows_destination) if args.out is not None else None
    if args.retrieval is not None:
        from ..data.beir import load_task
        from ..evaluation.retrieval import check_mteb_destination

        task = load_task(args.retrieval, args.split or "test")
        if args.mteb is not None:
            check_mteb_destination(args.mteb, task.name)
    else:
        wanted = args.tasks or list(TASKS)
        tasks, missing = load_tasks(args.data, wanted)
        if not tasks:
            raise BertflowError(f"none of {', '.join(wanted)} is in {args.data}")
    method = args.method or "flow"
    fit_on = args.fit_on or ["target" if args.retrieval is None else "corpus"]
    head, encoder = _head_and_encoder(args, flow=method == "flow")
    options = {"pooling": args.pooling, "max_length": args.max_length, "fit_on": fit_on,
               "k": args.k, "d": args.d, "shrinkage": args.shrinkage,
               "recipe": _flow_options(args), "name": str(args.head),
               "batch_size": args.encode_batch_size, "progress": args.progress}
    say = functools.partial(print, file=sys.stderr if args.json else sys.stdout)
    if args.retrieval is not None:
        from ..evaluation.retrieval import evaluate_retrieval, format_retrieval_table, write_mteb

        started = time.perf_counter()
        rows = evaluate_retrieval(task, method if head is None else head, encoder,
                                  EmbeddingCache(args.cache), **options,
                                  ignore_identical_ids=args.ignore_identical_ids,
                                  every_k=args.mteb is not None)
        if args.mteb is not None:
            written = write_mteb(args.mteb, rows[0], time.perf_counter() - started)
            say(f"wrote {written}")
            rows[0].pop("mteb")
        if args.out is not None:
            write_json(args.out, rows, recheck=out)
        left_out = ", a document whose id is the query's left out" * rows[0][
            "ignore_identical_ids"]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print(f"{task.name} ({task.split}: {len(task.queries)} queries, "
                  f"{len(task.corpus)} documents{left_out}), × 100:")
            print(format_retrieval_table(rows))
        if rows[0].get("mean_cosine") is not None:  # a close call is warned of already
            if not close_call(rows[0]["mean_cosine"]):
                say(f"note: {rule_note(rows[0]['pooling'], rows[0]['mean_cosine'])}")
        return
    rows = evaluate_method(tasks, missing, method if head is None else head, encoder,
                           EmbeddingCache(args.cache), **options)
    if args.out is not None:
        write_json(args.out, rows, recheck=out)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for aggregation in ("all", "wmean"):
            print(f"Spearman × 100 ({aggregation}):")
            print(format_table(rows, aggregation))
    notes = undefined_notes(rows)
    if missing:
        notes.append(f"missing from {args.data}: {', '.join(missing)}")
    if head is None and method == "flow":  # of the recipes the rule chose for the tasks
        kinds = dict.fromkeys(r["recipe_corpus"] for r in rows if r.get("recipe_corpus"))
        pooling = rows[0]["pooling"]
        notes += [corpus_note(pooling, fit_on, kind) for kind in kinds]
        cosines = {r["task"]: r["mean_cosine"] for r in rows if r.get("mean_cosine") is not None}
        notes += [f"note: {task}: {rule_note(pooling, cosine)}"
                  for task, cosine in cosines.items() if not close_call(cosine)]
    for note in filter(None, notes):
        say(note)


def _diagnose(args: argparse.Namespace) -> None:
    from ..embeddings.cache import EmbeddingCache
    from ..evaluation.diagnose import diagnose
    from ..storage.files import read_sentences

    check_paths(args)
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
    from ..export.card import details, tagline
    from ..heads.catalog import ready_heads
    from ..heads.head import FlowHead

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
    from ..training.recipes import ISOTROPIC, ISOTROPIC_RECIPES, RECIPES

    def show(recipe: Any, indent: str) -> None:
        print(f"{indent}before:   {recipe.before}\n{indent}corpus:   {recipe.corpus}")
        for name, config in (("flow", recipe.flow), ("training", recipe.train)):
            settings = " ".join(f"{k}={v}" for k, v in config.to_dict().items())
            print(f"{indent}{name + ':':<9} {settings}")

    for pooling, recipe in RECIPES.items():
        if args.pooling in (None, pooling):
            print(f"{pooling}:")
            show(recipe, "  ")
            if pooling in ISOTROPIC_RECIPES:
                print(f"  where the fit embeddings' mean pair cosine is under {ISOTROPIC} "
                      "(--isotropic):")
                show(ISOTROPIC_RECIPES[pooling], "    ")


def _export(args: argparse.Namespace) -> None:
    from ..export.graphs import check_destination, export_onnx, export_program
    from ..heads.head import FlowHead

    check_paths(args)
    check_destination(args.out, args.format)
    head = FlowHead.load(args.head)
    if args.format == "sentence-transformers":
        from ..export.pipeline import build_pipeline, save_pipeline

        save_pipeline(build_pipeline(head, args.encoder, args.normalize), args.out)
    else:
        {"onnx": export_onnx, "torch-export": export_program}[args.format](head, args.out)
    print(f"wrote {args.out} ({args.format})")


def _index(args: argparse.Namespace) -> None:
    from ..embeddings.cache import EmbeddingCache
    from ..search.index import Index
    from ..storage.artifacts import INDEX_FOLDER
    from ..storage.corpus import Corpus

    INDEX_FOLDER.check_destination(args.out)
    check_paths(args)
    corpus = Corpus.from_file(args.corpus)
    head, encoder = _head_and_encoder(args)
    index = Index.build(corpus, encoder, head=head, pooling=args.pooling,
                        max_length=args.max_length, cache=EmbeddingCache(args.cache),
                        kind=args.kind, dims=args.dims, hnsw=_hnsw(args),
                        batch_size=args.encode_batch_size, progress=args.progress)
    if index is None:  # another process of a torchrun job builds it
        return
    index.save(args.out)
    c = index.config
    trained = f" (trained on {c['trained_on']})" if c["trained_on"] else ""
    graph = ", ".join(f"{k} {v}" for k, v in c["hnsw"].items()) if "hnsw" in c else ""
    print(f"wrote {args.out}: {c['count']} items, {c['kind']}{trained}"
          f"{f' ({graph})' if graph else ''}, {c['dims']}-d, {c['pooling']} pooling, "
          f"{'with' if head is not None else 'without'} a head")


def _hnsw(args: argparse.Namespace) -> dict[str, int] | None:
    """The HNSW settings given (--hnsw-m, --ef-construction, --ef-search), or None."""
    given = {"M": args.hnsw_m, "ef_construction": args.ef_construction,
             "ef_search": args.ef_search}
    return {k: v for k, v in given.items() if v is not None} or None


def _search(args: argparse.Namespace) -> None:
    from ..data.beir import read_queries
    from ..embeddings.cache import EmbeddingCache
    from ..search.index import Index

    queries = read_queries(args.queries) if args.queries else {
        str(n): q for n, q in enumerate(args.query, 1)}
    if any(not q.strip() for q in queries.values()):
        raise BertflowError("empty query")
    index = Index.load(args.index)
    if args.nprobe is not None:
        index.nprobe = args.nprobe
    if args.ef_search is not None:
        index.ef_search = args.ef_search
    hits_per_query = index.search(list(queries.values()), _load_encoder(args, index), args.top,
                                  args.encode_batch_size, cache=EmbeddingCache(args.cache),
                                  progress=args.progress)
    for (key, query), hits in zip(queries.items(), hits_per_query, strict=True):
        if args.json:
            print(json.dumps({"id": key, "query": query, "hits": [
                {"id": h.id, "score": h.score, "item": h.item, "line": h.line} for h in hits]},
                ensure_ascii=False))
            continue
        print(_printable(f"{key}  {query}" if args.queries else query))
        width = max((len(_printable(hit.id)) for hit in hits), default=1)
        for rank, hit in enumerate(hits, 1):
            print(f"  {rank:3d}  {hit.score:.4f}  {_printable(hit.id):<{width}}  "
                  f"{_printable(hit.item)}")


def _printable(text: str) -> str:
    """`text` for a terminal, one line: control characters (newlines, escape sequences), line
    separators and bidirectional overrides written as escapes, so that no text can forge a row
    or reach the terminal as a command."""
    return "".join(c.encode("unicode_escape").decode("ascii") if _CONTROL.match(c) else c
                   for c in text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _head_and_encoder(args: argparse.Namespace, flow: bool = False) -> tuple[Any, Any]:
    """--head loaded (or None), whose pooling and max length those given must be, and the
    encoder; with `flow` and no head, refuse a flow too large for the encoder's width."""
    from ..heads.head import FlowHead
    from ..training.recipes import choose

    head = None if args.head is None else FlowHead.load(args.head)
    for flag, given, recorded in (("--pooling", args.pooling, getattr(head, "pooling", None)),
                                  ("--max-length", getattr(args, "max_length", None),
                                   getattr(head, "max_length", None))):
        if None not in (given, recorded) and given != recorded:
            raise BertflowError(f"{flag} {given} differs from the head's {recorded}")
    encoder = _load_encoder(args, head)
    if flow and head is None:  # before anything is encoded
        pooling = encoder.defaults(args.pooling, getattr(args, "max_length", None))[0]
        choose(_flow_options(args), pooling)[0].flow.check(encoder.width(pooling))
    return head, encoder


def _load_encoder(args: argparse.Namespace, owner: Any = None) -> Any:
    """--encoder, else the encoder `owner` (a head or an index) records, else the default."""
    from ..encoders.loading import resolve_encoder

    return resolve_encoder(args.encoder, getattr(owner, "encoder", None), args.device,
                           args.dtype)


_RUN = {"encode": _encode, "fit": _fit, "transform": _transform, "eval": _eval,
        "diagnose": _diagnose, "export": _export, "index": _index, "search": _search,
        "info": _info, "recipes": _recipes}

if __name__ == "__main__":
    sys.exit(main())
