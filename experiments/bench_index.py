"""Index kinds at scale: build time, queries/s, memory and recall@10 of FAISS index kinds
(flat, hnsw, IVF1024,Flat, IVF1024,PQ32np, OPQ32,IVF1024,PQ32np; each IVF kind at several
nprobe) on 1M vectors, raw and after the shipped flow head: does an isotropic space quantise
better under PQ?

The vectors: 100k sentences made by joining the first half of one Wikipedia-sample sentence
(cut at the clause mark nearest its middle, else at its middle word) to the second half of
another (seeded), encoded by the real default encoder (all-MiniLM-L6-v2, first_last pooling,
max length 128, the shipped head's settings) through the embedding cache; then 900k more
sampled (seeded) from a Gaussian with the mean and full covariance of those 100k real
vectors, which brings the corpus to 1M. The queries are 1,000 more recombined sentences,
encoded (never in the corpus). The head is the shipped `minilm-first_last-wiki`, applied
once to corpus and queries (`Head.transform`, as `Index.from_embeddings(..., head=...)`
and `search_embeddings` would on every build and search), so that the build times and
queries/s are the index's alone in both spaces; each space's ground truth is the exact top-10 of its
own flat index, so recall@10 is what the approximate kind keeps of exact search in that
space. HNSW (slow to build at 1M on few cores) runs on the real vectors alone, with flat,
IVF1024,Flat and IVF1024,PQ32np as a check that needs no synthetic vectors (--real-kinds).

FAISS builds and searches on one thread (--threads): on a shared machine its OpenMP
threads wait for each other spinning (two threads trained IVF16,PQ8np on 10k vectors 16×
slower than one beside other work on 2 cores). Queries/s: all queries in one `search` call;
bytes are `faiss.serialize_index`'s size (codes, lists, codebooks, the normalisation), and
per vector that over the vectors held. Writes experiments/results/bench_index.{json,md}
(--name: another name).

    python experiments/bench_index.py [--size 1000000] [--real 100000] [--queries 1000]
        [--nprobe 1 8 32] [--kinds flat IVF1024,Flat ...] [--real-kinds flat hnsw ...]
        [--threads 1] [--batch-size 64] [--name bench_index]
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from common import parser

from bertflow import BertflowError, Head, load_encoder
from bertflow.embeddings.cache import EmbeddingCache
from bertflow.search.index import Index
from bertflow.search.kinds import faiss_module
from bertflow.storage.files import read_sentences

HEAD = "minilm-first_last-wiki"
POOLING, MAX_LENGTH = "first_last", 128  # the shipped head's
KINDS = ("flat", "hnsw", "IVF1024,Flat", "IVF1024,PQ32np", "OPQ32,IVF1024,PQ32np")
SEED = 0


def recombine(sentences: Sequence[str], count: int, seed: int = SEED) -> list[str]:
    """`count` distinct sentences, each the first half of one of `sentences` joined to the
    second half of another (halves cut at the clause mark nearest the middle, else at the
    middle word; sentences under six words are left out), seeded."""
    halves = []
    for sentence in sentences:
        words = sentence.split()
        if len(words) < 6:
            continue
        marks = [i + 1 for i, w in enumerate(words[1:-2], 1) if w.endswith((",", ";"))]
        cut = min(marks, key=lambda i: abs(i - len(words) / 2)) if marks else len(words) // 2
        halves.append((" ".join(words[:cut]), " ".join(words[cut:])))
    if len(halves) < 2 or count > len(halves) * (len(halves) - 1):
        raise ValueError(f"{len(halves)} sentences cannot make {count} pairs")
    rng = np.random.default_rng(seed)
    seen: set[tuple[int, int]] = set()
    made: list[str] = []
    while len(made) < count:
        i, j = (int(v) for v in rng.integers(len(halves), size=2))
        if i != j and (i, j) not in seen:
            seen.add((i, j))
            made.append(f"{halves[i][0]} {halves[j][1]}")
    return made


def embed(sentences: list[str], cache: Path, batch_size: int, dtype: str) -> np.ndarray:
    """The default encoder's first_last embeddings of `sentences` at `dtype`, through the
    cache."""
    encoder = load_encoder(None, dtype=dtype)
    return np.asarray(EmbeddingCache(cache).encode(sentences, encoder, POOLING, MAX_LENGTH,
                                                   batch_size, progress=True))


def gaussian(x: np.ndarray, count: int, seed: int = SEED, block: int = 100_000) -> np.ndarray:
    """`count` float32 rows drawn (seeded) from the Gaussian with the mean and full covariance
    of the rows of `x`."""
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(0)
    cov = np.cov(x, rowvar=False)
    root = np.linalg.cholesky(cov + 1e-9 * np.trace(cov) / len(cov) * np.eye(len(cov)))
    rng = np.random.default_rng(seed)
    out = np.empty((count, x.shape[1]), dtype=np.float32)
    for start in range(0, count, block):
        rows = min(block, count - start)
        out[start : start + rows] = rng.standard_normal((rows, x.shape[1])) @ root.T + mean
    return out


def measure(x: np.ndarray, queries: np.ndarray, kinds: Sequence[str], nprobes: Sequence[int],
            k: int = 10) -> list[dict]:
    """For each kind (the first must be `flat`: its top-`k` is the truth), an `Index` of `x`:
    build seconds, bytes serialized and per vector, and for each nprobe (IVF
    kinds) queries/s and recall@k against the flat index; on FAISS's threads as set. A kind
    with too few vectors to train on is left out."""
    faiss = faiss_module()
    if kinds[0] != "flat":
        raise ValueError("the first kind must be flat (the ground truth)")
    items = [""] * len(x)
    truth = None
    rows = []
    for kind in kinds:
        began = time.perf_counter()
        try:
            index = Index.from_embeddings(x, items, pooling=POOLING, max_length=MAX_LENGTH,
                                          kind=kind)
        except BertflowError as e:  # too few vectors to train it: a small run
            print(f"{kind}: left out ({e})", flush=True)
            continue
        built = time.perf_counter() - began
        size = int(faiss.serialize_index(index.faiss_index).size)
        for nprobe in (nprobes if index.nprobe is not None else [None]):
            if nprobe is not None:
                index.nprobe = min(nprobe, faiss.extract_index_ivf(index.faiss_index).nlist)
            index.search_embeddings(queries[:10], k)  # warm-up
            began = time.perf_counter()
            _, found = index.search_embeddings(queries, k)
            searched = time.perf_counter() - began
            if truth is None:
                truth = found
            recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(found, truth,
                                                                     strict=True)])
            rows.append({"kind": kind, "nprobe": nprobe, "vectors": len(x),
                         "build_s": built, "bytes": size, "bytes_per_vector": size / len(x),
                         "qps": len(queries) / searched, f"recall@{k}": float(recall)})
            print(json.dumps(rows[-1]), flush=True)
        del index
    return rows


def main() -> None:
    options = parser(__doc__, "cache", "out", "generic")
    options.add_argument("--size", type=int, default=1_000_000,
                         help="corpus vectors: the real ones, then Gaussian samples")
    options.add_argument("--real", type=int, default=100_000,
                         help="recombined sentences encoded for the corpus")
    options.add_argument("--queries", type=int, default=1000)
    options.add_argument("--nprobe", type=int, nargs="+", default=[1, 8, 32])
    options.add_argument("--batch-size", type=int, default=64)
    options.add_argument("--dtype", default="float32", help="the encoder's precision")
    options.add_argument("--name", default="bench_index",
                         help="the results files' name, before .json and .md")
    options.add_argument("--threads", type=int, default=1,
                         help="FAISS threads for building and searching")
    options.add_argument("--kinds", nargs="+", default=[k for k in KINDS if k != "hnsw"],
                         help="index kinds on all the vectors (flat first)")
    options.add_argument("--real-kinds", nargs="+", default=list(KINDS[:4]),
                         help="index kinds on the real vectors alone (flat first)")
    args = options.parse_args()
    if args.size < args.real:
        raise SystemExit("--size must be at least --real")

    faiss_module().omp_set_num_threads(args.threads)
    sentences = recombine(read_sentences(args.generic), args.queries + args.real)
    began = time.perf_counter()
    x = embed(sentences, args.cache, args.batch_size, args.dtype)
    encoded = time.perf_counter() - began
    queries, real = np.array(x[: args.queries]), np.array(x[args.queries :])
    corpus = np.concatenate([real, gaussian(real, args.size - args.real)])
    head = Head.load(HEAD)
    head.check(pooling=POOLING)
    began = time.perf_counter()
    spaces = {"raw": (corpus, queries), "head": (head.transform(corpus), head.transform(queries))}
    transformed = time.perf_counter() - began
    del corpus

    results: dict = {
        "command": "python experiments/bench_index.py " + shlex.join(sys.argv[1:]),
        "machine": machine(), "threads": args.threads, "faiss": faiss_module().__version__,
        "encoder": "all-MiniLM-L6-v2", "pooling": POOLING, "max_length": MAX_LENGTH,
        "dtype": args.dtype, "head": HEAD, "size": args.size, "real": args.real,
        "gaussian": args.size - args.real, "queries": args.queries, "nprobe": args.nprobe,
        "encode_s": encoded, "head_transform_s": transformed, "runs": []}
    for space, (vectors, asked) in spaces.items():
        for scale, rows, kinds in ((f"{args.size:,} ({args.real:,} real + "
                                    f"{args.size - args.real:,} Gaussian)", args.size, args.kinds),
                                   (f"{args.real:,} real", args.real, args.real_kinds)):
            if rows == args.size and scale.startswith(f"{args.real:,} real"):
                continue
            print(f"# {space}, {scale}", flush=True)
            for row in measure(vectors[:rows], asked, kinds, args.nprobe):
                results["runs"].append({"space": space, "corpus": scale, **row})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=2) + "\n")
    text = report(results)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return f"{model}, {os.cpu_count()} cores"


def report(results: dict) -> str:
    lines = [
        f"# Index kinds at scale on {results['machine']}\n",
        f"Made by `{results['command']}` (faiss {results['faiss']}). Corpus: "
        f"{results['real']:,} recombined Wikipedia-sample sentences encoded by "
        f"{results['encoder']} ({results['pooling']} pooling, max length "
        f"{results['max_length']}, {results['dtype']}), then {results['gaussian']:,} vectors "
        "sampled from a Gaussian with their mean and full covariance (synthetic, not text); "
        f"{results['queries']:,} held-out recombined sentences as queries. `head` is every "
        f"vector after the shipped `{results['head']}` head ({results['head_transform_s']:.0f} "
        "s for corpus and queries, not in the build times). Recall@10 is against the exact "
        "top-10 of the flat index in the same space; FAISS on "
        f"{results['threads']} thread(s) for building and searching; bytes are the serialized "
        "index.\n",
    ]
    for corpus in dict.fromkeys(run["corpus"] for run in results["runs"]):
        lines += [f"## {corpus} vectors\n",
                  "| kind | nprobe | build s raw | build s head | queries/s raw | "
                  "queries/s head | bytes/vector | recall@10 raw | recall@10 head |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        runs = [run for run in results["runs"] if run["corpus"] == corpus]
        for raw, head in pairs(runs):
            lines.append(
                f"| {raw['kind']} | {raw['nprobe'] or ''} | {raw['build_s']:.1f} | "
                f"{head['build_s']:.1f} | {raw['qps']:.0f} | {head['qps']:.0f} | "
                f"{raw['bytes_per_vector']:.1f} | {raw['recall@10']:.3f} | "
                f"{head['recall@10']:.3f} |")
        lines.append("")
        gains = [head["recall@10"] - raw["recall@10"] for raw, head in pairs(runs)
                 if "PQ" in raw["kind"]]
        if len(gains) == 1:
            lines += [f"PQ: recall@10 after the head minus raw: {gains[0]:+.3f}.\n"]
        elif gains:
            lines += [f"PQ kinds here: recall@10 after the head minus raw, from "
                      f"{min(gains):+.3f} to {max(gains):+.3f} (mean {np.mean(gains):+.3f}) "
                      f"over {len(gains)} kind and nprobe settings.\n"]
    return "\n".join(lines)


def pairs(runs: list[dict]) -> list[tuple[dict, dict]]:
    """Each raw run with the head run of the same kind and nprobe."""
    return [(raw, next(run for run in runs if run["space"] == "head" and
                       (run["kind"], run["nprobe"]) == (raw["kind"], raw["nprobe"])))
            for raw in runs if raw["space"] == "raw"]


if __name__ == "__main__":
    main()
