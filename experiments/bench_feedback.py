"""Pseudo-relevance feedback's cost: queries/s of a plain search against the same search with
feedback (`Index.feedback`: a first search of K hits, their vectors read back from the index,
the moved queries searched again), exact (flat) and approximate (hnsw), FAISS on one thread,
and how much of each query's top 10 feedback changes.

The vectors: an embeddings file's rows (--vectors, such as `bertflow encode`'s output; its
first --queries rows are the queries, the next --size the corpus), else seeded Gaussian vectors
of --dim dimensions with a spectrum that decays as embeddings' do (the cost of a search hardly
depends on what the vectors mean; how good the moved queries are is the retrieval
evaluation's to say: `bertflow eval retrieval --feedback-k K`). Queries/s: all queries in one
`search_embeddings` call, best of --rounds. Writes experiments/results/bench_feedback.{json,md}
(--name: another name).

    python experiments/bench_feedback.py [--size 100000] [--dim 384] [--queries 1000]
        [--vectors FILE.npy] [--kinds flat hnsw] [--feedback-k 3] [--feedback-beta 0.5]
        [--rounds 3] [--threads 1] [--name bench_feedback]
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Sequence

import numpy as np
from bench_index import machine
from common import parser

from bertflow.search.index import Index
from bertflow.search.kinds import faiss_module
from bertflow.training.feedback import Feedback

SEED = 0


def gaussian(count: int, dim: int, seed: int = SEED) -> np.ndarray:
    """`count` float32 rows of a seeded Gaussian whose i-th axis has standard deviation
    1/sqrt(i + 1), rotated at random."""
    rng = np.random.default_rng(seed)
    rotation = np.linalg.qr(rng.standard_normal((dim, dim)))[0]
    scale = 1 / np.sqrt(np.arange(1, dim + 1))
    return ((rng.standard_normal((count, dim)) * scale) @ rotation.T).astype(np.float32)


def measure(x: np.ndarray, queries: np.ndarray, kinds: Sequence[str], feedback: Feedback,
            rounds: int = 3, k: int = 10) -> list[dict]:
    """For each kind, an `Index` of `x`: queries/s of `queries` searched for their top `k`
    plainly and with `feedback` (best of `rounds`), the ratio of the times, and the share of
    the top `k` that feedback changes (mean over the queries)."""
    items = [""] * len(x)
    rows = []
    for kind in kinds:
        index = Index.from_embeddings(x, items, pooling="mean", kind=kind)
        timed = {}
        for setting in (None, feedback):
            index.feedback = setting
            index.search_embeddings(queries[:10], k)  # warm-up
            best = float("inf")
            for _ in range(rounds):
                began = time.perf_counter()
                found = index.search_embeddings(queries, k)[1]
                best = min(best, time.perf_counter() - began)
            timed[setting] = best, found
        (plain, before), (moved, after) = timed[None], timed[feedback]
        changed = np.mean([1 - len(set(a) & set(b)) / k for a, b in zip(before, after,
                                                                        strict=True)])
        rows.append({"kind": kind, "vectors": len(x), "dim": x.shape[1], "queries": len(queries),
                     "plain_qps": len(queries) / plain, "feedback_qps": len(queries) / moved,
                     "time_ratio": moved / plain, f"changed@{k}": float(changed)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def report(results: dict) -> str:
    f = results["feedback"]
    lines = [f"# Pseudo-relevance feedback's cost on {results['machine']}\n",
             f"Made by `{results['command']}` (faiss {results['faiss']}, {results['threads']} "
             f"thread(s)): {results['source']}; feedback k {f['k']}, β {f['beta']}"
             f"{', weighted' if f['weighted'] else ''}; best of {results['rounds']} rounds.\n",
             "| kind | vectors | dim | queries/s plain | queries/s feedback | time × plain | "
             "top 10 changed |", "|---|---:|---:|---:|---:|---:|---:|"]
    for run in results["runs"]:
        lines.append(f"| {run['kind']} | {run['vectors']:,} | {run['dim']} | "
                     f"{run['plain_qps']:,.0f} | {run['feedback_qps']:,.0f} | "
                     f"{run['time_ratio']:.2f} | {run['changed@10']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    options = parser(__doc__, "out")
    options.add_argument("--size", type=int, default=100_000, help="corpus vectors")
    options.add_argument("--dim", type=int, default=384, help="Gaussian vectors' dimension")
    options.add_argument("--queries", type=int, default=1000)
    options.add_argument("--vectors", default=None, help="an .npy of embeddings to use instead")
    options.add_argument("--kinds", nargs="+", default=["flat", "hnsw"])
    options.add_argument("--feedback-k", type=int, default=3)
    options.add_argument("--feedback-beta", type=float, default=0.5)
    options.add_argument("--rounds", type=int, default=3)
    options.add_argument("--threads", type=int, default=1, help="FAISS threads")
    options.add_argument("--name", default="bench_feedback",
                         help="the results files' name, before .json and .md")
    args = options.parse_args()

    faiss_module().omp_set_num_threads(args.threads)
    if args.vectors:
        x = np.load(args.vectors, mmap_mode="r")
        if len(x) < args.queries + args.size:
            raise SystemExit(f"{args.vectors} holds {len(x)} rows, fewer than --queries + --size")
        queries, corpus = (np.array(x[:args.queries]),
                           np.array(x[args.queries:args.queries + args.size]))
        source = f"the rows of {args.vectors}"
    else:
        queries, corpus = np.split(gaussian(args.queries + args.size, args.dim), [args.queries])
        source = f"seeded Gaussian vectors of {args.dim} dimensions (spectrum 1/sqrt(i))"
    feedback = Feedback(args.feedback_k, args.feedback_beta)
    results = {"command": "python experiments/bench_feedback.py " + shlex.join(sys.argv[1:]),
               "machine": machine(), "faiss": faiss_module().__version__,
               "threads": args.threads, "source": source, "rounds": args.rounds,
               "feedback": feedback.to_dict(),
               "runs": measure(corpus, queries, args.kinds, feedback, args.rounds)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=2) + "\n")
    text = report(results)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
