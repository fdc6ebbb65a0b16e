"""What int8 costs: the whole pipeline as one ONNX graph (mean pooling, an identity head) with
its weights quantised to int8 by onnxruntime's dynamic quantisation, per channel, against the
same graph in float32, on STS-B test (Spearman × 100 of cosine with the gold scores) and BEIR
SciFact test (nDCG@10 × 100, exact cosine over every document, as MTEB scores it), each
encoder at its sentence-transformers max length. `bench_encode.py --onnx` times the two graphs;
this measures their quality. Writes experiments/results/onnx/quality-<encoders>.md and .json.

    python experiments/onnx_quality.py [--encoder DIR --max-length N]... [--data data]
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from common import (
    DATA,
    RESULTS,
    beir_parser,
    command_line,
    onnx_embed,
    onnx_graphs,
    onnx_session,
)
from scipy.stats import spearmanr

from bertflow import default_encoder_path, load_encoder
from bertflow.data.beir import load_task
from bertflow.data.sts import read_stsb
from bertflow.evaluation.retrieval import ranking, score_run


def main() -> None:
    options = beir_parser(__doc__)
    options.add_argument("--data", type=Path, default=DATA)
    options.set_defaults(out=RESULTS / "onnx")
    args = options.parse_args()
    folders = args.encoder or [str(default_encoder_path())]
    lengths = args.max_length or [256] * len(folders)
    stsb = read_stsb(args.data / "STSBenchmark", "test")
    task = load_task(args.beir, args.split)
    documents, queries = list(task.corpus), list(task.queries.values())
    rows = []
    for folder, max_length in zip(folders, lengths, strict=True):
        encoder = load_encoder(folder, "cpu")
        with tempfile.TemporaryDirectory() as work:
            tokenizer, models = onnx_graphs(encoder, max_length, Path(work))
            for precision, model in models.items():
                session = onnx_session(model, torch.get_num_threads())

                def embed(sentences: list[str], s: object = session,
                          t: object = tokenizer) -> np.ndarray:
                    x = onnx_embed(s, t, sentences, 32)
                    return x / np.linalg.norm(x, axis=1, keepdims=True)

                a, b = embed(stsb.first), embed(stsb.second)
                spearman = 100 * spearmanr((a * b).sum(1), stsb.gold).statistic
                run = ranking(embed(queries), embed(documents), list(task.queries),
                              task.corpus.ids)
                ndcg = 100 * score_run(task.qrels, run)["ndcg_at_10"]
                rows.append({"encoder": encoder.id.name, "max_length": max_length,
                             "precision": precision, "stsb_test_spearman": spearman,
                             f"{task.name}_ndcg_at_10": ndcg})
                print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "quality-" + "-".join(dict.fromkeys(r["encoder"] for r in rows))
    (args.out / f"{name}.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.out / f"{name}.md").write_text(report(rows, task.name, command_line("onnx_quality.py")))


def report(rows: list[dict], task: str, command: str) -> str:
    lines = ["# int8 against float32: the pipeline as one ONNX graph\n",
             f"Made by `{command}`: mean pooling, an identity "
             "head, onnxruntime on the CPU; int8 is onnxruntime's dynamic quantisation of the "
             "float32 graph's weights, per channel.\n",
             f"| encoder | precision | STS-B test Spearman × 100 | change | {task} nDCG@10 × 100 "
             "| change |", "|---|---|---:|---:|---:|---:|"]
    base: dict[str, dict] = {}
    for r in rows:
        first = base.setdefault(r["encoder"], r)
        sts, ndcg = r["stsb_test_spearman"], r[f"{task}_ndcg_at_10"]
        lines.append(
            f"| {r['encoder']} ({r['max_length']} tokens) | {r['precision']} | {sts:.2f} | "
            f"{sts - first['stsb_test_spearman']:+.2f} | {ndcg:.2f} | "
            f"{ndcg - first[f'{task}_ndcg_at_10']:+.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
