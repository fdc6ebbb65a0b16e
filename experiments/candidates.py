"""Every label-free head candidate on a BEIR task, scored with its qrels: an oracle view.

Each candidate is a head of the one format fit on the task's documents alone (never on queries
or qrels): the identity (raw), the mean removed, the mean's direction projected out,
all-but-the-top (d = 1, 2, 3), whitening (plain, and its covariance shrunk by the α that
Ledoit-Wolf, OAS or the held-out likelihood choose), fractional whitening Σ^(−γ/2) (γ 0.1, 0.25,
0.5, 0.75, γ from the eigenspectrum, and γ 0.25 after Ledoit-Wolf's shrinkage), and at a third
of the dimensions PCA, whitening-k and fractional whitening (γ 0.25 and from the eigenspectrum),
and the pooling's recipe flow (seed 0). Every row is scored on the split's qrels, so this table
shows what a label-free choice could reach at best; it chooses nothing. The α each shrinkage
estimator chose on the documents, and the γ the eigenspectrum gave, are written below the
table. Mean pooling, MTEB's max length per encoder (256 for all-MiniLM-L6-v2, 384 for
all-mpnet-base-v2).

Writes experiments/results/candidates.{json,md}.

    python experiments/candidates.py [--encoder DIR --max-length N]... [--split test]

(the command that made the results file is written at its end).
"""

from __future__ import annotations

import time

from common import beir_parser, command_line

from bertflow import MethodSpec, load_encoder
from bertflow.constants import SHRINKAGE_ESTIMATORS
from bertflow.data.beir import load_task
from bertflow.embeddings.cache import EmbeddingCache
from bertflow.evaluation.retrieval import evaluate_retrieval
from bertflow.heads.linear import estimate_shrinkage, spectral_gamma
from bertflow.storage.files import write_json


def candidates(dim: int) -> list[tuple[str, MethodSpec]]:
    """(label, method) of every candidate on `dim`-d embeddings."""
    third = dim // 3
    return [
        ("identity (raw)", MethodSpec("identity")),
        ("center", MethodSpec("center")),
        ("no-mean-direction", MethodSpec("no-mean-direction")),
        *((f"abtt d={d}", MethodSpec("abtt", d=d)) for d in (1, 2, 3)),
        ("whitening", MethodSpec("whitening")),
        *((f"whitening, α by {e}", MethodSpec("whitening", shrinkage=e))
          for e in ("ledoit-wolf", "oas", "likelihood")),
        *((f"fractional γ={g}", MethodSpec("fractional", gamma=g))
          for g in (0.1, 0.25, 0.5, 0.75, "spectrum")),
        ("fractional γ=0.25, α by ledoit-wolf",
         MethodSpec("fractional", gamma=0.25, shrinkage="ledoit-wolf")),
        (f"pca k={third}", MethodSpec("pca", k=third)),
        (f"whitening-k k={third}", MethodSpec("whitening-k", k=third)),
        *((f"fractional γ={g} k={third}", MethodSpec("fractional", k=third, gamma=g))
          for g in (0.25, "spectrum")),
        ("flow (the mean recipe, seed 0)", MethodSpec("flow")),
    ]


def main() -> None:
    cli = beir_parser(__doc__)
    args = cli.parse_args()
    encoders = args.encoder or [None]
    lengths = args.max_length or [256] * len(encoders)
    task, cache = load_task(args.beir, args.split), EmbeddingCache(args.cache)
    rows, alphas, gammas = [], {}, {}
    lines = [f"## {task.name} ({args.split}: {len(task.queries)} queries), nDCG@10 × 100, every "
             "candidate fit on the documents, scored with the qrels (oracle)", "",
             "| encoder | candidate | nDCG@10 | vs raw | dims |", "|---|---|---:|---:|---:|"]
    for folder, max_length in zip(encoders, lengths, strict=True):
        encoder = load_encoder(folder)
        raw = None
        for label, method in candidates(encoder.width("mean")):
            began = time.perf_counter()
            [row] = evaluate_retrieval(task, method, encoder, cache, pooling="mean",
                                       max_length=max_length, progress=False)
            row.update(candidate=label, seconds=round(time.perf_counter() - began, 1))
            rows.append(row)
            raw = row["ndcg_at_10"] if raw is None else raw
            dims = method.k or encoder.width("mean")
            lines.append(f"| {encoder.id.name} | {label} | {100 * row['ndcg_at_10']:.2f} | "
                         f"{100 * (row['ndcg_at_10'] - raw):+.2f} | {dims} |")
            print(lines[-1], flush=True)
        documents = cache.files(task.corpus, encoder, "mean", max_length)["mean"].load()
        alphas[encoder.id.name] = {e: estimate_shrinkage(documents, e)
                                   for e in SHRINKAGE_ESTIMATORS}
        gammas[encoder.id.name] = {k or "all": spectral_gamma(documents, k)
                                   for k in (None, encoder.width("mean") // 3)}
    lines += ["", "The α each estimator chose on the documents: " + "; ".join(
        f"{name}: " + ", ".join(f"{e} {a:.4g}" for e, a in chosen.items())
        for name, chosen in alphas.items()) + ".", "",
        "The γ the eigenspectrum gave (`spectral_gamma`), keeping all components and a third: "
        + "; ".join(f"{name}: " + ", ".join(f"k {k} γ {g}" for k, g in chosen.items())
                    for name, chosen in gammas.items()) + "."]
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "candidates.json", {"rows": rows, "shrinkage": alphas,
                                              "gamma": gammas})
    command = command_line("candidates.py")
    (args.out / "candidates.md").write_text("\n".join([*lines, "", f"`{command}`", ""]),
                                            encoding="utf-8")


if __name__ == "__main__":
    main()
