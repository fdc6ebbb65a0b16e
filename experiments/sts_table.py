"""Rebuild the whole STS results table: encoders × poolings × methods × fit data.

Every method runs in the one harness (`bertflow.evaluation.sts`) on embeddings from the one cache:
raw pooling, standardisation, BERT-whitening (full and top-k, k = dim/3 as in Su et al.),
all-but-the-top (d = dim/100, as in Mu & Viswanath), the flow with the release's
defaults, and the flow by the pooling's recipe (`bertflow.training.recipes`, chosen by `recipe.py`).
Methods are fit on each task's own sentences without scores ("target"), on a generic text
file (default: the Wikipedia sample), and on both together (each task's own sentences and the
file's). Writes experiments/results/sts_table.{json,md}.

    python experiments/sts_table.py [--data DIR] [--encoder DIR ...] [--generic FILE]
"""

from __future__ import annotations

import time

from common import parser

from bertflow import POOLINGS, load_encoder
from bertflow.data.sts import load_tasks
from bertflow.embeddings.cache import EmbeddingCache
from bertflow.evaluation.methods import flow_by_recipe, make_method
from bertflow.evaluation.sts import evaluate, fit_sources, format_table
from bertflow.heads.linear import default_d, default_k
from bertflow.storage.files import read_sentences, write_json


def main() -> None:
    args = parser(__doc__, "data", "encoders", "generic", "cache", "out").parse_args()
    began = time.perf_counter()

    tasks, missing = load_tasks(args.data)
    generic = read_sentences(args.generic)
    cache = EmbeddingCache(args.cache)
    sources = [fit_sources(s) for s in ("target", args.generic, ["target", args.generic])]
    rows = []
    for source in args.encoder or [None]:
        encoder = load_encoder(source)
        corpora = [generic, *(s for t in tasks.values() for s in (t.unlabeled, t.sentences()))]
        for sentences in corpora:  # one forward pass per corpus for all poolings
            cache.encode(sentences, encoder, list(POOLINGS))
        for pooling in POOLINGS:
            width = encoder.width(pooling)  # static: the word embeddings' width
            k, d = default_k(width), default_d(width)
            embed = cache.embedder(encoder, pooling)
            methods = [("raw", {}), ("standardize", {}), ("whitening", {}),
                       ("whitening-k", {"k": k}), ("abtt", {"d": d}), ("flow", {})]
            methods.append(("recipe", {}))
            for method, options in methods:
                for fit_on, also, label in sources:
                    if method == "raw" and label != args.generic.name:
                        continue  # nothing to fit: once is enough
                    make, describe = _factory(method, options, k, d, pooling)
                    labels = {"encoder": encoder.id.name, "pooling": pooling,
                              "method": describe, "fit_on": "-" if method == "raw" else label}
                    started = time.perf_counter()
                    new = evaluate(tasks, missing, embed, make, fit_on, labels, also)
                    rows += new
                    avg = next(r for r in new if r["task"] == "avg" and r["aggregation"] == "all")
                    print(f"{pooling:10} {describe:24} {labels['fit_on']:16} "
                          f"avg {avg['spearman']:.2f}  {time.perf_counter() - started:.0f} s",
                          flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "sts_table.json", rows)
    minutes = (time.perf_counter() - began) / 60
    text = ["# STS results (Spearman × 100 of cosine)\n",
            f"Made by `python experiments/sts_table.py` in {minutes:.0f} min. Tasks absent from "
            f"the data folder: {', '.join(missing) or 'none'}; `avg` is over the tasks present.\n"]
    if len(args.encoder or []) > 1:
        text += ["\n## A column per encoder (aggregation `all`)\n", _per_encoder(rows), ""]
    for aggregation in ("all", "wmean"):
        text += [f"\n## Aggregation `{aggregation}`\n", format_table(rows, aggregation), ""]
    text += ["\n## Isotropy, alignment and uniformity of the scored embeddings "
             "(7-task average)\n", _isotropy(rows)]
    (args.out / "sts_table.md").write_text("\n".join(text) + "\n")
    print(f"{len(rows)} rows in {minutes:.1f} min")


def _factory(method: str, options: dict, k: int, d: int, pooling: str):
    if method == "recipe":  # the flow by the pooling's recipe (the rule reads each fit's text)
        return (lambda: flow_by_recipe(pooling)), "flow (recipe)"
    name = {"whitening-k": f"whitening-{k}", "abtt": f"abtt-{d}"}.get(method, method)
    return (lambda: make_method(method, **options)), name


def _per_encoder(rows: list[dict], tasks: tuple[str, ...] = ("STS-B", "SICK-R", "avg")) -> str:
    """The paper's layout: a row per pooling, method and fit text, `tasks` per encoder."""
    encoders = list(dict.fromkeys(r["encoder"] for r in rows))
    cells: dict[tuple, dict[str, str]] = {}
    for r in rows:
        if r["aggregation"] == "all" and r["task"] in tasks and r["spearman"] is not None:
            key = (r["pooling"], r["method"], r["fit_on"])
            cells.setdefault(key, {})[f"{r['encoder']} {r['task']}"] = f"{r['spearman']:.2f}"
    columns = [f"{e} {t}" for e in encoders for t in tasks]
    lines = ["| pooling | method | fit on | " + " | ".join(columns) + " |",
             "|---|---|---|" + "---:|" * len(columns)]
    lines += [f"| {' | '.join(key)} | " + " | ".join(got.get(c, "") for c in columns) + " |"
              for key, got in cells.items()]
    return "\n".join(lines)


def _isotropy(rows: list[dict]) -> str:
    lines = ["| encoder | pooling | method | fit on | mean cosine | effective rank | "
             "condition number | I(W) | alignment | uniformity |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["task"] == "avg" and r["aggregation"] == "all":
            cells = [_number(r.get(k), f, "inf" if k == "condition_number" else "n/a")
                     for k, f in (("mean_cosine", ".3f"), ("effective_rank", ".1f"),
                                  ("condition_number", ".3g"), ("isotropy", ".3f"),
                                  ("alignment", ".3f"), ("uniformity", ".3f"))]
            lines.append(f"| {r['encoder']} | {r['pooling']} | {r['method']} | {r['fit_on']} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def _number(value: float | None, spec: str, none: str = "inf") -> str:
    """A measure, or `none` for None: an infinite condition number, an undefined measure."""
    return none if value is None else format(value, spec)


if __name__ == "__main__":
    main()
