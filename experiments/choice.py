"""The label-free choice (`bertflow fit CORPUS --for retrieval`) on a BEIR task, scored on its
qrels only afterwards.

Per encoder (mean pooling, MTEB's max length), the choice is made as the CLI makes it: every
candidate fit on the task's documents, scored on the proxy built from them, the identity kept
unless a candidate beats it beyond its joint 95% bootstrap interval. Then every candidate's head is
scored on the split's qrels (nDCG@10), so that the table shows what was chosen, what the best
candidate was, and how well the proxy ranks the candidates (Spearman over every row, and over
the heads alone, feedback rows aside). The
settings: seeds 0, 1, 2 of the flow (the linear heads are closed-form: the same each seed);
the training split's queries as the query log (less any whose text is a scored query, which
the head would refuse); and at a third of the dimensions (`--dims`), with PCA the baseline and
the index bytes of the raw and the chosen head (`bertflow index --head`). No qrels are read
before every choice is made.

Pseudo-relevance feedback settings are candidates beside the heads (`bertflow.training.choice`):
their proxy score leaves each proxy query's own item out of what it feeds back. Each feedback
row also shows the proxy score with the own item fed back ("own kept"), the self-retrieval
that the choice's proxy avoids, so the two can be set against the test scores.

Writes experiments/results/choice.{json,md}.

    python experiments/choice.py [--encoder DIR --max-length N]... [--split test]

(the command that made the results file is written at its end).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from common import beir_parser, command_line
from scipy.stats import spearmanr

from bertflow import MethodSpec, load_encoder
from bertflow.data.beir import load_task
from bertflow.embeddings.cache import EmbeddingCache
from bertflow.evaluation.retrieval import evaluate_retrieval
from bertflow.search.index import Index
from bertflow.storage.corpus import Corpus, titled
from bertflow.storage.files import write_json
from bertflow.training.choice import (
    format_choice,
    proxy_feedback,
    query_key,
    recorded_feedback,
)
from bertflow.training.job import FitJob, run_fit
from bertflow.training.proxy import build_proxy, proxy_ndcg


def main() -> None:
    cli = beir_parser(__doc__)
    cli.add_argument("--log-split", default="train", help="the split whose queries are the log")
    args = cli.parse_args()
    with tempfile.TemporaryDirectory(prefix="choice-") as work:
        run(args, Path(work))


def run(args: argparse.Namespace, work: Path) -> None:
    """Every setting's choice per encoder, scored on the split; heads and a query log in
    `work`."""
    encoders = args.encoder or [None]
    lengths = args.max_length or [256] * len(encoders)
    scored, logged = load_task(args.beir, args.split), load_task(args.beir, args.log_split)
    cache = EmbeddingCache(args.cache)
    seen = {query_key(text) for text in scored.queries.values()}
    log_queries = [q for q in logged.queries.values() if query_key(q) not in seen]
    log = work / f"{args.log_split}-queries.txt"
    log.write_text("".join(f"{query_key(q)}\n" for q in log_queries), encoding="utf-8")
    settings = [("seed 0", 0, None, None), ("seed 1", 1, None, None), ("seed 2", 2, None, None),
                (f"{args.log_split} queries as the log", 0, log, None),
                ("a third of the dimensions", 0, None, 3),
                (f"a third, {args.log_split} queries as the log", 0, log, 3)]
    results, summary = [], []
    for folder, max_length in zip(encoders, lengths, strict=True):
        encoder = load_encoder(folder)
        name, raw = encoder.id.name, None
        for setting, seed, queries, third in settings:
            dims = encoder.width("mean") // third if third else None
            job = FitJob(args.beir / "corpus.jsonl", work / f"{name}-{len(results)}",
                         MethodSpec("flow", recipe={"train": {"seed": seed}}),
                         encoder=folder, pooling="mean", max_length=max_length,
                         cache=args.cache, choose_for="retrieval", queries=queries, dims=dims)
            choice = run_fit(job, progress=False).choice
            _own_kept(choice, args.beir / "corpus.jsonl", encoder, max_length, cache)
            for row in choice.rows:  # only now: the qrels
                head = choice.heads[row["candidate"]]
                [scores] = evaluate_retrieval(scored, head, encoder, cache, progress=False,
                                              feedback=recorded_feedback(head))
                row["test_ndcg_at_10"] = round(100 * scores["ndcg_at_10"], 4)
            raw = raw if raw is not None else choice.rows[0]["test_ndcg_at_10"]
            proxy = [r["proxy_ndcg_at_10"] for r in choice.rows]
            test = [r["test_ndcg_at_10"] for r in choice.rows]
            heads = [r for r in choice.rows if "feedback" not in r]
            chosen = next(r for r in choice.rows if r["chosen"])
            best = max(choice.rows, key=lambda r: r["test_ndcg_at_10"])
            record = {"encoder": name, "max_length": max_length, "setting": setting,
                      "log_queries": len(log_queries) if queries else 0,
                      "chosen": chosen["candidate"], "chosen_test": chosen["test_ndcg_at_10"],
                      "raw_test": raw, "best": best["candidate"],
                      "best_test": best["test_ndcg_at_10"],
                      "spearman": round(float(spearmanr(proxy, test)[0]), 4),
                      "spearman_heads": round(float(spearmanr(
                          [r["proxy_ndcg_at_10"] for r in heads],
                          [r["test_ndcg_at_10"] for r in heads])[0]), 4),
                      "proxy": choice.proxy, "rows": choice.rows}
            if dims:
                record["index_bytes"] = {"raw": _index_bytes(scored, encoder, None, max_length,
                                                             cache, work),
                                         "chosen": _index_bytes(scored, encoder, choice.head,
                                                                max_length, cache, work)}
            results.append(record)
            summary.append(_summary_row(record))
            print(summary[-1], flush=True)
    lines = [f"## The label-free choice on {scored.name} ({args.split}: {len(scored.queries)} "
             "queries), nDCG@10 × 100; no qrels used for any choice", "",
             "| encoder | setting | chosen | test nDCG@10 | vs raw | best candidate on test | "
             "Spearman proxy ~ test: every row, the heads |", "|---|---|---|---:|---:|---|---:|",
             *summary, "",
             f"The query log: {len(log_queries)} of the {len(logged.queries)} {args.log_split} "
             f"queries ({len(logged.queries) - len(log_queries)} left out: their text is a "
             f"{args.split} query's, which the head would refuse to be scored on).", ""]
    for record in results:
        lines += [f"### {record['encoder']}, {record['setting']}", "",
                  _with_test(format_choice(record["rows"]), record["rows"]), ""]
        if "index_bytes" in record:
            b = record["index_bytes"]
            lines += [f"Flat index of the {len(scored.corpus)} documents: raw {b['raw']:,} "
                      f"bytes, the chosen head's {b['chosen']:,} bytes.", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "choice.json", {"results": results})
    (args.out / "choice.md").write_text("\n".join([*lines, f"`{command_line('choice.py')}`",
                                                   ""]), encoding="utf-8")


def _own_kept(choice: Any, corpus: Path, encoder: Any, max_length: int,
              cache: EmbeddingCache) -> None:
    """Each feedback row's proxy nDCG@10 × 100 with the proxy query's own item fed back as
    any other hit (``proxy_own_kept``): the self-retrieval the choice leaves out."""
    proxy = build_proxy("retrieval", titled(corpus), name=str(corpus))
    queries, items = proxy.embed(lambda texts: cache.files(
        Corpus.from_sentences(texts, "a proxy"), encoder, "mean", max_length,
        progress=False)["mean"].load())
    for row in choice.rows:
        head = choice.heads.get(row["candidate"])
        if (feedback := recorded_feedback(head)) is None:
            continue
        z_items = head.transform(items)
        moved = proxy_feedback(feedback, head.transform(queries), z_items, own_kept=True)
        row["proxy_own_kept"] = round(100 * float(proxy_ndcg(moved, z_items).mean()), 4)


def _summary_row(r: dict[str, Any]) -> str:
    share = 100 * r["chosen_test"] / r["raw_test"]
    return (f"| {r['encoder']} | {r['setting']} | {r['chosen']} | {r['chosen_test']:.2f} "
            f"({share:.2f}% of raw) | "
            f"{r['chosen_test'] - r['raw_test']:+.2f} | {r['best']} ({r['best_test']:.2f}) | "
            f"{r['spearman']:.2f}, {r['spearman_heads']:.2f} |")


def _with_test(table: str, rows: list[dict[str, Any]]) -> str:
    """The choice's table with each candidate's test nDCG@10 as a last column, and a
    feedback row's proxy score with its own item kept before it."""
    head, rule, *body = table.splitlines()
    return "\n".join([head + " proxy, own kept | test nDCG@10 |", rule + "---:|---:|",
                      *(f"{line} {_kept(row)} | {row['test_ndcg_at_10']:.2f} |"
                        for line, row in zip(body, rows, strict=True))])


def _kept(row: dict[str, Any]) -> str:
    return f"{row['proxy_own_kept']:.2f}" if "proxy_own_kept" in row else ""


def _index_bytes(task: Any, encoder: Any, head: Any, max_length: int,
                 cache: EmbeddingCache, work: Path) -> int:
    """The bytes of the flat index of the task's documents, with `head` (None: raw)."""
    folder = Path(tempfile.mkdtemp(dir=work)) / "index"
    Index.build(task.corpus, encoder, head=head, pooling="mean", max_length=max_length,
                cache=cache, progress=False).save(folder)
    return sum(f.stat().st_size for f in folder.iterdir())


if __name__ == "__main__":
    main()
