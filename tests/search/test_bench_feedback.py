import json
import sys

import numpy as np
import pytest

from bertflow.training.feedback import Feedback

from ..training.test_recipes import _script


@pytest.fixture(scope="module")
def bench():
    pytest.importorskip("faiss")
    return _script("bench_feedback")


def test_measure_and_report_at_a_tiny_size(bench):
    x = bench.gaussian(600, 16)
    assert x.shape == (600, 16) and x.dtype == np.float32
    assert (x == bench.gaussian(600, 16)).all()  # seeded
    spread = np.linalg.svd(x - x.mean(0), compute_uv=False)
    assert spread[0] > 2 * spread[-1]  # a decaying spectrum, as embeddings'
    runs = bench.measure(x[20:], x[:20], ["flat", "hnsw"], Feedback(3, 0.5), rounds=1)
    assert [r["kind"] for r in runs] == ["flat", "hnsw"]
    for r in runs:
        assert r["plain_qps"] > 0 and r["feedback_qps"] > 0 and r["time_ratio"] > 0
        assert 0 < r["changed@10"] < 1 and (r["vectors"], r["dim"], r["queries"]) == (580, 16, 20)
    results = {"machine": "test", "command": "python experiments/bench_feedback.py",
               "faiss": "x", "threads": 1, "source": "s", "rounds": 1,
               "feedback": Feedback(3, 0.5).to_dict(), "runs": runs}
    text = bench.report(results)
    assert "| flat | 580 | 16 |" in text and text.count("\n| ") == 3


def test_main_writes_its_results(bench, tmp_path, monkeypatch, capsys):
    vectors = tmp_path / "x.npy"
    np.save(vectors, bench.gaussian(300, 8, seed=1))
    monkeypatch.setattr(sys, "argv", ["bench_feedback.py", "--vectors", str(vectors), "--size",
                                      "250", "--queries", "30", "--kinds", "flat", "--rounds",
                                      "1", "--out", str(tmp_path), "--name", "fb"])
    bench.main()
    results = json.loads((tmp_path / "fb.json").read_text())
    assert results["feedback"] == {"k": 3, "beta": 0.5, "weighted": False}
    [run] = results["runs"]
    assert (run["vectors"], run["queries"], run["dim"]) == (250, 30, 8)
    assert (tmp_path / "fb.md").read_text() in capsys.readouterr().out
