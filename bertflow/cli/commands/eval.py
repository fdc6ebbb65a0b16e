"""`bertflow eval`: score STS tasks (eval sts) or a BEIR retrieval task (eval retrieval)."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import textwrap
import time
from pathlib import Path

from ...constants import METHODS, TASKS
from ...errors import BertflowError
from ..checks import check_paths, feedback_of
from ..options import Formatter, Parser, baseline_options, feedback_options, head_or_flow_options
from ..shared import flow_options, head_and_encoder

SUMMARY = "score STS tasks (eval sts) or a BEIR retrieval task (eval retrieval)"
DESCRIPTION = """\
`bertflow eval sts DATA` and `bertflow eval retrieval DIR`: a fitted head, or a method
fit without labels, scored against human judgements. `bertflow eval sts --help` and
`bertflow eval retrieval --help` show each one's options."""


def arguments(p: argparse.ArgumentParser) -> None:
    kinds = p.add_subparsers(dest="eval_kind", required=True, parser_class=Parser,
                             metavar="{sts,retrieval}")
    sts = kinds.add_parser("sts", formatter_class=Formatter, help="Spearman on STS tasks",
                           description=textwrap.dedent("""
        Spearman correlation × 100 of cosine similarity with human scores on the STS tasks
        found in DATA (SentEval's layout), for a fitted head or for a method fit on each task's
        own sentences (no scores) or on text files.""").strip())
    sts.add_argument("data", type=Path, metavar="DATA", help="folder in SentEval's layout")
    sts.add_argument("--tasks", nargs="+", choices=TASKS, default=None,
                     help="STS tasks to score, where DATA has them (default: all)")
    _eval_options(sts, "'target' (each task's own sentences, no scores), text "
                  "files, or both: 'target FILE' fits each task on its own sentences and the "
                  "file's (default: target)")
    sts.set_defaults(retrieval=None)
    retrieval = kinds.add_parser(
        "retrieval", formatter_class=Formatter, help="nDCG@10 and more on a BEIR task",
        description=textwrap.dedent("""
        A BEIR task's split: all documents ranked by cosine per query, scored as MTEB does
        with pytrec_eval (nDCG@10, MAP@100, MRR@10, recall@100; --mteb writes MTEB's result
        file with every measure at k 1, 3, 5, 10, 20, 100, 1000); the method never sees the
        qrels.""").strip())
    retrieval.add_argument("retrieval", type=Path, metavar="DIR",
                           help="a BEIR task's folder: corpus.jsonl, queries.jsonl, "
                           "qrels/SPLIT.tsv")
    retrieval.add_argument("--split", choices=("test", "train", "dev"), default=None,
                           help="the qrels scored (default: test)")
    retrieval.add_argument(
        "--ignore-identical-ids", action=argparse.BooleanOptionalAction, default=None,
        help="leave a document whose id is the query's out of its ranking (default: as MTEB "
        "does for the task: yes for arguana, quora, fiqa, msmarco and fever, no for the others)")
    retrieval.add_argument("--mteb", type=Path, default=None, metavar="FOLDER",
                           help="also write MTEB's result file of the task (TASK.json, MTEB's "
                           "task name) into this folder of a model's results")
    _eval_options(retrieval, "'corpus' (the documents), 'queries' (the split's), "
                  "text files, or several together (default: corpus)")
    feedback_options(retrieval, recorded="the head")


def check(args: argparse.Namespace, launched: bool) -> None:
    """Refuse --fit-on where nothing is fit (--method raw, --head) or where it names an STS
    task's own sentences for retrieval, and a baseline's options with --head."""
    if args.retrieval is not None and "target" in (args.fit_on or []):
        raise BertflowError("--fit-on target applies to eval sts; eval retrieval fits on "
                            "corpus, queries or text files")
    if args.method == "raw" and args.fit_on is not None:
        raise BertflowError("--fit-on applies to a method that is fit, not to --method raw")
    if args.head is not None:
        if args.fit_on is not None:
            raise BertflowError("--fit-on does not apply to --head: the head is already fit")
        if any(v is not None for v in (args.k, args.d, args.shrinkage, args.gamma)):
            raise BertflowError("--dims, --d, --shrinkage and --gamma apply to a linear method "
                                f"fit here, not to --head {args.head}, which is fit already")


def run(args: argparse.Namespace) -> None:
    from ...data.sts import load_tasks
    from ...embeddings.cache import EmbeddingCache
    from ...evaluation.sts import evaluate_method, format_table, undefined_notes
    from ...storage.artifacts import ROWS
    from ...storage.files import Checked, write_json
    from ...training.recipes import close_call, corpus_note, rule_note
    from ...training.spec import MethodSpec

    check_paths(args)
    out = Checked(args.out, ROWS.check_destination) if args.out is not None else None
    if args.retrieval is not None:
        from ...data.beir import load_task
        from ...evaluation.retrieval import check_mteb_destination

        task = load_task(args.retrieval, args.split or "test")
        if args.mteb is not None:
            check_mteb_destination(args.mteb, task.name)
    else:
        wanted = args.tasks or list(TASKS)
        tasks, missing = load_tasks(args.data, wanted)
        if not tasks:
            raise BertflowError(f"none of {', '.join(wanted)} is in {args.data}")
    fit_on = args.fit_on or ["target" if args.retrieval is None else "corpus"]
    head, encoder = head_and_encoder(args, flow=args.method == "flow")
    method = head if head is not None else MethodSpec(
        args.method, args.k, args.d, args.shrinkage,
        flow_options(args) if args.method == "flow" else None, args.gamma)
    options = {"pooling": args.pooling, "max_length": args.max_length, "fit_on": fit_on,
               "name": str(args.head), "batch_size": args.encode_batch_size,
               "progress": args.progress}
    say = functools.partial(print, file=sys.stderr if args.json else sys.stdout)
    if args.retrieval is not None:
        from ...evaluation.retrieval import evaluate_retrieval, format_retrieval_table, write_mteb
        from ...training.choice import recorded_feedback

        started = time.perf_counter()
        rows = evaluate_retrieval(task, method, encoder, EmbeddingCache(args.cache), **options,
                                  ignore_identical_ids=args.ignore_identical_ids,
                                  every_k=args.mteb is not None,
                                  feedback=feedback_of(args, recorded_feedback(head),
                                                       source=args.head and "the head"))
        if args.mteb is not None:
            say(f"wrote {write_mteb(args.mteb, rows[0], time.perf_counter() - started)}")
            rows[0].pop("mteb")
        left_out = ", a document whose id is the query's left out" * rows[0][
            "ignore_identical_ids"]
        tables = {f"{task.name} ({task.split}: {len(task.queries)} queries, {len(task.corpus)} "
                  f"documents{left_out}), × 100:": format_retrieval_table(rows)}
        cosine = rows[0].get("mean_cosine")  # a close call is warned of already
        notes = [f"note: {rule_note(rows[0]['pooling'], cosine)}"] \
            if cosine is not None and not close_call(cosine) else []
    else:
        rows = evaluate_method(tasks, missing, method, encoder, EmbeddingCache(args.cache),
                               **options)
        tables = {f"Spearman × 100 ({a}):": format_table(rows, a) for a in ("all", "wmean")}
        notes = undefined_notes(rows)
        if missing:
            notes.append(f"missing from {args.data}: {', '.join(missing)}")
        if head is None and method.name == "flow":  # of the recipes the rule chose for the tasks
            kinds = dict.fromkeys(r["recipe_corpus"] for r in rows if r.get("recipe_corpus"))
            pooling = rows[0]["pooling"]
            notes += [corpus_note(pooling, fit_on, kind) for kind in kinds]
            cosines = {r["task"]: r["mean_cosine"] for r in rows
                       if r.get("mean_cosine") is not None}
            notes += [f"note: {task}: {rule_note(pooling, cosine)}"
                      for task, cosine in cosines.items() if not close_call(cosine)]
    if args.out is not None:
        write_json(args.out, rows, recheck=out)
    print(json.dumps(rows, indent=2) if args.json else
          "\n".join(f"{title}\n{table}" for title, table in tables.items()))
    for note in filter(None, notes):
        say(note)


def _eval_options(p: argparse.ArgumentParser, fit_on_help: str) -> None:
    """What `eval sts` and `eval retrieval` share: what is scored, and where the rows go."""
    which = p.add_mutually_exclusive_group()
    which.add_argument("--head", type=Path, help="score a fitted head (its encoder and pooling)")
    which.add_argument("--method", choices=METHODS, default="flow", help="the method fit here")
    p.add_argument("--fit-on", nargs="+", default=None, metavar="SOURCE", help=fit_on_help)
    baseline_options(p)
    p.add_argument("--out", type=Path, default=None, metavar="ROWS.json",
                   help="also write the rows here")
    p.add_argument("--json", action="store_true", help="print the rows as JSON, not tables")
    head_or_flow_options(p)
