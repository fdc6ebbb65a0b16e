import numpy as np
import pytest

from bertflow import BertflowError, FlowConfig, TrainConfig
from bertflow.evaluation.methods import METHODS, make_method


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(16, 16))
    return (rng.normal(size=(3000, 16)) * np.linspace(0.2, 4, 16)) @ mixing + 3


def test_whitening_gives_identity_covariance(x):
    z = make_method("whitening").fit(x).transform(x)
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-3)
    np.testing.assert_allclose(np.cov(z, rowvar=False), np.eye(16), atol=1e-3)


def test_whitening_k_keeps_the_top_k_components(x):
    method = make_method("whitening-k", k=5).fit(x)
    z = method.transform(x)
    assert z.shape == (3000, 5) and method.name == "whitening-k"
    np.testing.assert_allclose(np.cov(z, rowvar=False), np.eye(5), atol=1e-3)
    # the kept directions are those of largest variance
    top = np.linalg.eigh(np.cov(x, rowvar=False))[1][:, ::-1][:, :5]
    kept = method.head.linear.weight.double().numpy()
    np.testing.assert_allclose(np.abs(kept / np.linalg.norm(kept, axis=0)), np.abs(top), atol=1e-5)


@pytest.mark.parametrize("d", [0, 1, 3])
def test_all_but_the_top_removes_exactly_d_directions(x, d):
    z = make_method("abtt", d=d).fit(x).transform(x).astype(np.float64)
    s_before = np.linalg.svd(x - x.mean(0), compute_uv=False)
    s_after = np.linalg.svd(z, compute_uv=False)
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-3)
    assert (s_after < 1e-3 * s_before[0]).sum() == d  # d directions are gone
    np.testing.assert_allclose(s_after[: 16 - d], s_before[d:], rtol=1e-4)  # the rest untouched
    top = np.linalg.svd(x - x.mean(0), full_matrices=False)[2][:d]
    assert np.abs(z @ top.T).max(initial=0) < 1e-3  # the top d directions are gone


def test_scaler_only_and_raw(x):
    z = make_method("standardize").fit(x).transform(x)
    np.testing.assert_allclose(z.std(0, ddof=1), 1, atol=1e-5)
    np.testing.assert_array_equal(make_method("raw").fit(x).transform(x), x.astype(np.float32))


def test_flow_method_fits_a_head(x):
    method = make_method("flow", flow=FlowConfig(levels=2), train=TrainConfig(epochs=1))
    z = method.fit(x).transform(x)
    assert z.shape == x.shape and abs(z.mean()) < 0.1
    assert method.describe()["flow"]["levels"] == 2


def test_every_method_by_name_and_bad_parameters(x):
    for name in METHODS:
        assert make_method(name).name == name
    assert make_method("whitening-k", k=4).describe() == {"k": 4}
    assert make_method("abtt", d=2).describe() == {"d": 2}
    with pytest.raises(BertflowError, match="unknown method"):
        make_method("ica")
    with pytest.raises(BertflowError, match="must be between 1 and the dimension"):
        make_method("whitening-k", k=17).fit(x)
    with pytest.raises(BertflowError, match=r"must be in \[0, dimension"):
        make_method("abtt", d=16).fit(x)
    with pytest.raises(BertflowError, match="fit the whitening before transforming"):
        make_method("whitening").transform(x)


def test_a_method_specification_is_checked_once_when_made():
    """`MethodSpec` states a method and its options; whitening with k is whitening-k, an option
    of another method or a shrinkage outside [0, 1] is refused where it is made."""
    from bertflow import MethodSpec

    assert MethodSpec("whitening", k=4).name == "whitening-k"
    assert MethodSpec("whitening-k", k=4).linear_options(16) == {"k": 4}
    assert MethodSpec("abtt").linear_options(300) == {"d": 3}
    assert MethodSpec.of("raw") == MethodSpec("raw") and not MethodSpec("flow").is_linear
    spec = MethodSpec("whitening", shrinkage=0.5)
    assert MethodSpec.of(spec) is spec and spec.is_linear
    for options, message in (({"name": "ica"}, "unknown method 'ica'"),
                             ({"name": "abtt", "k": 3}, "fractional and pca"),
                             ({"name": "flow", "d": 1}, "applies to abtt"),
                             ({"name": "whitening", "shrinkage": 1.5}, "must be in \\[0, 1\\]"),
                             ({"name": "abtt", "recipe": {}}, "a recipe applies to the flow")):
        with pytest.raises(BertflowError, match=message):
            MethodSpec(**options)


def test_a_fit_job_takes_a_method_specification_or_a_name():
    from pathlib import Path

    from bertflow import MethodSpec
    from bertflow.training.job import FitJob

    assert FitJob(Path("c.txt"), Path("h"), "whitening").method == MethodSpec("whitening")
    spec = MethodSpec("abtt", d=2)
    assert FitJob(Path("c.txt"), Path("h"), spec).method is spec
    with pytest.raises(BertflowError, match="a fit job's method is a MethodSpec"):
        FitJob(Path("c.txt"), Path("h"), 3)
