"""The peers bertflow's encoder is timed against, in a virtualenv of their own: sentence-
transformers with its torch, ONNX and OpenVINO backends, float32 and int8, and, side by side
with them in this process, bertflow's encoder in the dtypes given by --bertflow.

sentence-transformers' ONNX and OpenVINO backends need optimum, whose releases pin a
transformers (4.57) other than the one bertflow's tests run with, so they cannot share that
process: `make peers` builds `.venv-peers` (the CPU torch first, then
experiments/peers-requirements.txt, then bertflow itself, which that transformers satisfies),
and `bench_encode.py --peers .venv-peers/bin/python` runs this script there on the same
sentences, batch size and max length. Without --bertflow it imports nothing of bertflow.

Runners: sentence-transformers' torch backend in float32, its ONNX backend in float32 and with
`export_dynamic_quantized_onnx_model`'s int8 (the quantisation config named by --onnx-int8), its
OpenVINO backend in float32 and with `export_static_quantized_openvino_model`'s int8, calibrated
on --calibration (a text file, one sentence a line), each on a copy of the encoder folder (the
folder given is only read) in a new folder in --work, removed at the end; and bertflow's
`Encoder.encode` (mean pooling) in each --bertflow dtype. Interleaved rounds, each runner once
per round, the best kept. A runner that cannot be built says why in the JSON, and the others
run. Writes --out (JSON: versions, sentences/s, each round, why a runner failed) and each
runner's embeddings of the sentences (and of --quality, where given) as .npy files beside it;
with --retrieval (a JSON list of texts), each runner whose min cosine to this process's torch
float32 on the sentences is below --below embeds those texts too.

    .venv-peers/bin/python experiments/bench_peers.py --encoder DIR --sentences FILE
        --max-length N --out FILE.json [--batch-size 32] [--rounds 5] [--work DIR]
        [--quality FILE] [--retrieval FILE.json --below 0.9999] [--calibration FILE]
        [--onnx-int8 avx512_vnni] [--bertflow float32 bfloat16 int8]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import numpy as np

PACKAGES = ("sentence-transformers", "transformers", "torch", "optimum", "optimum-onnx",
            "optimum-intel", "onnxruntime", "openvino", "nncf", "bertflow")


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("--encoder", type=Path, required=True)
    options.add_argument("--sentences", type=Path, required=True, help="one sentence a line")
    options.add_argument("--max-length", type=int, required=True)
    options.add_argument("--out", type=Path, required=True)
    options.add_argument("--batch-size", type=int, default=32)
    options.add_argument("--rounds", type=int, default=5)
    options.add_argument("--work", type=Path, default=None,
                         help="a folder in which a new one takes the exports (removed at "
                              "the end)")
    options.add_argument("--quality", type=Path, default=None,
                         help="sentences each runner also embeds once (one a line)")
    options.add_argument("--retrieval", type=Path, default=None,
                         help="a JSON list of texts embedded by the runners below --below")
    options.add_argument("--below", type=float, default=0.9999,
                         help="the min cosine under which a runner embeds --retrieval")
    options.add_argument("--calibration", type=Path, default=None,
                         help="OpenVINO int8's calibration sentences (default: --sentences)")
    options.add_argument("--onnx-int8", default="avx512_vnni",
                         help="export_dynamic_quantized_onnx_model's quantisation config")
    options.add_argument("--bertflow", nargs="*", default=[], metavar="DTYPE",
                         help="also time bertflow's encoder in these dtypes, in this process")
    args = options.parse_args()
    with tempfile.TemporaryDirectory(prefix="peers-", dir=args.work) as work:  # the exports
        measure(args, Path(work))


def measure(args: argparse.Namespace, work: Path) -> None:
    """Every runner built in `work`, timed, and its embeddings and the JSON written."""
    sentences = _lines(args.sentences)
    runners, failed = build(args, work)
    for run in runners.values():  # warm-up
        run(sentences[: args.batch_size])
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    outputs: dict[str, np.ndarray] = {}
    for _ in range(args.rounds):
        for name, run in runners.items():
            began = time.perf_counter()
            outputs[name] = run(sentences)
            seconds[name].append(time.perf_counter() - began)
    quality = _lines(args.quality) if args.quality else None
    retrieval = json.loads(args.retrieval.read_text(encoding="utf-8")) if args.retrieval else None
    reference = _unit(outputs.get("sentence-transformers torch float32"))
    files = {}
    for number, (name, run) in enumerate(runners.items()):
        files[name] = {"sentences": _save(args.out, f"{number}", outputs[name])}
        if quality is not None:
            files[name]["quality"] = _save(args.out, f"{number}-quality", run(quality))
        if (retrieval is not None and reference is not None
                and (_unit(outputs[name]) * reference).sum(1).min() < args.below):
            files[name]["retrieval"] = _save(args.out, f"{number}-retrieval", run(retrieval))
    results = {"versions": {p: _version(p) for p in PACKAGES},
               "sentences": len(sentences), "batch_size": args.batch_size,
               "max_length": args.max_length, "rounds": args.rounds,
               "sentences_per_s": {n: len(sentences) / min(s) for n, s in seconds.items()},
               "seconds": seconds, "files": files, "failed": failed}
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


def build(args: argparse.Namespace, work: Path) -> tuple[dict[str, Callable], dict[str, str]]:
    """Every runner that can be built (name → encode function), and why the others cannot."""
    from sentence_transformers import SentenceTransformer

    runners: dict[str, Callable] = {}
    failed: dict[str, str] = {}

    def model(backend: str, file_name: str | None = None, source: Path | None = None,
              config: dict | None = None):
        folder = source or _copy(args.encoder, work / backend)
        kwargs = {"file_name": file_name} if file_name else {}
        if config:
            kwargs["ov_config"] = config
        made = SentenceTransformer(str(folder), backend=backend, device="cpu",
                                   local_files_only=True, model_kwargs=kwargs)
        made.max_seq_length = args.max_length
        return made

    def add(name: str, make: Callable) -> None:
        try:
            made = make()
        except Exception as e:  # a peer that cannot be built offline: say why, go on
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            traceback.print_exc()
            return
        if isinstance(made, SentenceTransformer):
            runners[name] = lambda texts, m=made: np.asarray(m.encode(
                texts, batch_size=args.batch_size, convert_to_numpy=True), np.float32)
        else:
            runners[name] = made

    def bertflow(dtype: str) -> Callable:
        from bertflow import load_encoder

        encoder = load_encoder(args.encoder, "cpu", dtype)  # it only reads the folder
        return lambda texts: np.asarray(encoder.encode(
            texts, "mean", args.max_length, args.batch_size, progress=False), np.float32)

    add("sentence-transformers torch float32", lambda: model("torch"))

    def onnx_float32():
        made = model("onnx")
        made.save_pretrained(str(work / "onnx"))
        return made

    def onnx_int8():
        from sentence_transformers.backend import export_dynamic_quantized_onnx_model

        export_dynamic_quantized_onnx_model(model("onnx", source=work / "onnx"),
                                            args.onnx_int8, str(work / "onnx"))
        return model("onnx", f"onnx/model_qint8_{args.onnx_int8}.onnx", work / "onnx")

    add("sentence-transformers onnx float32", onnx_float32)
    add(f"sentence-transformers onnx int8 (dynamic, {args.onnx_int8})", onnx_int8)

    def openvino_float32():
        made = model("openvino")
        made.save_pretrained(str(work / "openvino"))
        return made

    def openvino_int8():
        from sentence_transformers.backend import export_static_quantized_openvino_model

        calibration = work / "calibration"
        calibration.mkdir(exist_ok=True)
        texts = _lines(args.calibration or args.sentences)
        (calibration / "train.jsonl").write_text(
            "".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        export_static_quantized_openvino_model(  # a model of its own: it is changed
            model("openvino", source=work / "openvino"), None, str(work / "openvino"),
            dataset_name=str(calibration), dataset_config_name="default",
            dataset_split="train", column_name="text")
        return model("openvino", "openvino/openvino_model_qint8_quantized.xml", work / "openvino")

    add("sentence-transformers openvino (its default precision)", openvino_float32)
    add("sentence-transformers openvino float32", lambda: model(
        "openvino", source=work / "openvino", config={"INFERENCE_PRECISION_HINT": "f32"}))
    add("sentence-transformers openvino int8 (static)", openvino_int8)
    for dtype in args.bertflow:
        add(f"bertflow {dtype}", lambda d=dtype: bertflow(d))
    return runners, failed


def _copy(folder: Path, to: Path) -> Path:
    """A copy of the encoder folder, so that nothing is written into the one given."""
    if not to.exists():
        shutil.copytree(folder, to)
    return to


def _unit(x: np.ndarray | None) -> np.ndarray | None:
    if x is None:
        return None
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _save(out: Path, name: str, x: np.ndarray) -> str:
    path = out.with_name(f"{out.stem}-{name}.npy")
    np.save(path, x)
    return path.name


def _version(package: str) -> str | None:
    try:
        return version(package)
    except Exception:
        return None


if __name__ == "__main__":
    main()
