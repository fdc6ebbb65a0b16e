import math

import numpy as np
import pytest

from bertflow.isotropy import (
    condition_number,
    effective_rank,
    isotropy_measures,
    mean_pair_cosine,
    partition_isotropy,
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
    # on unit vectors Z ranges over [n/e, n e]: a perfect cone gives 1/e
    assert partition_isotropy(x) < 0.4


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
