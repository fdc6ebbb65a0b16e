"""experiments/bench_gpu.py, run on the CPU with a tiny encoder: each step ends, checks what it
says it checks, and a later run of one step keeps the rows of the others. The script is made
for a GPU machine, where a failure found late costs the most."""

import json
import subprocess
import sys

import pytest

from .conftest import REPO, data_dir

SCRIPT = REPO / "experiments" / "bench_gpu.py"


def bench_gpu(tmp_path, encoder, *steps):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--dtype", "float32",
         "--encoder", str(encoder), "--data", str(data_dir()), "--out", str(tmp_path / "out"),
         "--work", str(tmp_path / "work"), "--sentences", "24576", "--torchrun-sentences",
         "200", "--bench-sentences", "32", "--rounds", "1", "--batch-size", "64",
         "--steps", *steps], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (tmp_path / "out").iterdir()  # named for the device
    return folder, json.loads((folder / "bench_gpu.json").read_text())


def test_every_step_runs_and_a_later_step_keeps_the_others(tmp_path, tiny_encoder_dir):
    if not (data_dir() / "unlabeled" / "wiki-sample.txt").exists():
        pytest.skip(f"no Wikipedia sample in {data_dir()}")
    folder, results = bench_gpu(tmp_path, tiny_encoder_dir, "speed", "resume")
    resume = results["steps"]["resume"]
    # killed with 2 of its 3 chunks of 8,192 recorded: half way, not at the end
    assert resume["rows_when_killed"] == 16384 and resume["identical"]
    (speed,) = results["steps"]["speed"]["encoders"]
    assert speed["sentences"] == 32 and speed["ratio_fp32"] > 0 and "bfloat16" in speed["profile"]
    for suffix in ("md", "json"):
        assert (folder / f"bench_encode-cpu-{tiny_encoder_dir.name}.{suffix}").exists()

    folder, results = bench_gpu(tmp_path, tiny_encoder_dir, "torchrun")
    assert set(results["steps"]) == {"speed", "resume", "torchrun"}
    torchrun = results["steps"]["torchrun"]
    assert torchrun["encode_identical"] and torchrun["fit_max_abs_diff"] <= 1e-6
    assert torchrun["command"].endswith("--steps torchrun")
    report = (folder / "bench_gpu.md").read_text()
    assert "byte for byte the uninterrupted one" in report and "| encode |" in report
    assert "| fit |" in report and f"| {tiny_encoder_dir.name} |" in report
