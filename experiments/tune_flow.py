"""Pick a flow configuration per pooling on STS-B dev, never on test scores.

For each pooling of an encoder, fits flows of a small grid (learning rate, epochs, coupling,
mixing) on the STS-B sentences without their scores (the "target" setting) and scores STS-B
dev. Writes experiments/results/tune_flow.{json,md}; `sts_table.py` reads the winners.
Every fit is appended to `CACHE/tune_flow.rows.jsonl` as it finishes, and a rerun skips the
fits already there (fits are seeded, so a stored row is what a new fit would give).

    python experiments/tune_flow.py [--data DIR] [--encoder DIR]
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import numpy as np
from common import parser

from bertflow import POOLINGS, FlowConfig, FlowHead, TrainConfig, load_encoder, sts
from bertflow.cache import EmbeddingCache
from bertflow.files import write_json

GRID = {
    "lr": (1e-3, 3e-4, 1e-4),
    "epochs": (1, 3),
    "coupling": ("additive", "affine"),
    "linear": ("reverse", "lu"),
}


def main() -> None:
    args = parser(__doc__, "data", "encoder", "cache", "out").parse_args()
    began = time.perf_counter()

    encoder = load_encoder(args.encoder)
    splits = sts.read_stsb_splits(args.data / "STSBenchmark")
    sentences = sts.sentences_of(splits.values())
    x = EmbeddingCache(args.cache).encode(sentences, encoder, list(POOLINGS))

    log = args.cache / "tune_flow.rows.jsonl"
    done = {_key(r): r for r in _read_rows(log)}
    reused = 0
    rows = []
    for pooling in POOLINGS:
        raw = sts.pair_spearman(splits["dev"], sentences, np.asarray(x[pooling]))
        for lr, epochs, coupling, linear in itertools.product(*GRID.values()):
            flow = FlowConfig(coupling=coupling, linear=linear)
            train = TrainConfig(lr=lr, epochs=epochs, patience=0)
            row = {"encoder": encoder.id.name, "fingerprint": encoder.id.fingerprint,
                   "pooling": pooling, "raw_dev": raw, "flow": flow.to_dict(),
                   "train": train.to_dict()}
            if _key(row) in done:
                rows.append(done[_key(row)])
                reused += 1
                continue
            head = FlowHead.fit(x[pooling], flow=flow, train=train)
            row["stsb_dev"] = sts.pair_spearman(splits["dev"], sentences,
                                                head.transform(x[pooling]))
            rows.append(row)
            with log.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)

    best = {}
    lines = ["| pooling | raw | best flow on STS-B dev | its configuration |",
             "|---|---:|---:|---|"]
    for pooling in POOLINGS:
        mine = [r for r in rows if r["pooling"] == pooling]
        top = max(mine, key=lambda r: r["stsb_dev"])
        best[pooling] = {"flow": top["flow"], "train": top["train"], "stsb_dev": top["stsb_dev"]}
        t, f = top["train"], top["flow"]
        lines.append(f"| {pooling} | {top['raw_dev']:.2f} | {top['stsb_dev']:.2f} | "
                     f"lr {t['lr']:g}, {t['epochs']} epoch(s), {f['coupling']} coupling, "
                     f"{f['linear']} mixing |")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "tune_flow.json", {"best": best, "rows": rows})
    note = (f"\nSTS-B dev Spearman × 100, {encoder.id.name}, flows fit on the STS-B sentences "
            f"without scores; {len(rows)} fits ({reused} reused from an earlier run), "
            f"{time.perf_counter() - began:.0f} s.\n")
    (args.out / "tune_flow.md").write_text("\n".join(lines) + "\n" + note)
    print("\n".join(lines) + note)


def _key(row: dict) -> str:
    return json.dumps([row["fingerprint"], row["pooling"], row["flow"], row["train"]],
                      sort_keys=True)


def _read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    main()
