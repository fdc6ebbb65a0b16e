import sys

import numpy as np
import pytest

from ..conftest import REPO


@pytest.fixture(scope="module")
def bench():
    """experiments/bench_index.py, imported as its own folder's scripts import each other."""
    pytest.importorskip("faiss")
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        import bench_index
    finally:
        sys.path.remove(str(REPO / "experiments"))
    return bench_index


def test_recombined_sentences_are_distinct_joins_of_halves(bench):
    sentences = [f"w{i}a w{i}b w{i}c, w{i}d w{i}e w{i}f" for i in range(5)] + ["too short"]
    made = bench.recombine(sentences, 12)
    assert made == bench.recombine(sentences, 12)  # seeded
    assert len(set(made)) == 12
    for sentence in made:
        first, second = sentence.split(", ")
        i, j = first[1], second[1]
        assert i != j and first == f"w{i}a w{i}b w{i}c" and second == f"w{j}d w{j}e w{j}f"
    with pytest.raises(ValueError):
        bench.recombine(sentences, 21)  # 5 sentences make 20 ordered pairs


def test_gaussian_keeps_the_mean_and_covariance(bench):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4000, 3)) @ np.array([[2.0, 0, 0], [1, 1, 0], [0, 0, 0.5]]) + 3
    drawn = bench.gaussian(x, 20000, block=6000)
    assert drawn.shape == (20000, 3) and drawn.dtype == np.float32
    assert np.allclose(drawn.mean(0), x.mean(0), atol=0.05)
    assert np.allclose(np.cov(drawn, rowvar=False), np.cov(x, rowvar=False), atol=0.1)


def test_measure_and_report_on_small_random_data(bench):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((800, 16)).astype(np.float32)
    queries = rng.standard_normal((20, 16)).astype(np.float32)
    runs = bench.measure(x, queries, ["flat", "hnsw", "IVF8,Flat"], [1, 8])
    assert [(r["kind"], r["nprobe"]) for r in runs] == \
        [("flat", None), ("hnsw", None), ("IVF8,Flat", 1), ("IVF8,Flat", 8)]
    assert runs[0]["recall@10"] == 1.0 and runs[-1]["recall@10"] == 1.0  # all 8 lists: exact
    assert runs[2]["recall@10"] < 1.0
    assert runs[0]["bytes_per_vector"] > 16 * 4 and all(r["qps"] > 0 for r in runs)
    results = {"machine": "test", "command": "python experiments/bench_index.py", "faiss": "x",
               "real": 800, "encoder": "e", "pooling": "first_last", "max_length": 128,
               "dtype": "float32", "gaussian": 0, "queries": 20, "head": "h",
               "head_transform_s": 0.0, "threads": 1,
               "runs": [{"space": s, "corpus": "800 real", **r} for s in ("raw", "head")
                        for r in runs]}
    text = bench.report(results)
    assert "| IVF8,Flat | 8 |" in text and text.count("\n| ") == 5
    with pytest.raises(ValueError, match="flat"):
        bench.measure(x, queries, ["hnsw"], [1])
