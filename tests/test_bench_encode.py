"""experiments/bench_encode.py --onnx on a tiny encoder: the whole pipeline as one ONNX graph is
timed beside the other runners, in float32 (the same vectors as bertflow's) and in int8."""

import json
import os
import subprocess
import sys

import pytest

from .conftest import REPO, data_dir


def run_bench(tmp_path, *options: str) -> None:
    """bench_encode.py with `options` succeeds, its temporary files in a folder of the test's
    own, which it must leave without its graphs, exports and embeddings."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = subprocess.run([sys.executable, str(REPO / "experiments" / "bench_encode.py"),
                           *options], capture_output=True, text=True, cwd=REPO / "experiments",
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 0, done.stderr[-3000:]
    left = [p for p in scratch.rglob("*") if p.suffix in (".onnx", ".xml", ".npy", ".txt")
            or p.name.startswith(("bench-", "peers-"))]
    assert left == [], left


def test_the_onnx_rows_are_timed_and_compared(tmp_path, tiny_encoder_dir):
    if not (data_dir() / "unlabeled" / "wiki-sample.txt").exists():
        pytest.skip(f"no Wikipedia sample in {data_dir()}")
    run_bench(
        tmp_path, "--device", "cpu", "--encoder", str(tiny_encoder_dir), "--data", str(data_dir()),
        "--sentences", "32", "--rounds", "1", "--onnx", "--out", str(tmp_path),
        "--json", str(tmp_path / "r.json"))
    onnx = json.loads((tmp_path / "r.json").read_text())["onnx"]
    assert sorted(onnx) == ["bertflow onnx-pipeline float32 (onnxruntime)",
                            "bertflow onnx-pipeline int8 (onnxruntime dynamic)"]
    assert onnx["bertflow onnx-pipeline float32 (onnxruntime)"]["min_cos_fp32"] >= 0.9999
    assert all(0 < row["ratio"] and -1 <= row["min_cos_fp32"] <= 1 for row in onnx.values())
    report = (tmp_path / f"bench_encode-cpu-{tiny_encoder_dir.name}.md").read_text()
    assert all(f"| {name} |" in report for name in onnx)


def test_the_peers_run_in_their_own_interpreter_and_say_why_one_cannot(tmp_path,
                                                                       tiny_encoder_dir):
    """`--peers` with this interpreter: sentence-transformers' torch backend and bertflow's
    paths run there side by side, the ONNX and OpenVINO ones need optimum (`make peers`), which
    this one lacks: each says why."""
    pytest.importorskip("sentence_transformers")
    if not (data_dir() / "STSBenchmark" / "sts-test.csv").exists():
        pytest.skip(f"no STS-B in {data_dir()}")
    run_bench(
        tmp_path, "--device", "cpu", "--encoder", str(tiny_encoder_dir), "--data", str(data_dir()),
        "--sentences", "32", "--rounds", "1", "--peers", sys.executable, "--out", str(tmp_path),
        "--json", str(tmp_path / "r.json"))
    found = json.loads((tmp_path / "r.json").read_text())["peers"]
    torch_row = found["runners"]["sentence-transformers torch float32"]
    assert torch_row["over_st_torch"] == 1 and torch_row["min_cos_st_fp32"] > 0.9999
    assert -100 <= torch_row["stsb_spearman"] <= 100
    assert "sentence-transformers onnx float32" in found["failed"]
    ours = {n: found["runners"][n] for n in found["runners"] if n.startswith("bertflow")}
    assert sorted(ours) == ["bertflow bfloat16", "bertflow float32", "bertflow int8"]
    assert ours["bertflow float32"]["min_cos_st_fp32"] > 0.9999
    assert all(row["sentences_per_s"] > 0 for row in ours.values())
    report = (tmp_path / f"bench_encode-cpu-{tiny_encoder_dir.name}.md").read_text()
    assert "| sentence-transformers onnx float32 | could not run: " in report
    assert "At min cosine ≥ 0.9999: bertflow " in report
    assert "× sentence-transformers torch float32." in report


def test_rows_below_the_floor_have_their_quality_measured(tmp_path, tiny_encoder_dir):
    """Every runner below --floor (here above 1: bfloat16 and int8) has its STS-B and SciFact
    quality measured and set against the float32 row of the reference file; float32 not."""
    if not (data_dir() / "beir" / "scifact" / "corpus.jsonl").exists():
        pytest.skip(f"no BEIR SciFact in {data_dir()}")
    reference = tmp_path / "quality.json"
    reference.write_text(json.dumps([{"encoder": tiny_encoder_dir.name, "precision": "float32",
                                      "stsb_test_spearman": 2.5, "scifact_ndcg_at_10": 1.25}]))
    run_bench(
        tmp_path, "--device", "cpu", "--encoder", str(tiny_encoder_dir), "--data", str(data_dir()),
        "--sentences", "32", "--rounds", "1", "--retrieval", str(reference), "--floor", "1.01",
        "--out", str(tmp_path), "--json", str(tmp_path / "r.json"))
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["quality_float32"] == {"stsb": 2.5, "ndcg": 1.25}
    assert list(results["quality"]) == ["bertflow bfloat16", "bertflow int8"]
    found = results["quality"]["bertflow int8"]
    assert 0 <= found["ndcg"] <= 100 and -100 <= found["stsb"] <= 100
    report = (tmp_path / f"bench_encode-cpu-{tiny_encoder_dir.name}.md").read_text()
    assert (f"; STS-B {found['stsb']:.2f} ({found['stsb'] - 2.5:+.2f}), SciFact "
            f"{found['ndcg']:.2f} ({found['ndcg'] - 1.25:+.2f}) |") in report
    assert "Below min cosine 1.01, quality is measured" in report
    assert "change from float32's, 2.50 and 1.25" in report
