"""A full disk while writing an output is one line, and leaves nothing behind."""

import json
import os
import subprocess
import sys

import numpy as np

from .conftest import REPO, fit_tiny_head


def run_limited(kilobytes, *args, cwd):
    """`python -m bertflow ARGS` with files limited to `kilobytes` (as on a full disk), in a
    shell that delivers SIGXFSZ as `ulimit -f` does (Python ignores it: writes fail)."""
    command = " ".join(map(str, [sys.executable, "-m", "bertflow", *args]))
    return subprocess.run(["bash", "-c", f"ulimit -f {kilobytes}; exec {command}"],
                          capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_transform_on_a_full_disk_is_one_line_naming_the_file(tmp_path, tiny_encoder):
    fit_tiny_head(tiny_encoder, "cls").save(tmp_path / "head")
    np.save(tmp_path / "e.npy", np.random.default_rng(0).normal(size=(2000, 16))
            .astype(np.float32))
    done = run_limited(64, "transform", "--head", "head", "--embeddings", "e.npy",
                       "--pooling", "cls", "--out", "z.npy", cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0] == "bertflow: error: file too large (a file size limit) while writing z.npy"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy", "head"]


def test_a_transformed_file_is_what_numpy_saves(tmp_path):
    from bertflow.embeddings import write_transformed

    z = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    write_transformed(tmp_path / "z.npy", z, {}, {})
    np.save(tmp_path / "n.npy", z)
    assert (tmp_path / "z.npy").read_bytes() == (tmp_path / "n.npy").read_bytes()
    assert json.loads((tmp_path / "z.meta.json").read_text())["count"] == 7
