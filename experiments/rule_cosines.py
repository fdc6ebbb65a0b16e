"""The statistic of `bertflow.training.recipes`' rule on the texts the recipes were chosen on: each
encoder's and pooling's mean pair cosine over all pairs (`mean_cosine`, what the rule reads),
beside the mean of 10,000 random pairs (`mean_pair_cosine`, what it read before) and that
estimate's range over 20 row orders of the same rows, with the recipe each would choose.

The default encoder first, then each --encoder. Writes experiments/results/rule_cosines.{json,md}.

    python experiments/rule_cosines.py [--data DIR] [--encoder DIR ...]
"""

from __future__ import annotations

import numpy as np
from common import parser
from recipe import read_data

from bertflow import POOLINGS, load_encoder
from bertflow.embeddings.isotropy import mean_cosine, mean_pair_cosine
from bertflow.storage.files import write_json
from bertflow.training.recipes import ISOTROPIC, ISOTROPIC_RECIPES

TEXTS = ("stsb", "sick", "wiki", "snli")
ORDERS = 20  # row orders the sampled estimate is read in


def rows_of(data, encoder_name: str) -> list[dict]:
    rows = []
    for pooling in POOLINGS:
        for text in TEXTS:
            x = data.embed(text, pooling)
            sampled = [mean_pair_cosine(x[np.random.default_rng(seed).permutation(len(x))])
                       for seed in range(ORDERS)]
            rows.append({"encoder": encoder_name, "pooling": pooling, "text": text,
                         "rows": len(x), "exact": mean_cosine(x),
                         "sampled": mean_pair_cosine(x), "sampled_min": min(sampled),
                         "sampled_max": max(sampled)})
    return rows


def table(rows: list[dict]) -> str:
    def side(value: float, pooling: str) -> str:
        if pooling not in ISOTROPIC_RECIPES:
            return "-"
        return "isotropic" if value < ISOTROPIC else "anisotropic"

    lines = [f"| encoder | pooling | text | rows | all pairs (the rule) | 10,000 random pairs | "
             f"over {ORDERS} row orders | recipe by all pairs | by random pairs |",
             "|---|---|---|---:|---:|---:|---|---|---|"]
    for r in rows:
        by_sample = sorted({side(r["sampled_min"], r["pooling"]),
                            side(r["sampled_max"], r["pooling"])})
        lines.append(f"| {r['encoder']} | {r['pooling']} | {r['text']} | {r['rows']} | "
                     f"{r['exact']:.4f} | {r['sampled']:.4f} | {r['sampled_min']:.4f} to "
                     f"{r['sampled_max']:.4f} | {side(r['exact'], r['pooling'])} | "
                     f"{' or '.join(by_sample)} |")
    return "\n".join(lines)


def main() -> None:
    options = parser(__doc__, "data", "cache", "out", "generic", "encoders")
    args = options.parse_args()
    rows = []
    for folder in [None, *(args.encoder or [])]:
        encoder = load_encoder(folder)
        rows += rows_of(read_data(args, encoder), encoder.id.name)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "rule_cosines.json", {"threshold": ISOTROPIC, "rows": rows})
    command = "python experiments/rule_cosines.py" + " --encoder DIR" * len(args.encoder or [])
    text = (f"# The rule's statistic: mean pair cosine of the raw embeddings\n\n`{command}` "
            f"(DIR: all-mpnet-base-v2, `make mpnet`). `bertflow.training.recipes` takes the "
            f"recipe for isotropic embeddings where the mean pair cosine is under {ISOTROPIC} "
            f"(CLS only has one). The rule reads the mean over all pairs; the mean of 10,000 "
            f"random pairs by row position, which it read before, moves with the order of the "
            f"rows (range over {ORDERS} orders).\n\n{table(rows)}\n")
    (args.out / "rule_cosines.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
