import re

import numpy as np
import pytest
import torch

from bertflow import BertflowError
from bertflow.heads.linear import LinearMap, covariance, fit_map


@pytest.fixture
def x():
    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(12, 12)) * np.linspace(3, 0.1, 12)
    return (rng.normal(size=(500, 12)) @ mixing + 5).astype(np.float32)


def test_streamed_covariance_is_numpys(x, tmp_path, monkeypatch):
    import bertflow.heads.linear
    from bertflow.embeddings.file import EmbeddingFile

    monkeypatch.setattr(bertflow.heads.linear, "_BLOCK", 64)  # many blocks
    np.save(tmp_path / "x.npy", x)
    mean, cov = covariance(EmbeddingFile(tmp_path / "x.npy"))
    np.testing.assert_allclose(mean, x.astype(np.float64).mean(0), rtol=1e-10)
    np.testing.assert_allclose(cov, np.cov(x.astype(np.float64), rowvar=False), rtol=1e-9)
    x[7, 3] = np.nan
    with pytest.raises(BertflowError, match="NaN values .*row 7"):
        covariance(x)


def test_whitening_gives_identity_covariance_and_inverts(x):
    w = fit_map(x)
    z, log_det = w(torch.from_numpy(x))
    np.testing.assert_allclose(np.cov(z.double().numpy(), rowvar=False), np.eye(12), atol=1e-4)
    back, inverse_log_det = w.inverse(z)
    np.testing.assert_allclose(back.numpy(), x, atol=1e-3)
    jacobian = torch.autograd.functional.jacobian(lambda v: w(v[None])[0][0],
                                                 torch.from_numpy(x[0]))
    assert log_det[0].item() == pytest.approx(torch.linalg.slogdet(jacobian)[1].item(), abs=1e-3)
    assert inverse_log_det[0].item() == pytest.approx(-log_det[0].item(), abs=1e-5)


def test_whitening_k_keeps_the_top_components(x):
    w = fit_map(x, k=4)
    z = w(torch.from_numpy(x))[0].double().numpy()
    assert z.shape == (500, 4) and w.method == "whitening-k" and not w.invertible
    np.testing.assert_allclose(np.cov(z, rowvar=False), np.eye(4), atol=1e-4)
    assert torch.isnan(w(torch.from_numpy(x))[1]).all()
    with pytest.raises(BertflowError, match="has no inverse"):
        w.inverse(torch.zeros(1, 4))
    with pytest.raises(BertflowError, match="between 1 and the dimension 12"):
        fit_map(x, k=13)


def test_all_but_the_top_removes_the_top_directions(x):
    a = fit_map(x, "abtt", d=2)
    z = a(torch.from_numpy(x))[0].double().numpy()
    top = np.linalg.svd(x - x.mean(0), full_matrices=False)[2][:2]
    assert np.abs(z @ top.T).max() < 1e-3
    assert np.abs(z.mean(0)).max() < 1e-3
    with pytest.raises(BertflowError, match="d=12 must be in"):
        fit_map(x, "abtt", d=12)


def test_a_map_needs_matching_shapes():
    with pytest.raises(BertflowError, match="a \\(dim,\\) mean and a \\(dim, out\\) weight"):
        LinearMap(torch.zeros(3), torch.zeros(4, 2), "whitening-k")
    with pytest.raises(BertflowError, match="unknown linear method"):
        LinearMap(torch.zeros(3), torch.zeros(3, 3), "ica")


# baselines as heads ------------------------------------------------------------------------

@pytest.mark.parametrize("method, options, width", [("whitening", {}, 12),
                                                    ("whitening-k", {"k": 4}, 4),
                                                    ("abtt", {"d": 2}, 12),
                                                    ("identity", {}, 12), ("center", {}, 12),
                                                    ("no-mean-direction", {}, 12),
                                                    ("fractional", {"gamma": 0.25}, 12),
                                                    ("fractional", {"k": 5}, 5),
                                                    ("pca", {"k": 3}, 3)])
def test_linear_heads_transform_as_the_methods_and_survive_a_round_trip(x, tmp_path, method,
                                                                         options, width):
    from bertflow import FlowHead
    from bertflow.evaluation.methods import make_method

    head = FlowHead.fit_linear(x, method, pooling="cls", **options)
    assert (head.method, head.dim, head.out_dim) == (method, 12, width)
    z = head.transform(x)
    np.testing.assert_allclose(z, make_method(method, **options).fit(x).transform(x), atol=1e-3)
    head.save(tmp_path / "h")
    loaded = FlowHead.load(tmp_path / "h")
    assert loaded.method == method and loaded.config() == head.config()
    np.testing.assert_array_equal(loaded.transform(x), z)
    assert loaded.training_info["corpus"]["size"] == 500


def test_a_whitening_head_has_the_gaussian_density_and_the_others_none(x):
    from scipy.stats import multivariate_normal

    from bertflow import FlowHead

    head = FlowHead.fit_linear(x, "whitening")
    mean, cov = covariance(x)
    np.testing.assert_allclose(head.log_prob(x[:5]),
                               multivariate_normal(mean, cov).logpdf(x[:5]), rtol=1e-4)
    np.testing.assert_allclose(np.cov(head.sample(4000, seed=1), rowvar=False), cov,
                               rtol=0.15, atol=0.15 * np.abs(cov).max())
    for method in ("whitening-k", "abtt"):
        projecting = FlowHead.fit_linear(x, method)
        with pytest.raises(BertflowError, match="projects: it has no density"):
            projecting.log_prob(x[:2])
    assert FlowHead.fit_linear(x, "whitening-k").out_dim == 4  # a third of 12
    assert FlowHead.fit_linear(x, "abtt").training_info["out_dim"] == 12


def test_a_linear_head_whose_weights_do_not_fit_its_config_is_refused(x, tmp_path):
    import json

    from bertflow import FlowHead
    from bertflow.storage.artifacts import write_manifest

    folder = FlowHead.fit_linear(x, "whitening-k", k=3).save(tmp_path / "h")
    config = json.loads((folder / "config.json").read_text())
    config["linear"]["out_dim"] = 5
    (folder / "config.json").write_text(json.dumps(config))
    write_manifest(folder, "bertflow-head")
    with pytest.raises(BertflowError, match="does not fit its config"):
        FlowHead.load(folder)


def test_fit_method_from_the_command_line_and_every_export(tmp_path, capsys, corpus_file,
                                                           tiny_encoder_dir):
    import onnxruntime

    from bertflow import FlowHead
    from bertflow.cli.main import main
    from bertflow.export.pipeline import load_pipeline

    def run(*args):
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err

    head = tmp_path / "white"
    code, out, err = run("fit", corpus_file, "--out", head, "--method", "whitening-k", "--dims",
                         "6", "--encoder", tiny_encoder_dir, "--pooling", "mean", "--cache",
                         tmp_path / "cache")
    assert code == 0, err
    assert "whitening-k (k 6), a linear map 16 → 6" in out
    loaded = FlowHead.load(head)
    z = tmp_path / "z.npy"
    assert run("transform", "--head", head, "--sentences", corpus_file, "--out", z)[0] == 0
    assert np.load(z).shape == (120, 6)
    assert run("export", "--head", head, "--format", "onnx", "--out", tmp_path / "w.onnx")[0] == 0
    emb = np.random.default_rng(0).normal(size=(3, 16)).astype(np.float32)
    session = onnxruntime.InferenceSession(str(tmp_path / "w.onnx"))
    np.testing.assert_allclose(session.run(["z"], {"embeddings": emb})[0],
                               loaded.transform(emb), atol=1e-5)
    assert run("export", "--head", head, "--format", "sentence-transformers", "--out",
               tmp_path / "st")[0] == 0
    pipeline = load_pipeline(tmp_path / "st")
    np.testing.assert_allclose(pipeline.encode(["a man plays the guitar"]),
                               loaded.encode(["a man plays the guitar"]), atol=1e-5)
    assert pipeline.get_embedding_dimension() == 6
    assert run("index", corpus_file, "--out", tmp_path / "idx", "--head", head, "--cache",
               tmp_path / "cache")[0] == 0
    code, out, err = run("search", "--index", tmp_path / "idx", "--query", "a dog runs")
    assert code == 0 and re.search(r"^\s+1\s+-?[\d.]+\s+\d+\s", out, re.MULTILINE), err
    code, out, err = run("fit", corpus_file, "--out", tmp_path / "x", "--method", "abtt",
                         "--logdir", tmp_path / "runs", "--encoder", tiny_encoder_dir)
    assert code == 1 and "--logdir apply to --method flow only" in err
    assert run("fit", corpus_file, "--out", tmp_path / "x", "--dims", "3", "--encoder",
               tiny_encoder_dir)[0] == 1


# layout, dtype, defaults, and data whitening cannot take -----------------------------------

@pytest.mark.parametrize("method", ["whitening", "whitening-k", "abtt", "identity", "center",
                                    "no-mean-direction", "fractional", "pca"])
def test_a_fitted_linear_head_holds_its_tensors_as_a_loaded_one(x, tmp_path, method):
    """The tensors of a fitted head are row-major, as those of its reload: both take the same
    BLAS path and compute the same bits on any CPU (an eigensolver gives column-major
    eigenvectors)."""
    from bertflow import FlowHead

    head = FlowHead.fit_linear(x, method)
    loaded = FlowHead.load(head.save(tmp_path / "h"))
    for name, tensor in head.state_dict().items():
        assert tensor.is_contiguous(), name
        assert tensor.stride() == loaded.state_dict()[name].stride(), name
    np.testing.assert_array_equal(loaded.transform(x), head.transform(x))


def test_a_whitening_head_follows_the_dtype_of_its_input(x):
    """A float32 whitening head maps and inverts float64 input; in float64 (`double()`) it
    inverts and samples in float64, to float64 precision."""
    import copy

    from bertflow import FlowHead

    head = FlowHead.fit_linear(x, "whitening")
    x64 = torch.from_numpy(x.astype(np.float64))
    with torch.no_grad():
        z, log_det = head(x64)
        back, _ = head.inverse(z)
    assert z.dtype == log_det.dtype == back.dtype == torch.float64
    np.testing.assert_allclose(back.numpy(), x, atol=1e-3)
    double = copy.deepcopy(head).double()
    with torch.no_grad():
        z, log_det = double(x64)
        back, inverse_log_det = double.inverse(z)
    assert back.dtype == inverse_log_det.dtype == torch.float64
    np.testing.assert_allclose(back.numpy(), x64.numpy(), rtol=0, atol=1e-9)
    assert double.sample(5, seed=1).dtype == np.float64
    np.testing.assert_allclose(double.sample(5, seed=1), head.sample(5, seed=1), rtol=1e-4)


def test_one_default_k_and_d_for_the_methods_and_the_heads():
    """whitening-k keeps `default_k` of the width and abtt removes `default_d`, whether fit as
    a method (`make_method`) or as a head (`FlowHead.fit_linear`)."""
    from bertflow import FlowHead
    from bertflow.evaluation import methods
    from bertflow.heads.linear import default_d, default_k

    rng = np.random.default_rng(0)
    x = (rng.normal(size=(600, 300)) * np.linspace(4, 0.5, 300)).astype(np.float32)
    assert (default_k(384), default_d(384)) == (128, 3)
    white = methods.make_method("whitening-k").fit(x)
    head = FlowHead.fit_linear(x, "whitening-k")
    assert white.transform(x).shape[1] == head.out_dim == default_k(300) == 100
    np.testing.assert_allclose(white.transform(x), head.transform(x), atol=1e-3)
    abtt = methods.make_method("abtt").fit(x)
    head = FlowHead.fit_linear(x, "abtt")
    np.testing.assert_allclose(abtt.transform(x), head.transform(x), atol=1e-3)
    removed = 300 - np.linalg.matrix_rank(abtt.transform(x).astype(np.float64), tol=1e-3)
    assert removed == default_d(300) == 3


def test_whitening_given_k_is_whitening_k_and_options_that_do_not_apply_are_refused(x):
    """`whitening` keeping k components is whitening-k, bit for bit, in heads and methods;
    k with another method than whitening(-k), or d with another than abtt, is refused."""
    from bertflow import FlowHead
    from bertflow.evaluation.methods import make_method

    head = FlowHead.fit_linear(x, "whitening", k=5)
    same = FlowHead.fit_linear(x, "whitening-k", k=5)
    assert head.method == "whitening-k" and head.training_info["method"] == "whitening-k"
    for name, tensor in same.state_dict().items():
        assert torch.equal(head.state_dict()[name], tensor), name
    method = make_method("whitening", k=5)
    assert method.name == "whitening-k" and method.describe() == {"k": 5}
    np.testing.assert_array_equal(method.fit(x).transform(x),
                                  make_method("whitening-k", k=5).fit(x).transform(x))
    for name, options, message in [
            ("abtt", {"k": 3}, "fractional and pca, not to abtt"),
            ("whitening", {"d": 2}, "applies to abtt, not to whitening"),
            ("raw", {"k": 3}, "not to raw"), ("flow", {"d": 1}, "not to flow")]:
        with pytest.raises(BertflowError, match=message):
            make_method(name, **options)
        if name in ("abtt", "whitening"):
            with pytest.raises(BertflowError, match=message):
                FlowHead.fit_linear(x, name, **options)


def test_whitening_refuses_fewer_rows_than_components_kept_plus_one(x):
    from bertflow import FlowHead
    from bertflow.evaluation.methods import make_method

    with pytest.raises(BertflowError, match="to 12 components needs at least 13 rows, got 12"):
        FlowHead.fit_linear(x[:12], "whitening")
    with pytest.raises(BertflowError, match="to 12 components needs at least 13 rows, got 8"):
        make_method("whitening").fit(x[:8])
    with pytest.raises(BertflowError, match="to 5 components needs at least 6 rows, got 5"):
        FlowHead.fit_linear(x[:5], "whitening-k", k=5)
    assert FlowHead.fit_linear(x[:6], "whitening-k", k=5).out_dim == 5
    assert FlowHead.fit_linear(x[:13], "whitening").out_dim == 12


def _dead(x):
    """`x` with a constant feature and a feature that is the sum of two others."""
    x = x.copy()
    x[:, 2] = 1.5
    x[:, 5] = x[:, 0] + x[:, 1]
    return x


def test_directions_without_variance_are_centred_not_blown_up(x):
    """A constant feature and a linear dependency leave two directions without variance: full
    whitening scales them as the largest, so embeddings that move along them stay in range
    and the head stays invertible with a finite density; whitening-k refuses to keep them."""
    from bertflow import FlowHead
    from bertflow.evaluation.methods import make_method

    x = _dead(x)
    moved = x.copy()
    moved[:, 2] += 0.5
    moved[:, 5] += 0.5
    head = FlowHead.fit_linear(x, "whitening")
    z = head.transform(x)
    np.testing.assert_allclose(np.cov(z[:, :10], rowvar=False), np.eye(10), atol=1e-3)
    assert np.abs(head.transform(moved)).max() < 10
    assert np.abs(make_method("whitening").fit(x).transform(moved)).max() < 10
    with torch.no_grad():
        back = head.inverse(torch.from_numpy(z))[0].numpy()
    np.testing.assert_allclose(back, x, atol=1e-3)
    assert np.all(head.log_prob(x[:5]) < 0)
    assert FlowHead.fit_linear(x, "whitening-k", k=10).out_dim == 10
    message = r"2 of 12 components have no variance \(below 1e-07 of the largest's: constant " \
              r"or linearly dependent features\); whitening-k needs k ≤ 10, not 11"
    with pytest.raises(BertflowError, match=message):
        FlowHead.fit_linear(x, "whitening-k", k=11)
    with pytest.raises(BertflowError, match="needs k ≤ 10"):
        make_method("whitening-k", k=11).fit(x)
    with pytest.raises(BertflowError, match="are constant: every row is the same"):
        make_method("whitening").fit(np.ones((20, 3)))
    with pytest.raises(BertflowError, match="do not vary: there is nothing to whiten"):
        fit_map(np.ones((20, 3)))


def test_the_inverse_stays_float64_across_casts_of_the_head():
    """W⁻¹ is kept once, in float64: a map cast to float32 and back inverts as before."""
    x = np.random.default_rng(0).normal(size=(200, 6)) @ np.diag([1, 2, 3, 4, 5, 60])
    linear = fit_map(x.astype(np.float32), "whitening").double()
    z = linear.map(torch.from_numpy(x))
    first = linear.inverse(z)[0]
    second = linear.float().double().inverse(z)[0]
    assert torch.equal(first, second)


# covariance shrinkage: Σ_α = (1 − α)·Σ + α·(tr Σ / n)·I ------------------------------------

def test_no_shrinkage_is_todays_whitening_bit_for_bit(x):
    from bertflow import FlowHead
    from bertflow.heads.linear import whitening_weight

    cov = covariance(x)[1]
    assert np.array_equal(whitening_weight(cov, shrinkage=0.0), whitening_weight(cov))
    assert np.array_equal(whitening_weight(cov, 4, shrinkage=0.0), whitening_weight(cov, 4))
    for options in ({}, {"k": 4}):
        plain, zero = fit_map(x, **options), fit_map(x, **options, shrinkage=0)
        assert torch.equal(plain.weight, zero.weight) and torch.equal(plain.mean, zero.mean)
        head = FlowHead.fit_linear(x, "whitening", **options, shrinkage=0.0)
        same = FlowHead.fit_linear(x, "whitening", **options)
        for name, tensor in same.state_dict().items():
            assert torch.equal(head.state_dict()[name], tensor), name


def test_full_shrinkage_gives_the_cosines_of_centred_embeddings(x):
    from bertflow.evaluation.methods import make_method

    def cosines(v):
        v = v.astype(np.float64) / np.linalg.norm(v, axis=1, keepdims=True)
        return v @ v.T

    z = make_method("whitening", shrinkage=1.0).fit(x).transform(x)
    np.testing.assert_allclose(cosines(z), cosines(x.astype(np.float64) - x.mean(0)), atol=1e-5)


@pytest.mark.parametrize("k", [None, 5])
def test_partial_shrinkage_whitens_the_shrunk_covariance(x, k):
    """W Wᵀ is Σ_α⁻¹ (full) or U_k Λ_k⁻¹ U_kᵀ of Σ_α's top k (whitening-k), as numpy has it."""
    alpha = 0.3
    cov = np.cov(x.astype(np.float64), rowvar=False)
    shrunk = (1 - alpha) * cov + alpha * np.trace(cov) / 12 * np.eye(12)
    values, vectors = np.linalg.eigh(shrunk)
    top = np.argsort(values)[::-1][:k]
    expected = vectors[:, top] @ np.diag(1 / values[top]) @ vectors[:, top].T
    weight = fit_map(x, k=k, shrinkage=alpha).weight.double().numpy()
    np.testing.assert_allclose(weight @ weight.T, expected, rtol=1e-4, atol=1e-8)
    assert not np.allclose(weight @ weight.T, np.linalg.inv(cov), rtol=1e-2)


def test_shrinkage_out_of_range_or_misplaced_is_refused(x):
    from bertflow import FlowHead
    from bertflow.evaluation.methods import make_method

    for alpha in (-0.1, 1.5, float("nan")):
        with pytest.raises(BertflowError, match=r"shrinkage must be in \[0, 1\], got"):
            fit_map(x, shrinkage=alpha)
        with pytest.raises(BertflowError, match=r"shrinkage must be in \[0, 1\]"):
            make_method("whitening-k", shrinkage=alpha)
    for name in ("abtt", "raw", "flow"):
        with pytest.raises(BertflowError,
                           match=f"shrinkage applies to .* and fractional, not to {name}"):
            make_method(name, shrinkage=0.5)
    with pytest.raises(BertflowError, match="not to abtt"):
        FlowHead.fit_linear(x, "abtt", shrinkage=0.5)


def test_a_head_fit_with_shrinkage_records_it_and_reloads(x, tmp_path):
    import json

    from bertflow import FlowHead
    from bertflow.evaluation.methods import make_method

    head = FlowHead.fit_linear(x, "whitening-k", k=4, shrinkage=0.9)
    assert head.training_info["shrinkage"] == 0.9
    assert "shrinkage" not in FlowHead.fit_linear(x, "whitening").training_info
    folder = head.save(tmp_path / "h")
    assert json.loads((folder / "config.json").read_text())["training"]["shrinkage"] == 0.9
    loaded = FlowHead.load(folder)
    assert loaded.training_info["shrinkage"] == 0.9 and loaded.method == "whitening-k"
    np.testing.assert_array_equal(loaded.transform(x), head.transform(x))
    method = make_method("whitening", k=4, shrinkage=0.9)
    assert method.describe() == {"k": 4, "shrinkage": 0.9}
    assert make_method("whitening", shrinkage=0.9).describe() == {"shrinkage": 0.9}
    np.testing.assert_array_equal(method.fit(x).transform(x), head.transform(x))


def test_shrinkage_whitens_fewer_rows_than_dimensions(x):
    """A shrunk covariance is full rank from 2 rows on: 8 rows of 12-d whiten with α > 0 (the
    case shrinkage is for, such as 300 queries of 384-d), and are refused at α = 0."""
    from bertflow import FlowHead

    with pytest.raises(BertflowError, match="needs at least 13 rows, got 8 .*--shrinkage"):
        FlowHead.fit_linear(x[:8], "whitening", shrinkage=0.0)
    for alpha in (0.1, 1.0):
        head = FlowHead.fit_linear(x[:8], "whitening", shrinkage=alpha)
        assert head.out_dim == 12 and np.isfinite(head.transform(x)).all()
        back = head.linear.inverse(head.linear.map(torch.from_numpy(x).double()))[0]
        np.testing.assert_allclose(back.numpy(), x, atol=1e-4)
    assert FlowHead.fit_linear(x[:3], "whitening-k", k=4, shrinkage=0.5).out_dim == 4


def test_shrunk_whitening_k_keeps_the_top_directions_of_the_covariance():
    """At α = 1 the shrunk covariance is a multiple of I: the directions kept are Σ's top k,
    ranked by Σ's variances, for every α (only the eigenvalues are shrunk)."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(500, 12)) * np.array([9, 7, 5, 4] + [0.1] * 8)
    for alpha in (0.0, 0.5, 1.0):
        weight = fit_map(x.astype(np.float32), k=4, shrinkage=alpha).weight.double().numpy()
        kept = weight / np.linalg.norm(weight, axis=0)
        assert np.abs(kept[4:]).max() < 0.05, alpha  # in the first four coordinates
    top = fit_map(x.astype(np.float32), k=4, shrinkage=1.0).weight.double().numpy()
    np.testing.assert_allclose(np.linalg.norm(top, axis=0), np.linalg.norm(top[:, 0]))


def test_info_names_a_linear_heads_options_and_no_training_loss(x, tmp_path, capsys):
    from bertflow import FlowHead
    from bertflow.cli.main import main

    for method, options, says in (("whitening", {"shrinkage": 0.5}, "whitening (shrinkage 0.5)"),
                                  ("whitening-k", {"k": 4}, "whitening-k (k 4)"),
                                  ("abtt", {}, "abtt (d 1)")):
        FlowHead.fit_linear(x, method, **options).save(tmp_path / method)
        assert main(["info", str(tmp_path / method)]) == 0
        out = capsys.readouterr().out
        assert f"method      {says}, a linear map" in out and "val NLL" not in out, out


# the label-free candidates ---------------------------------------------------------------

def test_the_simple_maps_compute_what_they_say(x):
    """The identity leaves the embeddings as they are; centring removes the mean; the mean's
    direction projected out leaves each row with no component along it."""
    from bertflow import FlowHead

    mean = x.astype(np.float64).mean(0)
    unit = mean / np.linalg.norm(mean)
    np.testing.assert_array_equal(FlowHead.fit_linear(x, "identity").transform(x), x)
    np.testing.assert_allclose(FlowHead.fit_linear(x, "center").transform(x), x - mean,
                               atol=1e-4)
    off = FlowHead.fit_linear(x, "no-mean-direction").transform(x).astype(np.float64)
    np.testing.assert_allclose(off, x - np.outer(x @ unit, unit), atol=1e-3)
    assert np.abs(off @ unit).max() < 1e-3 * np.abs(x).max()
    with pytest.raises(BertflowError, match="zero mean: it has no direction"):
        fit_map((x - mean).astype(np.float32), "no-mean-direction")


def test_fractional_whitening_tempers_the_spectrum_and_pca_keeps_it(x):
    """Σ^(−γ/2) leaves the mapped covariance the eigenvalues λ^(1−γ): γ = 1 is whitening to the
    bit, γ = 0 a rotation of the centred rows; PCA to k keeps the top k eigenvalues."""
    values = np.linalg.eigvalsh(covariance(x)[1])[::-1]
    for gamma in (0.0, 0.25, 0.5, 1.0):
        z = fit_map(x, "fractional", gamma=gamma).map(torch.from_numpy(x).double()).numpy()
        np.testing.assert_allclose(np.linalg.eigvalsh(np.cov(z, rowvar=False))[::-1],
                                   values ** (1 - gamma), rtol=1e-3)
    assert torch.equal(fit_map(x, "fractional", gamma=1.0).weight, fit_map(x).weight)
    assert torch.equal(fit_map(x, "fractional", k=4, gamma=1.0).weight, fit_map(x, k=4).weight)
    z = fit_map(x, "pca", k=3).map(torch.from_numpy(x).double()).numpy()
    np.testing.assert_allclose(np.cov(z, rowvar=False), np.diag(values[:3]), rtol=1e-3,
                               atol=1e-4 * values[0])
    for method, options, message in [("fractional", {"gamma": 2.5}, r"gamma must be in \[0, 2\]"),
                                     ("whitening", {"gamma": 0.5}, "gamma .* applies to "
                                      "fractional, not to whitening"),
                                     ("pca", {"k": 13}, "PCA k=13 must be between 1 and"),
                                     ("center", {"k": 2}, "not to center")]:
        with pytest.raises(BertflowError, match=message):
            fit_map(x, method, **options)


@pytest.mark.parametrize("estimator", ["ledoit-wolf", "oas", "likelihood"])
def test_an_estimator_chooses_the_shrinkage_and_the_head_records_it(x, tmp_path, estimator):
    """`shrinkage="ledoit-wolf"` (or "oas") whitens with the α scikit-learn's estimator chooses
    for the embeddings, which the head records with the estimator's name."""
    from sklearn.covariance import OAS, ShrunkCovariance, ledoit_wolf_shrinkage
    from sklearn.model_selection import KFold

    from bertflow import FlowHead
    from bertflow.export.card import summary

    data = x.astype(np.float64)
    if estimator == "likelihood":  # the best of the grid on held-out rows, as by hand
        folds = list(KFold(3, shuffle=True, random_state=0).split(data))
        scores = {a: sum(ShrunkCovariance(shrinkage=a).fit(data[fit]).score(data[held])
                         for fit, held in folds) for a in np.logspace(-4, 0, 25)}
        alpha = max(scores, key=scores.get)
    else:
        alpha = ledoit_wolf_shrinkage(data) if estimator == "ledoit-wolf" else \
            OAS().fit(data).shrinkage_
    assert 0 < alpha < 1
    head = FlowHead.fit_linear(x, "fractional", shrinkage=estimator, gamma=0.5)
    info = head.training_info
    assert info["shrinkage"] == pytest.approx(alpha, rel=1e-9)
    assert info["shrinkage_estimator"] == estimator and info["gamma"] == 0.5
    assert torch.equal(head.linear.weight, fit_map(x, "fractional", shrinkage=info["shrinkage"],
                                                   gamma=0.5).weight)
    assert f"shrinkage_estimator {estimator}" in summary(FlowHead.load(head.save(tmp_path / "h")))
    with pytest.raises(BertflowError, match="shrinkage must be in .* or one of ledoit-wolf, oas"):
        fit_map(x, shrinkage="lw")


def test_fit_makes_every_candidate_from_the_command_line(tmp_path, capsys, corpus_file,
                                                         tiny_encoder_dir):
    """`bertflow fit --method M` for the new maps, with --gamma and an estimator's --shrinkage;
    a misplaced --gamma and an unknown estimator are refused before anything is encoded."""
    from bertflow import FlowHead
    from bertflow.cli.main import main

    base = ["fit", str(corpus_file), "--encoder", str(tiny_encoder_dir), "--cache",
            str(tmp_path / "cache"), "--quiet"]
    for method, options in [("identity", []), ("no-mean-direction", []),
                            ("fractional", ["--gamma", "0.25", "--shrinkage", "oas"]),
                            ("pca", ["--dims", "5"])]:
        out = tmp_path / method
        assert main([*base, "--out", str(out), "--method", method, *options]) == 0
        head = FlowHead.load(out)
        assert head.method == method and head.out_dim == (5 if method == "pca" else head.dim)
    assert FlowHead.load(tmp_path / "fractional").training_info["gamma"] == 0.25
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "x"), "--method", "pca", "--gamma", "1"]) == 1
    assert "--gamma applies to --method fractional" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--out", str(tmp_path / "x"), "--method", "whitening", "--shrinkage", "lw"])
    err = capsys.readouterr().err
    assert "expected α in [0, 1] or one of ledoit-wolf, oas, likelihood, got 'lw'" in err
    assert not (tmp_path / "x").exists()
    spectrum = tmp_path / "spectrum"
    assert main([*base, "--out", str(spectrum), "--method", "fractional", "--gamma",
                 "spectrum"]) == 0
    info = FlowHead.load(spectrum).training_info
    assert info["gamma_estimator"] == "spectrum" and 0 <= info["gamma"] <= 1
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*base, "--out", str(tmp_path / "x"), "--method", "fractional", "--gamma", "knee"])
    assert "expected γ in [0, 2] or one of spectrum, got 'knee'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_gamma_from_the_spectrum_is_the_kept_components_share_of_signal(tmp_path):
    """Five directions of variance 100 over fifteen of noise (variance 1): γ is near 5 × 0.99 / 20
    over all twenty, near 0.99 over the top five, near 0 for noise alone, and the head records
    it beside the estimator's name."""
    from bertflow import FlowHead
    from bertflow.export.card import summary
    from bertflow.heads.linear import spectral_gamma

    rng = np.random.default_rng(0)
    scale = np.r_[[10.0] * 5, [1.0] * 15]
    x = (rng.normal(size=(20_000, 20)) * scale).astype(np.float32)
    assert spectral_gamma(x) == pytest.approx(5 * 0.99 / 20, abs=0.01)
    assert spectral_gamma(x, 5) == pytest.approx(0.99, abs=0.005)
    assert spectral_gamma(rng.normal(size=(20_000, 20))) < 0.01
    values = np.sort(np.linalg.eigvalsh(np.cov(x.T.astype(np.float64))))[::-1]  # by hand
    noise = np.median(values)
    share = np.where(values > noise * (1 + np.sqrt(20 / 20_000)) ** 2, 1 - noise / values, 0)
    assert spectral_gamma(x) == pytest.approx(share.mean(), abs=1e-4)
    head = FlowHead.fit_linear(x, "fractional", gamma="spectrum")
    assert head.training_info["gamma"] == spectral_gamma(x)
    assert head.training_info["gamma_estimator"] == "spectrum"
    assert torch.equal(head.linear.weight, fit_map(x, "fractional", gamma=spectral_gamma(x)).weight)
    assert torch.equal(fit_map(x, "fractional", gamma="spectrum").weight, head.linear.weight)
    assert "gamma_estimator spectrum" in summary(FlowHead.load(head.save(tmp_path / "h")))
    with pytest.raises(BertflowError, match="gamma must be in .* or one of spectrum, got 'knee'"):
        fit_map(x, "fractional", gamma="knee")
