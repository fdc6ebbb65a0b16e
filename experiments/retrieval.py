"""What the head does to retrieval, to memory and as a density, on the default encoder.

1. Retrieval: for STS-B test and SICK-R test, every sentence of a pair with gold ≥ 4 is a
   query and its partners in such pairs are the relevant items, searched with a flat FAISS
   index among all sentences of that test set. Recall@1, recall@10 and MRR for raw pooling,
   BERT-whitening and the flow (the release's defaults), each fit on the task's own sentences
   without scores, and the pooling's recipe fit on its text (`Recipe.corpus`: the task's
   sentences with the generic sample, or the generic sample alone), per pooling.
2. Smaller vectors: the same search on STS-B with k dimensions kept, for the flow followed by
   PCA (`Index(dims=k)`) against whitening-k and raw pooling followed by PCA.
3. Density: a head fit on the STS-B train+dev sentences scores the unseen STS-B test sentences
   (in domain) against as many Wikipedia-sample sentences (out of domain), by −log p(x) and by
   typicality (distance from the training rows' median −log p), and a head fit on the rest of
   the Wikipedia sample does the reverse: AUROC of each, and how −log p follows sentence length.

Writes experiments/results/retrieval.{json,md}.

    python experiments/retrieval.py [--data DIR] [--encoder DIR]
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
from common import parser
from scipy.stats import spearmanr

from bertflow import POOLINGS, fit_head, load_encoder, sts
from bertflow.data.sts import Pairs
from bertflow.embeddings.cache import EmbeddingCache
from bertflow.evaluation.methods import make_method
from bertflow.heads.density import auroc, novelty, typicality
from bertflow.search.index import Index
from bertflow.storage.files import read_sentences, write_json
from bertflow.training.recipes import recommended

DIMS = (16, 32, 64, 128, 256, 384)


def main() -> None:
    args = parser(__doc__, "data", "encoder", "generic", "cache", "out").parse_args()
    began = time.perf_counter()

    encoder = load_encoder(args.encoder)
    cache = EmbeddingCache(args.cache)
    tasks, missing = sts.load_tasks(args.data, ["STS-B", "SICK-R"])

    def embed(sentences, pooling):
        return cache.embedder(encoder, pooling)(sentences)

    generic = read_sentences(args.generic)
    rows = retrieval(tasks, generic, embed)
    if "STS-B" in tasks:
        rows += smaller_vectors(tasks["STS-B"], embed)
        train = sts.sentences_of(sts.read_stsb_splits(args.data / "STSBenchmark",
                                                      ("train", "dev")).values())
        rows += density(tasks["STS-B"], train, generic, embed)

    minutes = (time.perf_counter() - began) / 60
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "retrieval.json", {"rows": rows, "missing": missing})
    (args.out / "retrieval.md").write_text(_markdown(rows, encoder.id.name, minutes, missing))
    print(f"{len(rows)} rows in {minutes:.1f} min")


def retrieval(tasks: dict, generic: list[str], embed) -> list[dict]:
    """1. Recall@1, recall@10 and MRR of each method, fit on the task's own sentences (the
    recipe's flow on its text: with, or as, the `generic` sentences)."""
    rows = []
    for name, task in tasks.items():
        items = task.sentences()
        relevant = relevant_pairs(task.test[0])
        for pooling in POOLINGS:
            target, x = embed(task.unlabeled, pooling), embed(items, pooling)
            for label, method, fit_x in _methods(pooling, target, embed(generic, pooling)):
                z = method.fit(fit_x).transform(x)
                scores = retrieval_scores(Index.from_embeddings(z, items), z, relevant)
                rows.append(_row({"part": "retrieval", "task": name, "pooling": pooling,
                                  "method": label, **scores}))
    return rows


def smaller_vectors(task, embed) -> list[dict]:
    """2. Recall against kept dimensions: the flow and raw pooling followed by PCA, and
    whitening-k, on STS-B."""
    items, relevant = task.sentences(), relevant_pairs(task.test[0])
    rows = []
    for pooling in ("cls", "first_last"):
        fit_x, x = embed(task.unlabeled, pooling), embed(items, pooling)
        flow = make_method("flow").fit(fit_x)
        z = flow.transform(x)
        for dims in DIMS:
            for label, vectors, reduce in (
                ("flow + PCA", z, dims),
                (f"whitening-{dims}", _whitening(dims, fit_x.shape[1]).fit(fit_x)
                 .transform(x), None),
                ("raw + PCA", x, dims),
            ):
                index = Index.from_embeddings(vectors, items, dims=reduce)
                scores = retrieval_scores(index, vectors, relevant)
                rows.append(_row({"part": "dims", "task": "STS-B", "pooling": pooling,
                                  "method": label.split("-")[0], "dims": dims,
                                  **scores}))
    return rows


def _whitening(k: int, dim: int):
    """Whitening to `k` components; all of them: full whitening (whitening-k refuses components
    without variance, full whitening centres them)."""
    return make_method("whitening-k", k=k) if k < dim else make_method("whitening")


def density(task, train: list[str], generic: list[str], embed) -> list[dict]:
    """3. Out of domain by density: heads fit on STS-B train+dev (A) and on the Wikipedia
    sample (B) tell the unseen STS-B test sentences from as many Wikipedia ones."""
    seen = set(train)
    in_domain = [s for s in task.sentences() if s not in seen]
    held = set(np.random.default_rng(0).choice(len(generic), len(in_domain), False).tolist())
    out_domain = [generic[i] for i in sorted(held)]
    rest = [s for i, s in enumerate(generic) if i not in held]
    words = np.array([len(s.split()) for s in in_domain + out_domain])
    rows = []
    for pooling in POOLINGS:
        sts_x, wiki_x = embed(in_domain, pooling), embed(out_domain, pooling)
        fit_x = embed(train, pooling)
        head = fit_head(fit_x)  # fit on STS-B train+dev: Wikipedia is out of domain
        near, far, seen_nll = (novelty(head, v) for v in (sts_x, wiki_x, fit_x))
        wiki_head = fit_head(embed(rest, pooling))  # and the other way round
        rows.append(_row({
            "part": "density", "pooling": pooling,
            "auroc_nll": auroc(near, far),
            "auroc_typicality": auroc(typicality(near, seen_nll), typicality(far, seen_nll)),
            "auroc_nll_reverse": auroc(novelty(wiki_head, wiki_x), novelty(wiki_head, sts_x)),
            "length_spearman": float(spearmanr(words, np.concatenate([near, far]))[0]),
            "in_domain": len(near), "out_of_domain": len(far),
            "median_nll_train": float(np.median(seen_nll)),
            "median_nll_in": float(np.median(near)),
            "median_nll_out": float(np.median(far))}))
    return rows


def _row(row: dict) -> dict:
    print(json.dumps(row), flush=True)
    return row


def _methods(pooling: str, target: np.ndarray, generic: np.ndarray):
    """(label, method, what it is fit on): the recipe's flow on its text, the rest on the
    `target` sentences."""
    yield "raw", make_method("raw"), target
    yield "whitening", make_method("whitening"), target
    yield "flow", make_method("flow"), target
    recipe = recommended(pooling, target)  # the rule reads the task's embeddings
    text = {"target": target, "generic": generic}
    yield ("flow (recipe)", make_method("flow", **recipe.fit_options()),
           np.concatenate([text[part] for part in recipe.corpus.split("+")]))


def _markdown(rows: list[dict], encoder: str, minutes: float, missing: list[str]) -> str:
    out = [f"# Retrieval, smaller vectors and density ({encoder})\n",
           f"Made by `python experiments/retrieval.py` in {minutes:.0f} min. "
           f"Absent from the data folder: {', '.join(missing) or 'none'}.\n",
           "\n## Retrieval (flat index, cosine; methods fit on the task's sentences, no scores, "
           "the recipe's flow on its text)\n",
           "| task | pooling | method | recall@1 | recall@10 | MRR | queries | candidates |",
           "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in (r for r in rows if r["part"] == "retrieval"):
        out.append(f"| {r['task']} | {r['pooling']} | {r['method']} | {r['recall@1']:.3f} | "
                   f"{r['recall@10']:.3f} | {r['mrr']:.3f} | {r['queries']} | "
                   f"{r['candidates']} |")
    dims = [r for r in rows if r["part"] == "dims"]
    if dims:
        out += ["\n## Recall@10 against kept dimensions k (STS-B test)\n",
                "| pooling | method | " + " | ".join(f"k={k}" for k in DIMS) + " |",
                "|---|---|" + "---:|" * len(DIMS)]
        for key in dict.fromkeys((r["pooling"], r["method"]) for r in dims):
            cells = {r["dims"]: r for r in dims if (r["pooling"], r["method"]) == key}
            out.append(f"| {key[0]} | {key[1]} | "
                       + " | ".join(f"{cells[k]['recall@10']:.3f}" for k in DIMS) + " |")
    density = [r for r in rows if r["part"] == "density"]
    if density:
        out += ["\n## Out of domain by density\n",
                "A: head fit on the STS-B train+dev sentences; in domain: the unseen STS-B test "
                "sentences; out of domain: as many Wikipedia-sample sentences. B: the reverse "
                "(head fit on the rest of the Wikipedia sample). ρ: Spearman between word count "
                "and −log p under head A.\n",
                "| pooling | A: AUROC of −log p | A: AUROC of typicality | B: AUROC of −log p | "
                "ρ(words, −log p) | median −log p: train / STS-B test / Wikipedia |",
                "|---|---:|---:|---:|---:|---|"]
        for r in density:
            out.append(f"| {r['pooling']} | {r['auroc_nll']:.3f} | {r['auroc_typicality']:.3f} | "
                       f"{r['auroc_nll_reverse']:.3f} | {r['length_spearman']:.2f} | "
                       f"{r['median_nll_train']:.1f} / {r['median_nll_in']:.1f} / "
                       f"{r['median_nll_out']:.1f} |")
    return "\n".join(out) + "\n"


def relevant_pairs(pairs: Pairs, threshold: float = 4.0) -> dict[str, set[str]]:
    """For each sentence of a pair scored ≥ `threshold`, its other partners in such pairs."""
    relevant: dict[str, set[str]] = {}
    for a, b, gold in zip(pairs.first, pairs.second, pairs.gold, strict=True):
        if gold >= threshold and a != b:
            relevant.setdefault(a, set()).add(b)
            relevant.setdefault(b, set()).add(a)
    return relevant


def retrieval_scores(index: Index, vectors: np.ndarray, relevant: dict[str, set[str]],
                     depth: int = 1000) -> dict[str, float | int]:
    """Recall@1, recall@10 and MRR of searching `index` with each query of `relevant` (the rank
    of its first partner); `vectors` embed the index's items."""
    position = {s: i for i, s in enumerate(index.items)}
    queries = [q for q in relevant if q in position]
    x = np.asarray(vectors)[[position[q] for q in queries]]
    _, ids = index.search_embeddings(x, k=depth + 1)
    ranks = []  # of each query's first partner, inf where none is found
    for query, row in zip(queries, ids, strict=True):
        ranked = (index.items[i] for i in row if i >= 0 and index.items[i] != query)
        ranks.append(next((r for r, s in enumerate(ranked, 1) if s in relevant[query]), math.inf))
    n = len(queries)
    return {"recall@1": sum(r == 1 for r in ranks) / n,
            "recall@10": sum(r <= 10 for r in ranks) / n, "mrr": sum(1 / r for r in ranks) / n,
            "queries": n, "candidates": len(index.items)}


if __name__ == "__main__":
    main()
