import math

import numpy as np
import pytest
from scipy.special import gammaln, i0, ive

from bertflow import BertflowError
from bertflow.embeddings.isotropy import (
    alignment,
    condition_number,
    effective_rank,
    isotropy_measures,
    mean_pair_cosine,
    pair_cosines,
    partition_isotropy,
    uniformity,
)


def test_isotropic_gaussian_scores_as_isotropic():
    x = np.random.default_rng(0).normal(size=(5000, 32))
    assert abs(mean_pair_cosine(x)) < 0.02
    assert effective_rank(x) > 30
    assert condition_number(x) < 1.3
    assert partition_isotropy(x) > 0.9


def test_a_narrow_cone_scores_as_anisotropic():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5000, 32)) * np.geomspace(1, 1e-3, 32) + 5
    assert mean_pair_cosine(x) > 0.95
    assert effective_rank(x) < 15
    assert condition_number(x) > 500
    # on unit vectors Z ranges over [n/e, n e]: a perfect cone gives 1/e²
    assert partition_isotropy(x) < 0.4


def test_partition_isotropy_of_a_cone_counts_both_signs_of_each_direction():
    # every row one unit vector u (plus noise): Z(u) = n e, Z(-u) = n / e, so I = 1/e²
    rng = np.random.default_rng(3)
    u = rng.normal(size=16)
    x = u / np.linalg.norm(u) + 1e-7 * rng.normal(size=(300, 16))
    assert partition_isotropy(x) == pytest.approx(math.exp(-2), rel=1e-5)
    assert partition_isotropy(-x) == pytest.approx(math.exp(-2), rel=1e-5)


def test_partition_isotropy_of_symmetric_sets():
    assert partition_isotropy(np.concatenate([np.eye(6), -np.eye(6)])) == pytest.approx(1.0)
    # ±e1 three times, ±e2 twice, ±e3 once: W^T W = diag(6, 4, 2), and the m copies of ±e_j
    # give Z(±e_j) = m (e + 1/e) + 2 (6 - m)
    w = np.repeat(np.eye(3), [3, 2, 1], axis=0)
    w = np.concatenate([w, -w])
    z = [m * (math.e + 1 / math.e) + 2 * (6 - m) for m in (3, 2, 1)]
    assert partition_isotropy(w) == pytest.approx(min(z) / max(z), rel=1e-12)


def test_partition_isotropy_against_a_brute_force_sum():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(40, 5)) * np.array([3.0, 1.5, 1.0, 0.5, 0.2]) + 0.8
    w = [[v / math.sqrt(sum(v * v for v in row)) for v in row] for row in x.tolist()]
    _, vectors = np.linalg.eigh(np.array(w).T @ np.array(w))
    z = [sum(math.exp(sign * sum(a * b for a, b in zip(c, row, strict=True))) for row in w)
         for c in vectors.T.tolist() for sign in (1, -1)]
    assert partition_isotropy(x) == pytest.approx(min(z) / max(z), rel=1e-9)


def test_effective_rank_and_condition_number_on_a_known_spectrum():
    # centred columns with singular values 4, 2, 1, 1
    q = np.linalg.qr(np.random.default_rng(1).normal(size=(100, 4)))[0]
    q -= q.mean(0)
    q = np.linalg.qr(q)[0]
    x = q * np.array([4.0, 2.0, 1.0, 1.0])
    p = np.array([4, 2, 1, 1]) / 8
    assert effective_rank(x) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-6)
    assert condition_number(x) == pytest.approx(4.0, rel=1e-6)


def test_partition_isotropy_is_scale_free_and_dead_dimensions_give_none():
    x = np.random.default_rng(2).normal(size=(500, 8)) + 1
    assert partition_isotropy(x) == pytest.approx(partition_isotropy(x * 100))
    x[:, 3] = 0.5
    measures = isotropy_measures(x)
    assert measures["condition_number"] is None
    assert set(measures) == {"mean_cosine", "effective_rank", "condition_number", "isotropy"}


def test_alignment_of_identical_antipodal_and_orthogonal_pairs():
    x = np.random.default_rng(5).normal(size=(50, 8))
    assert alignment(x, 3 * x) == pytest.approx(0, abs=1e-12)
    assert alignment(x, -x) == pytest.approx(4)
    assert alignment(x, -x, alpha=1) == pytest.approx(2)
    e = np.eye(8)
    assert alignment(e, np.roll(e, 1, axis=0)) == pytest.approx(2)
    assert math.isnan(alignment(x[:0], x[:0]))
    with pytest.raises(BertflowError, match="one shape"):
        alignment(x, x[:10])


def test_uniformity_of_one_direction_and_of_a_circle():
    assert uniformity(np.ones((30, 4)) + 1e-9) == pytest.approx(0, abs=1e-12)
    assert math.isnan(uniformity(np.ones((1, 4))))
    # n equally spaced points on the circle, every pair: |u - v|^2 = 2 - 2 cos(2 pi k / n),
    # and sum_{k=0}^{n-1} exp(4 cos(2 pi k / n)) = n I0(4) to machine precision
    n = 400
    angle = 2 * np.pi * np.arange(n) / n
    circle = np.stack([np.cos(angle), np.sin(angle)], axis=1)
    expected = -4 + math.log((n * i0(4) - math.exp(4)) / (n - 1))
    assert uniformity(circle, pairs=n * n) == pytest.approx(expected, rel=1e-9)
    # t = 1: log E exp(-(2 - 2 cos)) = -2 + log I0(2) in the limit of many points
    assert uniformity(circle, t=1, pairs=2000, seed=1) == pytest.approx(
        -2 + math.log(i0(2)), abs=0.05)


def test_uniformity_on_a_high_dimensional_sphere():
    # cos s of two uniform points of S^{d-1}: E exp(k s) = Γ(d/2) (k/2)^{1-d/2} I_{d/2-1}(k)
    d, t = 64, 2.0
    k = 2 * t
    expected = -2 * t + gammaln(d / 2) + (1 - d / 2) * math.log(k / 2) \
        + math.log(ive(d / 2 - 1, k)) + k
    x = np.random.default_rng(6).normal(size=(4000, d)) * 7
    assert uniformity(x, t=t) == pytest.approx(expected, abs=0.01)
    assert uniformity(x, t=t) == uniformity(x, t=t)  # seeded
    assert uniformity(x, t=t, seed=1) != uniformity(x, t=t)


def test_pair_cosines_read_only_the_pairs_rows_from_a_file(tmp_path):
    """An `EmbeddingFile` (a table read by rows) gives the array's cosines, bit for bit."""
    from bertflow.embeddings.file import EmbeddingFile

    x = np.random.default_rng(1).normal(size=(300, 6)).astype(np.float32) + 0.5
    np.save(tmp_path / "x.npy", x)
    with EmbeddingFile(tmp_path / "x.npy") as file:
        np.testing.assert_array_equal(pair_cosines(file, 500), pair_cosines(x, 500))
        assert mean_pair_cosine(file) == mean_pair_cosine(x) > 0.1
