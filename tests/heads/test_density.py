import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from bertflow import BertflowError, FlowConfig, TrainConfig, fit_head
from bertflow.heads.density import auroc, novelty, typicality


@pytest.mark.parametrize("neg, pos, expected", [
    ([1, 2, 3], [4, 5], 1.0),
    ([4, 5], [1, 2, 3], 0.0),
    ([1, 2], [2, 3], (1 + 0.5 + 1 + 1) / 4),  # one tie counts half
])
def test_auroc_by_hand(neg, pos, expected):
    assert auroc(np.array(neg, float), np.array(pos, float)) == pytest.approx(expected)


def test_auroc_matches_mann_whitney():
    rng = np.random.default_rng(0)
    neg, pos = rng.normal(size=50), rng.normal(0.5, size=70).round(1)
    u = mannwhitneyu(pos, neg).statistic
    assert auroc(neg, pos) == pytest.approx(u / (50 * 70))
    with pytest.raises(BertflowError):
        auroc(np.array([]), pos)


def test_novelty_separates_a_shifted_sample():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(600, 8)).astype(np.float32)
    head = fit_head(x[:500], flow=FlowConfig(levels=1, depth=2),
                        train=TrainConfig(epochs=3))
    near, far = novelty(head, x[500:]), novelty(head, x[500:] + 3)
    assert auroc(near, far) > 0.95


def test_typicality_flags_inputs_denser_than_the_domain():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 32)).astype(np.float32)  # typical −log p: 45 ± 4 nats
    head = fit_head(x[:500], flow=FlowConfig(levels=1, depth=2),
                        train=TrainConfig(epochs=3))
    central = x[500:] * 0.1  # far more probable than the domain's own rows
    assert auroc(novelty(head, x[500:]), novelty(head, central)) < 0.05
    reference = novelty(head, x[:500])
    typical = typicality(novelty(head, x[500:]), reference)
    assert auroc(typical, typicality(novelty(head, central), reference)) > 0.95
