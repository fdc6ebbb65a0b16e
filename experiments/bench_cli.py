"""How much CPU the light commands of `bertflow` take to start, beside `import torch`.

Runs `bertflow --help`, `bertflow recipes`, `bertflow info` of the shipped head and `bertflow
info` of a file of transformed vectors, each in a fresh interpreter, alternating with
`python -c "import torch"` in each round, and reports each one's median CPU time (user and
system, of the process and its children) and its ratio to importing torch.
Writes experiments/results/bench_cli.md and .json.

    python experiments/bench_cli.py [--rounds N]
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from common import REPO, command_line, parser

from bertflow.embeddings.outputs import write_transformed
from bertflow.storage.files import read_json

HEAD = REPO / "checkpoints" / "minilm-first_last-wiki"
REFERENCE = 'python -c "import torch"'


def cpu_seconds(argv: list[str]) -> float:
    """The CPU time (user and system) of running `argv` to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    options = parser(__doc__, "out")
    options.add_argument("--rounds", type=int, default=7)
    args = options.parse_args()

    bertflow = [sys.executable, "-m", "bertflow"]
    with tempfile.TemporaryDirectory() as tmp:
        vectors = Path(tmp) / "z.npy"
        write_transformed(vectors, np.zeros((1000, 384), np.float32),
                          read_json(HEAD / "config.json"), {"file": "sentences.txt"})
        commands = {
            REFERENCE: [sys.executable, "-c", "import torch"],
            "bertflow --help": [*bertflow, "--help"],
            "bertflow recipes": [*bertflow, "recipes"],
            f"bertflow info {HEAD.relative_to(REPO)}": [*bertflow, "info", str(HEAD)],
            "bertflow info z.npy (transformed vectors)": [*bertflow, "info", str(vectors)],
        }
        for argv in commands.values():  # warm the file cache
            cpu_seconds(argv)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.rounds):
            for name, argv in commands.items():
                times[name].append(cpu_seconds(argv))

    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians[REFERENCE]
    lines = [f"# Command-line start: CPU time beside `import torch` ({platform.machine()}, "
             f"{os.cpu_count()} CPUs, median of {args.rounds} rounds)\n",
             f"Made by `{command_line('bench_cli.py')}`; each command in a fresh interpreter, "
             "alternating in each round; CPU time is user and system.\n",
             "| command | CPU s | relative to `import torch` |", "|---|---:|---:|"]
    for name, median in medians.items():
        lines.append(f"| `{name}` | {median:.2f} | {median / base:.2f} |")
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_cli.md").write_text(text)
    (args.out / "bench_cli.json").write_text(json.dumps(
        {"rounds": args.rounds, "cpu_seconds": times, "median": medians}, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
