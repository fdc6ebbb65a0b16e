"""How fast each exported form of a head transforms embeddings, side by side.

Times `Head.transform` (the package), the ONNX file under onnxruntime and the torch.export
program on the same random batch of pooled-embedding-sized rows, alternating the three in each
round, and reports the median time per 10,000 rows and the ratio to the package.
Writes experiments/results/bench_head.md.

    python experiments/bench_head.py [--head DIR] [--rows N] [--rounds N]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime
import torch
from common import REPO, parser

from bertflow import Head
from bertflow.export.graphs import export_onnx, export_program


def main() -> None:
    options = parser(__doc__, "out")
    options.add_argument("--head", type=Path,
                         default=REPO / "checkpoints" / "minilm-first_last-wiki")
    options.add_argument("--rows", type=int, default=10_000)
    options.add_argument("--rounds", type=int, default=7)
    args = options.parse_args()

    head = Head.load(args.head)
    x = np.random.default_rng(0).normal(size=(args.rows, head.dim)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        session = onnxruntime.InferenceSession(str(export_onnx(head, Path(tmp) / "h.onnx")),
                                               providers=["CPUExecutionProvider"])
        program = torch.export.load(str(export_program(head, Path(tmp) / "h.pt2"))).module()

    def run_program(a: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return program(torch.from_numpy(a)).numpy()

    runners = {
        "Head.transform (torch)": head.transform,
        "ONNX (onnxruntime)": lambda a: session.run(["z"], {"embeddings": a})[0],
        "torch.export program": run_program,
    }
    reference = head.transform(x)
    for name, run in runners.items():  # warm up, and check they agree
        assert np.abs(run(x) - reference).max() <= 1e-4, name
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            began = time.perf_counter()
            run(x)
            times[name].append(time.perf_counter() - began)

    base = statistics.median(times["Head.transform (torch)"])
    lines = [f"# Head transform speed ({head.dim}-d, {args.rows} rows, median of {args.rounds} "
             f"rounds, {torch.get_num_threads()} threads)\n",
             "Made by `python experiments/bench_head.py`; ratios are to the package run side by "
             "side in the same rounds.\n",
             "| form | ms per 10,000 rows | time relative to the package |", "|---|---:|---:|"]
    for name, values in times.items():
        median = statistics.median(values)
        lines.append(f"| {name} | {median * 1e3 * 10_000 / args.rows:.1f} | {median / base:.2f} |")
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_head.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
