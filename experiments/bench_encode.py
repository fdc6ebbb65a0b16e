"""Encoding speed: bertflow in float32, bfloat16 and int8 (float16 on a GPU) against
`SentenceTransformer.encode` in float32, on the same model folder and the same sentences.

One process, interleaved rounds (each runner once per round, best round kept), mean pooling,
the same batch size and maximum length for every runner. Reports sentences/s, each bertflow
runner's throughput over sentence-transformers', how far its unit vectors are from
sentence-transformers' (float32) or from bertflow's float32 ones (lower precisions), and the
fraction of a matmul peak the encoder reaches: transformer FLOPs counted from the real
(unpadded) token counts, over the GFLOP/s of a large square matmul timed in the same run at
the same dtype. With --profile, the report also says where bertflow's encode spends its time,
per operator, and what share of it is outside the matrix products. With --onnx (a CPU), it also
times the whole pipeline as one ONNX graph (`bertflow export --format onnx-pipeline` of an
identity head) run by onnxruntime and tokenized by `tokenizers`, in float32 and with its
weights dynamically quantised to int8, per channel (onnxruntime.quantization). Writes
experiments/results/bench_encode-<device>[-<encoder>].md (the encoder's name where one is
given) and, with --json, the numbers. With --retrieval FILE (`onnx_quality.py`'s JSON for
the encoder, whose float32 row is the reference), every runner whose min cosine is below
0.9999, bertflow's and the peers', also embeds BEIR SciFact test's queries and documents, and
the report gives its nDCG@10 and STS-B test Spearman and their change from float32's (quality
is measured, not assumed). With --peers PYTHON (`make peers`: .venv-peers/bin/python),
`bench_peers.py` times sentence-transformers' torch, ONNX and OpenVINO backends and bertflow's
paths side by side in that interpreter's one process, and the report says how bertflow's fastest
path at each agreement compares with the fastest peer there.

    python experiments/bench_encode.py [--data data] [--encoder DIR]
        [--sentences 2000] [--rounds 5] [--device auto] [--batch-size 32] [--json FILE]
        [--profile] [--compile] [--onnx] [--peers PYTHON] [--retrieval FILE]
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import onnx_embed, onnx_graphs, onnx_session, parser
from sentence_transformers import SentenceTransformer

from bertflow import load_encoder
from bertflow.encoders.encoder import Encoder
from bertflow.encoders.identity import default_encoder_path
from bertflow.runtime.devices import resolve_device
from bertflow.storage.files import read_sentences

# each dtype's short name in the JSON's keys
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int8": "int8"}


def main() -> None:
    options = parser(__doc__, "data", "encoder", "out")
    options.add_argument("--sentences", type=int, default=2000)
    options.add_argument("--rounds", type=int, default=5)
    options.add_argument("--device", default="auto")
    options.add_argument("--batch-size", type=int, default=32)
    options.add_argument("--json", type=Path, default=None)
    options.add_argument("--profile", action="store_true",
                         help="report where bertflow's encode spends its time, per operator")
    options.add_argument("--compile", action="store_true",
                         help="also time bertflow's fused forward compiled by torch.compile "
                              "(inductor; needs a C++ compiler on the CPU)")
    options.add_argument("--onnx", action="store_true",
                         help="also time the pipeline as one ONNX graph with onnxruntime, "
                              "float32 and int8")
    options.add_argument("--peers", type=Path, default=None, metavar="PYTHON",
                         help="also time sentence-transformers' torch, ONNX and OpenVINO "
                              "backends (float32, int8) and, on the CPU, bertflow's paths side "
                              "by side with them, with this interpreter (make peers: "
                              ".venv-peers/bin/python), in its own process after the rounds "
                              "here, on the same sentences, and their STS-B test Spearman")
    options.add_argument("--retrieval", type=Path, default=None, metavar="QUALITY_JSON",
                         help="STS-B and SciFact test quality of every runner below min cosine "
                              "--floor, against the float32 row of this onnx_quality.py JSON")
    options.add_argument("--floor", type=float, default=0.9999,
                         help="the min cosine below which --retrieval measures quality")
    args = options.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-encode-") as scratch:  # graphs, exports
        results, dtypes, device = measure(args, Path(scratch))

    text = report(results, dtypes)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    named = f"-{results['encoder']}" if args.encoder else ""
    (args.out / f"bench_encode-{device.type}{named}.md").write_text(text)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


def measure(args: Any, scratch: Path) -> tuple[dict, list[str], torch.device]:
    """Every runner timed and compared (`scratch`: a folder for the graphs and the peers'
    exports): the results, bertflow's dtypes, the device."""
    device = resolve_device(args.device)
    sentences = read_sentences(args.data / "unlabeled" / "wiki-sample.txt")[: args.sentences]
    dtypes = ["float32", "bfloat16"] + (["float16"] if device.type == "cuda" else ["int8"])
    encoders = {dtype: load_encoder(args.encoder, device, dtype) for dtype in dtypes}
    st = SentenceTransformer(str(args.encoder or default_encoder_path()), device=str(device))
    max_length = st.max_seq_length
    tokens = [len(ids) for ids in encoders["float32"].tokenize(sentences, max_length)["input_ids"]]
    flops = encoder_flops(encoders["float32"], tokens)
    name = encoders["float32"].id.name
    task = Quality(args.data, args.retrieval, name) if args.retrieval else None

    runners: dict[str, Callable[[], np.ndarray]] = {
        "sentence-transformers float32": lambda: st.encode(
            sentences, batch_size=args.batch_size, convert_to_numpy=True),
    }
    for dtype, encoder in encoders.items():
        runners[f"bertflow {dtype}"] = lambda e=encoder: e.encode(
            sentences, "mean", max_length, args.batch_size, progress=False)
    if args.compile:  # int8's layers are compiled already
        for dtype in (d for d in dtypes if d != "int8"):
            runners[f"bertflow {dtype} compiled"] = compiled(
                load_encoder(args.encoder, device, dtype), sentences, max_length, args.batch_size)
    if args.onnx:
        runners.update(onnx_runners(encoders["float32"], sentences, max_length, args.batch_size,
                                    scratch))
    profiles = {dtype: profile(runners[f"bertflow {dtype}"], device)
                for dtype in dtypes} if args.profile else {}
    outputs = {name: unit(run()) for name, run in runners.items()}  # warm-up
    seconds = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            began = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - began)
    best = {name: min(values) for name, values in seconds.items()}
    peaks = {dtype: matmul_peak(device, getattr(torch, dtype)) for dtype in dtypes}

    base = best["sentence-transformers float32"]
    exact = outputs["bertflow float32"]
    results: dict[str, object] = {
        "encoder": encoders["float32"].id.name,
        "command": "".join(f" {a}" for a in sys.argv[1:]).replace(str(Path.home()), "~"),
        "device": describe(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "sentences": len(sentences),
        "tokens": int(sum(tokens)),
        "tokens_per_sentence": [int(min(tokens)), float(np.mean(tokens)), int(max(tokens))],
        "batch_size": args.batch_size,
        "padding_share": padding_share(tokens, args.batch_size),
        "max_length": max_length,
        "rounds": args.rounds,
        "sentences_per_s": {name: len(sentences) / t for name, t in best.items()},
        "max_abs_diff_fp32": float(np.abs(exact - outputs["sentence-transformers float32"]).max()),
    }
    for dtype in dtypes:
        achieved = flops / best[f"bertflow {dtype}"] / 1e9
        results[f"ratio_{SHORT[dtype]}"] = base / best[f"bertflow {dtype}"]
        results[f"gflops_{SHORT[dtype]}"] = achieved
        results[f"peak_gflops_{SHORT[dtype]}"] = peaks[dtype]
        results[f"peak_fraction_{SHORT[dtype]}"] = achieved / peaks[dtype]
        results[f"fp32_peak_fraction_{SHORT[dtype]}"] = achieved / peaks["float32"]
        if f"bertflow {dtype} compiled" in best:
            results[f"ratio_{SHORT[dtype]}_compiled"] = base / best[f"bertflow {dtype} compiled"]
            results[f"gflops_{SHORT[dtype]}_compiled"] = (
                flops / best[f"bertflow {dtype} compiled"] / 1e9)
        if dtype != "float32":
            cos = (outputs[f"bertflow {dtype}"] * exact).sum(1)
            results[f"min_cos_{SHORT[dtype]}"] = float(cos.min())
            if task is not None and cos.min() < args.floor:
                results.setdefault("quality", {})[f"bertflow {dtype}"] = task.of(
                    lambda texts, e=encoders[dtype]: e.encode(
                        texts, "mean", max_length, args.batch_size, progress=False))
    results["onnx"] = {name: {"ratio": base / best[name],
                              "min_cos_fp32": float((outputs[name] * exact).sum(1).min())}
                       for name in runners if "onnx" in name}
    results["peak_fraction"] = min(results[f"peak_fraction_{SHORT[d]}"] for d in dtypes)
    results["profile"] = profiles
    if args.peers is not None:
        results["peers"] = peers(args, str(args.encoder or default_encoder_path()), sentences,
                                 max_length, outputs["sentence-transformers float32"], scratch,
                                 task, dtypes if device.type == "cpu" else [])
    if task is not None:
        results["quality_float32"], results["floor"] = task.reference, args.floor
    return results, dtypes, device


class Quality:
    """STS-B test and BEIR SciFact test from the data folder, and float32's Spearman and
    nDCG@10 (× 100) from `reference` (`onnx_quality.py`'s JSON for this encoder)."""

    def __init__(self, data: Path, reference: Path, encoder: str):
        from bertflow.data.beir import load_task
        from bertflow.data.sts import read_stsb

        self.stsb = read_stsb(data / "STSBenchmark", "test")
        self.task = load_task(data / "beir" / "scifact", "test")
        rows = json.loads(reference.read_text(encoding="utf-8"))
        found = [r for r in rows if r.get("encoder") == encoder and r["precision"] == "float32"]
        if not found:
            raise SystemExit(f"{reference} has no float32 row for {encoder}")
        self.reference = {"stsb": found[0]["stsb_test_spearman"],
                          "ndcg": found[0][f"{self.task.name}_ndcg_at_10"]}
        self.queries = list(self.task.queries.values())
        self.texts = [*self.queries, *self.task.corpus]

    def of(self, embed: Callable[[list[str]], np.ndarray]) -> dict[str, float]:
        """STS-B test Spearman and SciFact nDCG@10 (× 100) of `embed`'s vectors."""
        return {"stsb": stsb_spearman(embed(self.stsb.first), embed(self.stsb.second),
                                      self.stsb.gold),
                "ndcg": self.score(embed(self.texts))}

    def score(self, vectors: np.ndarray) -> float:
        """nDCG@10 × 100 of the queries' and documents' `vectors`, exact cosine."""
        from bertflow.evaluation.retrieval import ranking, score_run

        n = len(self.queries)
        run = ranking(vectors[:n], vectors[n:], list(self.task.queries), self.task.corpus.ids)
        return 100 * score_run(self.task.qrels, run)["ndcg_at_10"]


def padding_share(tokens: list[int], batch_size: int) -> float:
    """The share of token positions that are padding when the sentences are sorted by length
    and each batch is padded to its longest, as sentence-transformers does."""
    lengths = np.sort(tokens)[::-1]
    positions = sum(int(lengths[i]) * len(lengths[i : i + batch_size])
                    for i in range(0, len(lengths), batch_size))
    return 1 - float(lengths.sum()) / positions


def encoder_flops(encoder: Encoder, tokens: list[int]) -> float:
    """Multiply-adds × 2 of the transformer layers over the real tokens: per layer and token
    the four d×d projections and the two d×ff ones, plus 2·T·d for scores and for values."""
    config = encoder.model.config
    d, ff, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    t = np.asarray(tokens, dtype=np.float64)
    per_layer = t.sum() * 2 * (4 * d * d + 2 * d * ff) + (t**2).sum() * 2 * 2 * d
    return float(layers * per_layer)


def matmul_peak(device: torch.device, dtype: torch.dtype, repeats: int = 10) -> float:
    """GFLOP/s of the best of `repeats` square matmuls at `dtype` on `device` (int8: int32
    sums, `torch._int_mm`)."""
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n, device=device).mul(30).to(dtype)
    b = torch.randn(n, n, device=device).mul(30).to(dtype)
    multiply = torch._int_mm if dtype == torch.int8 else torch.matmul
    best = float("inf")
    for _ in range(repeats + 1):
        _sync(device)
        began = time.perf_counter()
        multiply(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - began)
    return 2 * n**3 / best / 1e9


# the operators that multiply matrices (the projections, and attention's products where they
# are not fused); the fused attention kernels are counted apart
MATMULS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::_mkldnn_linear",
           "mkldnn::_linear_pointwise", "aten::mkldnn_linear", "aten::_int_mm")


def profile(run: Callable[[], object], device: torch.device, rows: int = 10) -> dict:
    """One run under the profiler: each operator's own time (on the GPU where there is one),
    the top `rows` of them, and the share of all of it outside the matrix products."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    run()
    gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with torch_profile(activities=activities) as prof:
        run()
    own = {e.key: (e.self_device_time_total if gpu else e.self_cpu_time_total)
           for e in prof.key_averages()}
    total = sum(own.values())
    top = sorted(own.items(), key=lambda kv: -kv[1])[:rows]
    matmul = sum(t for name, t in own.items() if name in MATMULS)
    return {"total_ms": total / 1e3, "outside_matmul": 1 - matmul / total,
            "top": [{"op": name, "ms": t / 1e3, "share": t / total} for name, t in top]}


def compiled(encoder: Encoder, sentences: list[str], max_length: int,
             batch_size: int) -> Callable[[], np.ndarray]:
    """A runner whose encoder (its own) has its fused forward compiled by torch.compile, with
    dynamic shapes."""
    if encoder.fused is None:
        raise SystemExit(f"{encoder.id.name} has no fused forward to compile")
    encoder.fused.forward = torch.compile(encoder.fused.forward, dynamic=True)
    return lambda: encoder.encode(sentences, "mean", max_length, batch_size, progress=False)


def onnx_runners(encoder: Encoder, sentences: list[str], max_length: int, batch_size: int,
                 scratch: Path) -> dict[str, Callable[[], np.ndarray]]:
    """Runners of the pipeline as one ONNX graph, float32 and int8 (`common.onnx_graphs`),
    written in `scratch`."""
    if encoder.device.type != "cpu":
        raise SystemExit("--onnx times onnxruntime on the CPU")
    tokenizer, models = onnx_graphs(encoder, max_length, scratch)
    names = {"float32": "bertflow onnx-pipeline float32 (onnxruntime)",
             "int8": "bertflow onnx-pipeline int8 (onnxruntime dynamic)"}
    return {names[p]: lambda s=onnx_session(m, torch.get_num_threads()): onnx_embed(
        s, tokenizer, sentences, batch_size) for p, m in models.items()}


def peers(args: Any, folder: str, sentences: list[str], max_length: int,
          reference: np.ndarray, scratch: Path, task: Quality | None = None,
          dtypes: Sequence[str] = ()) -> dict[str, Any]:
    """sentence-transformers' backends and bertflow's encoder in `dtypes`, timed side by side
    by `experiments/bench_peers.py` under `args.peers` (their own process and virtualenv) on
    `sentences`: each runner's sentences/s, its speed over that process's sentence-transformers
    torch float32, its agreement with `reference` (this process's sentence-transformers float32
    unit vectors) and its STS-B test Spearman × 100, as that process ran it, and, below
    `args.floor`, its `task` nDCG@10 × 100; why any could not run. The exports go in
    `scratch`."""
    import subprocess

    from bertflow.data.sts import read_stsb

    stsb = task.stsb if task is not None else read_stsb(args.data / "STSBenchmark", "test")
    n = len(stsb.first)
    if any(not s.strip() or "\n" in s for s in [*sentences, *stsb.first, *stsb.second]):
        raise SystemExit("--peers passes sentences a line each: one is empty or has a newline")
    work = scratch / "peers"
    work.mkdir()
    (work / "sentences.txt").write_text("".join(f"{s}\n" for s in sentences), encoding="utf-8")
    (work / "stsb.txt").write_text("".join(f"{s}\n" for s in [*stsb.first, *stsb.second]),
                                   encoding="utf-8")
    extra = []
    if task is not None:
        (work / "retrieval.json").write_text(json.dumps(task.texts), encoding="utf-8")
        extra = ["--retrieval", str(work / "retrieval.json"), "--below", str(args.floor)]
    subprocess.run([str(args.peers), str(Path(__file__).with_name("bench_peers.py")), *extra,
                    "--encoder", folder, "--sentences", str(work / "sentences.txt"),
                    "--quality", str(work / "stsb.txt"), "--max-length", str(max_length),
                    "--batch-size", str(args.batch_size), "--rounds", str(args.rounds),
                    "--out", str(work / "peers.json"), "--work", str(work),
                    *(["--bertflow", *dtypes] if dtypes else [])],
                   check=True, env={**os.environ, "HF_HUB_OFFLINE": "1",
                                    "HF_DATASETS_OFFLINE": "1"})
    found = json.loads((work / "peers.json").read_text(encoding="utf-8"))
    bridge = found["sentences_per_s"].get("sentence-transformers torch float32")
    rows = {}
    for name, speed in found["sentences_per_s"].items():
        x = unit(np.load(work / found["files"][name]["sentences"]))
        pairs = np.load(work / found["files"][name]["quality"])
        rows[name] = {"sentences_per_s": speed,
                      "over_st_torch": speed / bridge if bridge else None,
                      "min_cos_st_fp32": float((x * reference).sum(1).min()),
                      "max_abs_diff_st_fp32": float(np.abs(x - reference).max()),
                      "stsb_spearman": stsb_spearman(pairs[:n], pairs[n:], stsb.gold)}
        if task is not None and "retrieval" in found["files"][name]:
            rows[name]["ndcg"] = task.score(np.load(work / found["files"][name]["retrieval"]))
    return {"versions": found["versions"], "runners": rows, "failed": found["failed"]}


def stsb_spearman(first: np.ndarray, second: np.ndarray, gold: Any) -> float:
    """Spearman × 100 of the pairs' cosines (rows of `first` and `second`) against `gold`."""
    from scipy.stats import spearmanr

    return 100 * float(spearmanr((unit(first) * unit(second)).sum(1), gold).statistic)


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return f"{model}, {torch.get_num_threads()} threads"


def report(results: dict, dtypes: list[str]) -> str:
    lo, mean, hi = results["tokens_per_sentence"]
    lines = [
        f"# Encoding speed on {results['device']}\n",
        f"Made by `python experiments/bench_encode.py{results['command']}`: "
        f"{results['encoder']}, mean pooling, "
        f"{results['sentences']} Wikipedia sentences ({lo} to {hi} tokens, {mean:.1f} on "
        f"average), batch size {results['batch_size']}, max length {results['max_length']}, best "
        f"of {results['rounds']} interleaved rounds, torch {results['torch']}.\n",
        "| runner | sentences/s | × sentence-transformers | GFLOP/s | of the matmul peak | "
        "of the float32 peak | agreement |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    speed = results["sentences_per_s"]
    lines.append(f"| sentence-transformers float32 | {speed['sentence-transformers float32']:.0f}"
                 " | 1.00 | | | | |")
    for dtype in dtypes:
        s = SHORT[dtype]
        agreement = (f"max abs diff {results['max_abs_diff_fp32']:.1e} (unit vectors)"
                     if dtype == "float32" else
                     f"min cosine {results[f'min_cos_{s}']:.6f} to float32")
        if f"bertflow {dtype}" in results.get("quality", {}):
            found = results["quality"][f"bertflow {dtype}"]
            agreement += (f"; STS-B {_change(results, found['stsb'], 'stsb')}, SciFact "
                          f"{_change(results, found['ndcg'], 'ndcg')}")
        lines.append(
            f"| bertflow {dtype} | {speed[f'bertflow {dtype}']:.0f} | {results[f'ratio_{s}']:.2f}"
            f" | {results[f'gflops_{s}']:.0f} | {results[f'peak_fraction_{s}']:.2f} of "
            f"{results[f'peak_gflops_{s}']:.0f} | {results[f'fp32_peak_fraction_{s}']:.2f} of "
            f"{results['peak_gflops_fp32']:.0f} | {agreement} |")
        if f"ratio_{s}_compiled" in results:
            lines.append(
                f"| bertflow {dtype}, torch.compile | "
                f"{speed[f'bertflow {dtype} compiled']:.0f} | {results[f'ratio_{s}_compiled']:.2f}"
                f" | {results[f'gflops_{s}_compiled']:.0f} | | | |")
    for name, found in results.get("onnx", {}).items():
        lines.append(f"| {name} | {speed[name]:.0f} | {found['ratio']:.2f} | | | | min cosine "
                     f"{found['min_cos_fp32']:.6f} to bertflow float32 |")
    if "peers" in results:
        lines += _peer_lines(results)
    if "quality_float32" in results:
        reference = results["quality_float32"]
        lines.append(f"\nBelow min cosine {results['floor']}, quality is measured: STS-B test "
                     "Spearman × 100 and BEIR SciFact test nDCG@10 × 100 (exact cosine over every "
                     f"document), each with its change from float32's, {reference['stsb']:.2f} and "
                     f"{reference['ndcg']:.2f} (`onnx_quality.py`'s float32 graph).")
    lines.append(f"\nSorted by length in batches of {results['batch_size']}, each padded to its "
                 f"longest, {results['padding_share']:.0%} of these sentences' token positions "
                 "are padding: sentence-transformers' projections compute them, bertflow's "
                 "run on the real tokens (rounded up to a sixteenth of their power of two).")
    for dtype, found in results["profile"].items():
        lines += [f"\n## Where bertflow {dtype} spends its time\n",
                  f"One encode of the same sentences under torch's profiler: "
                  f"{found['total_ms']:,.0f} ms of operators' own time, "
                  f"{found['outside_matmul']:.0%} of it outside the matrix products "
                  f"({', '.join(m.removeprefix('aten::') for m in MATMULS[:4])}, ...).\n",
                  "| operator | own ms | share |", "|---|---:|---:|"]
        lines += [f"| `{r['op']}` | {r['ms']:,.0f} | {r['share']:.1%} |" for r in found["top"]]
    return "\n".join(lines) + "\n"


def _peer_lines(results: dict) -> list[str]:
    """The rows of `peers`' process, and where bertflow's fastest path stands there against the
    fastest peer at each agreement."""
    found = results["peers"]
    rows = found["runners"]
    versions = ", ".join(f"{k} {v}" for k, v in found["versions"].items() if v)
    lines = ["\n## Against sentence-transformers' backends, side by side in one process\n",
             f"`bench_peers.py` under `--peers` ({versions}), after the rounds above: "
             "sentence-transformers' backends and bertflow's paths (installed in that "
             "virtualenv by `make peers`) in one process, interleaved, on the same sentences, "
             "batch size, max length and rounds. Speed over that process's "
             "sentence-transformers torch float32; agreement with the sentence-transformers "
             "float32 unit vectors of the table above; STS-B test Spearman × 100 of each "
             "runner's cosines.\n",
             "| runner | sentences/s | × sentence-transformers torch | min cosine | "
             "max abs diff | STS-B test Spearman | SciFact test nDCG@10 |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name, row in rows.items():
        ratio = f"{row['over_st_torch']:.2f}" if row["over_st_torch"] else ""
        ndcg = _change(results, row["ndcg"], "ndcg") if "ndcg" in row else ""
        lines.append(f"| {name} | {row['sentences_per_s']:.0f} | {ratio} | "
                     f"{row['min_cos_st_fp32']:.6f} | {row['max_abs_diff_st_fp32']:.1e} | "
                     f"{row['stsb_spearman']:.2f} | {ndcg} |")
    for name, why in found["failed"].items():
        lines.append(f"| {name} | could not run: {why} | | | | | |")

    def fastest(names: list[str], floor: float) -> str | None:
        kept = [n for n in names if rows[n]["min_cos_st_fp32"] >= floor]
        return max(kept, key=lambda n: rows[n]["sentences_per_s"], default=None)

    def compare(floor: float, against: list[str], lower: float) -> str | None:
        a, b = fastest(mine, floor), fastest(against, lower)
        if a is None or b is None:
            return None
        return f"{a} is {rows[a]['sentences_per_s'] / rows[b]['sentences_per_s']:.2f}× {b}"

    mine = [n for n in rows if n.startswith("bertflow")]
    theirs = [n for n in rows if not n.startswith("bertflow")]
    lines += [""] + [f"At min cosine ≥ {floor}: {said}." for floor in (0.9999, 0.99)
                     if (said := compare(floor, theirs, floor))]
    if said := compare(0.99, [n for n in theirs if "int8" in n], -1):
        lines.append("Against the fastest int8 peer, whatever its agreement, at min cosine ≥ "
                     f"0.99: {said}.")
    return lines


def _change(results: dict, value: float, measure: str) -> str:
    return f"{value:.2f} ({value - results['quality_float32'][measure]:+.2f})"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()
