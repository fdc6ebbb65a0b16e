"""Peak memory and time of `bertflow encode` and `bertflow fit` as the corpus grows.

Corpora of 10k, 100k and 1M sentences are recombined from the Wikipedia sample of the data
folder (each sentence joins the first half of one sample sentence to the second half of another,
seeded), after one sentence longer than the encoder's 128-token window: the widest batch, whose
activations set the encode's peak, is then the same at every size, and the ratio measures what
grows with the corpus, not the length of its longest sentence. Each command runs in a fresh
process whose peak resident set size (file pages it maps included) is read from the kernel when
it exits. Two encoders: a small random BERT built here (all-MiniLM-L6-v2's tokenizer, 2 layers
of width 128), run at `--sizes`, which is what the 1M-versus-10k comparison uses; and a real one
(all-MiniLM-L6-v2, or the folder `--encoder` names) at `--real-sizes`, for real timings. `fit`
trains the default flow (one epoch) from the `.npy` that `encode` wrote. Writes
experiments/results/bench_memory-<device>[-<encoder>].md (the encoder's name where one is given)
and, with --json, the numbers.

    python experiments/bench_memory.py [--data data] [--work DIR] [--json FILE]
        [--encoder DIR] [--sizes 10000 100000 1000000] [--real-sizes 10000 100000]
        [--device cpu] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import parser


def main() -> None:
    options = parser(__doc__, "data", "encoder", "out")
    options.add_argument("--work", type=Path, default=None, help="scratch folder (default: a "
                         "temporary one, removed at the end)")
    options.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    options.add_argument("--real-sizes", type=int, nargs="*", default=[10_000, 100_000])
    options.add_argument("--device", default="cpu")
    options.add_argument("--dtype", default="float32", help="the encoder's precision")
    options.add_argument("--json", type=Path, default=None)
    args = options.parse_args()

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        results = run(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    text = report(results)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    named = f"-{Path(args.encoder).name}" if args.encoder else ""
    (args.out / f"bench_memory-{results['device_type']}{named}.md").write_text(text)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


def run(args: argparse.Namespace, work: Path) -> dict:
    from bertflow.runtime.devices import resolve_device

    device = resolve_device(args.device)
    small = make_small_encoder(work / "small-bert")
    rows: list[dict] = []
    for size in sorted(set(args.sizes) | set(args.real_sizes)):
        corpus = make_corpus(args.data, size, work / f"corpus-{size}.txt")
        encoders = [("small random BERT (2 × 128)", small)] if size in args.sizes else []
        if size in args.real_sizes:
            encoders.append((Path(args.encoder).name if args.encoder else "all-MiniLM-L6-v2",
                             args.encoder))
        for name, folder in encoders:
            tag = "small" if folder == small else "real"
            emb = work / f"{tag}-{size}.npy"
            encoder = ["--encoder", str(folder)] if folder else []
            encode = measure(["encode", str(corpus), "--out", str(emb), "--no-cache",
                              "--device", str(device), "--dtype", args.dtype, *encoder])
            fit = measure(["fit", str(emb), "--out", str(work / f"head-{tag}-{size}"),
                           "--quiet"])
            rows.append({"encoder": name, "sentences": size, "encode": encode, "fit": fit,
                         "dim": json.loads(emb.with_suffix(".meta.json").read_text())["dim"]})
            print(json.dumps(rows[-1]), flush=True)
            emb.unlink()
    ratios = {}
    for name in dict.fromkeys(r["encoder"] for r in rows):
        mine = {r["sentences"]: r for r in rows if r["encoder"] == name}
        lo, hi = min(mine), max(mine)
        if lo < hi:
            ratios[name] = {"sizes": [lo, hi], **{
                command: mine[hi][command]["rss_mb"] / mine[lo][command]["rss_mb"]
                for command in ("encode", "fit")}}
    command = "".join(f" {a}" for a in sys.argv[1:]).replace(str(Path.home()), "~")
    return {"device_type": device.type, "cpu_threads": os.cpu_count(), "rows": rows,
            "command": command, "dtype": args.dtype,
            "rss_ratio": ratios}


def measure(arguments: list[str], launcher: list[str] | None = None) -> dict:
    """Run `python -m bertflow ARGS` in a fresh process (or `python LAUNCHER ARGS`, such as
    torchrun's module ending in ``-m bertflow``): seconds, and the peak RSS in MiB of the
    process or of the largest of the processes it waited for."""
    began = time.perf_counter()
    with tempfile.TemporaryFile() as errors:  # a pipe left unread would fill and stall it
        process = subprocess.Popen([sys.executable, *(launcher or ["-m", "bertflow"]),
                                    *arguments],
                                   stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - began
        if os.waitstatus_to_exitcode(status) != 0:
            errors.seek(0)
            raise SystemExit(f"bertflow {' '.join(arguments)} failed:\n"
                             f"{errors.read().decode()[-2000:]}")
    return {"seconds": seconds, "rss_mb": usage.ru_maxrss / 1024}


def make_corpus(data: Path, size: int, path: Path) -> Path:
    from bertflow.storage.files import read_sentences

    sample = read_sentences(data / "unlabeled" / "wiki-sample.txt")
    halves = [s.split() for s in sample]
    rng = random.Random(size)
    with open(path, "w", encoding="utf-8") as f:
        f.write(" ".join(sorted(sample, key=len)[-8:]) + "\n")  # truncated to the window
        for _ in range(size - 1):
            a, b = rng.choice(halves), rng.choice(halves)
            words = a[: max(1, len(a) // 2)] + b[len(b) // 2 :]
            f.write(" ".join(words) + "\n")
    return path


def make_small_encoder(folder: Path) -> Path:
    """A randomly initialised 2-layer BERT of width 128 with all-MiniLM-L6-v2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from bertflow.encoders.identity import default_encoder_path

    tokenizer = AutoTokenizer.from_pretrained(str(default_encoder_path()))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=128, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=512)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def report(results: dict) -> str:
    lines = [
        f"# Memory and time of encode and fit ({results['device_type']}, "
        f"{results['cpu_threads']} CPU threads, encoder in {results.get('dtype', 'float32')})\n",
        f"Made by `python experiments/bench_memory.py{results['command']}`. Peak RSS of each "
        "command in its own process (file pages it maps included); `fit` trains the default "
        "flow for one epoch from the `.npy` that `encode` wrote. Every corpus opens with one "
        "sentence longer than the 128-token window, so that its widest batch, which sets the "
        "encode's activations, is the same at every size.\n",
        "| encoder | sentences | encode s | encode sentences/s | encode peak RSS MiB | "
        "fit s | fit peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        e, f = r["encode"], r["fit"]
        lines.append(f"| {r['encoder']} ({r['dim']}-d) | {r['sentences']:,} | "
                     f"{e['seconds']:.0f} | {r['sentences'] / e['seconds']:,.0f} | "
                     f"{e['rss_mb']:.0f} | {f['seconds']:.0f} | {f['rss_mb']:.0f} |")
    lines.append("")
    for name, ratio in results["rss_ratio"].items():
        lo, hi = ratio["sizes"]
        lines.append(f"Peak RSS at {hi:,} over {lo:,} sentences ({name}): encode "
                     f"{ratio['encode']:.3f}, fit {ratio['fit']:.3f}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
