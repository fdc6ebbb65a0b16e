"""The GPU figures in one run on one CUDA device: encoding speed on each encoder (float32,
bfloat16 and float16 against sentence-transformers, through bench_encode.py), a 1M-sentence
encode stopped by kill -9 at half way and continued with --resume (against an uninterrupted
encode of the same corpus), and torchrun --nproc_per_node 1 encode and fit (against one
process). Each step writes its rows as it ends, so a run cut short keeps the steps it finished.

The corpora are recombined from the Wikipedia sample as bench_memory.py makes them. The
encodes run the first encoder at --dtype, mean pooling; `fit` trains the default flow on the
CPU (only the encoder runs on the device) from the one-process `.npy`. Writes
experiments/results/<device>/bench_gpu.md (and .json), and bench_encode's reports beside them.

    python experiments/bench_gpu.py [--data data] [--encoder DIR ...]
        [--device cuda] [--dtype bfloat16] [--sentences 1000000] [--torchrun-sentences 100000]
        [--bench-sentences 10000] [--batch-size 128] [--rounds 3]
        [--steps speed resume torchrun] [--work DIR]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_encode import describe
from bench_memory import make_corpus, measure
from common import parser

HERE = Path(__file__).resolve().parent
STEPS = ("speed", "resume", "torchrun")
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
            "-m", "bertflow"]


def main() -> None:
    options = parser(__doc__, "data", "encoders", "out")
    options.add_argument("--device", default="cuda")
    options.add_argument("--dtype", default="bfloat16",
                         help="the encoder's precision in the resumed and torchrun encodes")
    options.add_argument("--sentences", type=int, default=1_000_000,
                         help="sentences of the resumed encode")
    options.add_argument("--torchrun-sentences", type=int, default=100_000)
    options.add_argument("--bench-sentences", type=int, default=10_000,
                         help="sentences of each bench_encode run")
    options.add_argument("--batch-size", type=int, default=128)
    options.add_argument("--rounds", type=int, default=3, help="bench_encode's rounds")
    options.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    options.add_argument("--work", type=Path, default=None,
                         help="scratch folder (default: a temporary one, removed at the end)")
    args = options.parse_args()

    from bertflow.runtime.devices import resolve_device

    device = resolve_device(args.device)
    name = describe(device)
    out = args.out / slug(name)
    out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    command = "".join(f" {a}" for a in sys.argv[1:]).replace(str(Path.home()), "~")
    results = {"device": name, "steps": {}}
    if (out / "bench_gpu.json").exists():  # a run that covered other steps on this device
        results = json.loads((out / "bench_gpu.json").read_text())
    try:
        for step in args.steps:
            began = time.perf_counter()
            results["steps"][step] = {"command": command, "dtype": args.dtype,
                                      "batch_size": args.batch_size,
                                      **globals()[step](args, device, work, out)}
            print(f"{step}: {time.perf_counter() - began:.0f} s", flush=True)
            save(results, out)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(report(results))


def speed(args: argparse.Namespace, device, work: Path, out: Path) -> dict:
    """bench_encode.py (with its per-operator profile) on each encoder."""
    rows = []
    for encoder in args.encoder or [None]:
        named = f"-{encoder_name(encoder)}" if encoder else ""  # as bench_encode names its .md
        found = out / f"bench_encode-{device.type}{named}.json"
        subprocess.run([sys.executable, str(HERE / "bench_encode.py"), "--data", str(args.data),
                        "--device", str(device), "--sentences", str(args.bench_sentences),
                        "--batch-size", str(args.batch_size), "--rounds", str(args.rounds),
                        "--profile", "--out", str(out), "--json", str(found),
                        *(["--encoder", encoder] if encoder else [])], check=True)
        rows.append(json.loads(found.read_text()))
    return {"encoders": rows}


def resume(args: argparse.Namespace, device, work: Path, out: Path) -> dict:
    """An uninterrupted encode, then one killed once half its rows are recorded and continued
    with --resume: seconds of each, and whether the two files are the same bytes."""
    corpus = make_corpus(args.data, args.sentences, work / "corpus-resume.txt")
    whole, stopped = work / "whole.npy", work / "stopped.npy"
    full = measure(encode(args, device, corpus, whole))
    command = [sys.executable, "-m", "bertflow", *encode(args, device, corpus, stopped)]
    began = time.perf_counter()
    done = kill_at(subprocess.Popen(command, stderr=subprocess.DEVNULL),
                   stopped.with_name(f"{stopped.name}.progress-0-of-1.json"), args.sentences // 2)
    before = time.perf_counter() - began
    if stopped.exists():
        raise SystemExit(f"the encode of {args.sentences} sentences ended before it was stopped")
    continued = measure([*encode(args, device, corpus, stopped), "--resume"])
    return {"sentences": args.sentences, "encoder": encoder_name(first(args)), "whole": full,
            "killed_after_s": before, "rows_when_killed": done, "resumed": continued,
            "identical": filecmp.cmp(whole, stopped, shallow=False)}


def torchrun(args: argparse.Namespace, device, work: Path, out: Path) -> dict:
    """encode and fit in one process and under torchrun with one process: seconds, peak RSS,
    and whether the results agree (the files' bytes; the heads' weights)."""
    import numpy as np
    from safetensors.numpy import load_file

    corpus = make_corpus(args.data, args.torchrun_sentences, work / "corpus-torchrun.txt")
    one, under = work / "one.npy", work / "torchrun.npy"
    encoded = {"one": measure(encode(args, device, corpus, one)),
               "torchrun": measure(encode(args, device, corpus, under), TORCHRUN)}
    fitted = {"one": measure(["fit", str(one), "--out", str(work / "head-one"), "--seed", "0",
                              "--quiet"]),
              "torchrun": measure(["fit", str(one), "--out", str(work / "head-torchrun"),
                                   "--seed", "0", "--quiet"], TORCHRUN)}
    a, b = (load_file(work / f"head-{k}" / "model.safetensors") for k in ("one", "torchrun"))
    return {"sentences": args.torchrun_sentences, "encoder": encoder_name(first(args)),
            "encode": encoded, "fit": fitted,
            "encode_identical": filecmp.cmp(one, under, shallow=False),
            "fit_max_abs_diff": max(float(np.abs(a[k].astype(np.float64) - b[k]).max())
                                    for k in a)}


def encode(args: argparse.Namespace, device, corpus: Path, path: Path) -> list[str]:
    encoder = first(args)
    return ["encode", str(corpus), "--out", str(path), "--no-cache", "--quiet",
            "--pooling", "mean", "--device", str(device), "--dtype", args.dtype,
            "--encode-batch-size", str(args.batch_size),
            *(["--encoder", encoder] if encoder else [])]


def kill_at(process: subprocess.Popen, record: Path, rows: int) -> int:
    """Kill `process` (-9) once its progress `record` says `rows` are done: the rows done."""
    done = 0
    while process.poll() is None:
        try:
            done = json.loads(record.read_text())["done"]
        except (OSError, ValueError, KeyError):
            done = 0
        if done >= rows:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    process.wait()
    return done


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def first(args: argparse.Namespace) -> str | None:
    """The encoder of the resumed and torchrun encodes (None: the default)."""
    return args.encoder[0] if args.encoder else None


def encoder_name(encoder: str | None) -> str:
    from bertflow.encoders.identity import locate

    return locate(encoder)[1]


def save(results: dict, out: Path) -> None:
    (out / "bench_gpu.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "bench_gpu.md").write_text(report(results))


def report(results: dict) -> str:
    steps = results["steps"]
    lines = [f"# bertflow on {results['device']}\n"]

    def made(step: str) -> str:
        return (f"Made by `python experiments/bench_gpu.py{steps[step]['command']}`: batch "
                f"size {steps[step]['batch_size']}, mean pooling")

    if "speed" in steps:
        lines += ["## Encoding speed (bench_encode.py)\n", f"{made('speed')}.\n",
                  "| encoder | sentences/s sentence-transformers float32 | × float32 | "
                  "× bfloat16 | × float16 | float32 agreement | bfloat16 min cosine | "
                  "float32 peak fraction | outside matmuls, bfloat16 |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in steps["speed"]["encoders"]:
            cell = {k: (f"{r[k]:.2f}" if k in r else "") for k in
                    ("ratio_fp32", "ratio_bf16", "ratio_fp16", "peak_fraction_fp32")}
            outside = r["profile"].get("bfloat16", {}).get("outside_matmul")
            lines.append(
                f"| {r['encoder']} | {r['sentences_per_s']['sentence-transformers float32']:,.0f}"
                f" | {cell['ratio_fp32']} | {cell['ratio_bf16']} | {cell['ratio_fp16']} | "
                f"{r['max_abs_diff_fp32']:.1e} | {r.get('min_cos_bf16', float('nan')):.6f} | "
                f"{cell['peak_fraction_fp32']} | "
                f"{'' if outside is None else f'{outside:.0%}'} |")
        lines.append("\nEach encoder's whole report, with its per-operator profile: "
                     "bench_encode-*.md beside this file.\n")
    if "resume" in steps:
        r = steps["resume"]
        lines += ["## A stopped encode, continued\n",
                  f"{made('resume')}, {r['dtype']}. {r['sentences']:,} sentences through "
                  f"{r['encoder']}: uninterrupted "
                  f"{r['whole']['seconds']:.0f} s ({r['sentences'] / r['whole']['seconds']:,.0f}"
                  f" sentences/s, peak RSS {r['whole']['rss_mb']:,.0f} MiB); killed (-9) after "
                  f"{r['killed_after_s']:.0f} s with {r['rows_when_killed']:,} rows recorded, "
                  f"then `--resume` took {r['resumed']['seconds']:.0f} s. The resumed file is "
                  f"{'byte for byte' if r['identical'] else 'NOT'} the uninterrupted one.\n"]
    if "torchrun" in steps:
        r = steps["torchrun"]
        lines += ["## torchrun --nproc_per_node 1\n",
                  f"{made('torchrun')}, {r['dtype']}; {r['sentences']:,} sentences through "
                  f"{r['encoder']}. `fit` trains the default flow on the CPU.\n",
                  "| command | one process s | torchrun s | one process peak RSS MiB | "
                  "torchrun peak RSS MiB | agreement |", "|---|---:|---:|---:|---:|---|"]
        agreement = {"encode": "same bytes" if r["encode_identical"] else "DIFFERENT bytes",
                     "fit": f"weights within {r['fit_max_abs_diff']:.1e}"}
        for command in ("encode", "fit"):
            one, under = r[command]["one"], r[command]["torchrun"]
            lines.append(f"| {command} | {one['seconds']:.1f} | {under['seconds']:.1f} | "
                         f"{one['rss_mb']:,.0f} | {under['rss_mb']:,.0f} | "
                         f"{agreement[command]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
