import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from bertflow import BertflowError, EncoderId, FlowConfig, FlowHead, TrainConfig, fit_head
from bertflow.export.card import details
from bertflow.storage.artifacts import write_manifest

from ..conftest import REPO, SENTENCES, swap_after

ENCODER = EncoderId("tiny", "0123456789abcdef")


@pytest.fixture(scope="module")
def head() -> FlowHead:
    x = np.random.default_rng(0).normal(size=(300, 12)).astype(np.float32) * 2 + 1
    return fit_head(
        x, encoder=ENCODER, pooling="cls", max_length=64,
        flow=FlowConfig(levels=2, depth=2), train=TrainConfig(epochs=2, seed=3),
        corpus={"sha256": "ab" * 32},
    )


def test_save_load_round_trip_gives_identical_outputs(head, tmp_path):
    head.save(tmp_path / "head")
    loaded = FlowHead.load(tmp_path / "head")
    x = np.random.default_rng(1).normal(size=(20, 12)).astype(np.float32)
    np.testing.assert_array_equal(loaded.transform(x), head.transform(x))
    assert loaded.encoder == ENCODER and loaded.pooling == "cls" and loaded.max_length == 64
    assert loaded.glow.config == head.glow.config
    for key, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_a_head_replaced_as_it_loads_is_one_version_whole(head, tmp_path, monkeypatch):
    """What is parsed is the bytes the manifest checked: a folder replaced by another head
    between the config's read and the weights' gives the first whole, never the first's config
    over the other's weights."""
    import bertflow.storage.artifacts

    x = np.random.default_rng(2).normal(size=(300, 12)).astype(np.float32)
    other = fit_head(x, encoder=ENCODER, pooling="mean", max_length=64,
                     flow=FlowConfig(levels=2, depth=2), train=TrainConfig(epochs=2, seed=4))
    head.save(tmp_path / "head")
    other.save(tmp_path / "other")
    swapped = swap_after(monkeypatch, bertflow.storage.artifacts, "read_json",
                         tmp_path / "head", tmp_path / "other",
                         when=lambda path, *_: path.name == "config.json")
    loaded = FlowHead.load(tmp_path / "head")
    assert swapped and FlowHead.load(tmp_path / "head").pooling == "mean"
    assert loaded.pooling == "cls"
    np.testing.assert_array_equal(loaded.transform(x[:20]), head.transform(x[:20]))


def test_config_describes_the_head(head, tmp_path):
    head.save(tmp_path / "head")
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["format"] == "bertflow-head" and config["format_version"] == 2
    assert config["dim"] == 12
    assert config["encoder"] == {"name": "tiny", "fingerprint": "0123456789abcdef"}
    assert config["pooling"] == "cls" and config["max_length"] == 64
    assert config["flow"] == {
        "levels": 2, "depth": 2, "coupling": "additive", "hidden": 32, "linear": "reverse",
        "factor_out": "second",
    }
    assert config["standardize"] == {"tensors": ["standardize.mean", "standardize.std"]}
    training = config["training"]
    assert training["corpus"] == {"sha256": "ab" * 32, "size": 300}
    assert training["seed"] == 3 and training["best_epoch"] >= 1
    assert np.isfinite(training["val_nll"])
    assert sorted(p.name for p in (tmp_path / "head").iterdir()) == [
        "config.json", "manifest.json", "model.safetensors"
    ]


def test_reloaded_actnorm_does_not_reinitialise(head, tmp_path):
    head.save(tmp_path / "head")
    loaded = FlowHead.load(tmp_path / "head").train()
    before = {k: v.clone() for k, v in loaded.state_dict().items()}
    loaded(torch.randn(50, 12) * 100)
    for key, value in loaded.state_dict().items():
        assert torch.equal(before[key], value), key


def test_mismatched_embeddings_are_refused_naming_both_sides(head):
    with pytest.raises(BertflowError, match="expects 12-d embeddings .* got 7-d"):
        head.transform(np.zeros((3, 7), np.float32))
    other = EncoderId("bert-base-uncased", "fedcba9876543210")
    with pytest.raises(BertflowError, match="tiny \\[0123.*bert-base-uncased \\[fedc"):
        head.check(encoder=other)
    with pytest.raises(BertflowError, match="fit on cls pooling, but .* mean pooling"):
        head.check(pooling="mean")
    bad = np.ones((4, 12), np.float32)
    bad[2, 5] = np.inf
    with pytest.raises(BertflowError, match="inf values \\(first in row 2\\)"):
        head.transform(bad)


def test_head_encode_refuses_another_encoder(tmp_path, tiny_encoder, tiny_encoder_dir,
                                             other_encoder_dir, wide_encoder_dir):
    x = tiny_encoder.encode(SENTENCES * 5, "mean")
    head = fit_head(x, encoder=tiny_encoder.id, pooling="mean",
                        flow=FlowConfig(levels=1, depth=2), train=TrainConfig(epochs=1))
    z = head.encode(SENTENCES, tiny_encoder)
    np.testing.assert_allclose(z, head.transform(tiny_encoder.encode(SENTENCES, "mean")), atol=1e-6)
    with pytest.raises(BertflowError, match="from encoder .* but these come from encoder"):
        head.encode(SENTENCES, other_encoder_dir)
    copy = shutil.copytree(tiny_encoder_dir, tmp_path / "copy-of-tiny")
    np.testing.assert_allclose(head.encode(SENTENCES, copy), z, atol=1e-6)  # same weights
    with pytest.raises(BertflowError, match="expects 16-d .* got 24-d"):
        head.encode(SENTENCES, wide_encoder_dir)


def corrupt(path, how):
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[-5] ^= 0x01
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_altered_weights_are_refused(head, tmp_path, how):
    head.save(tmp_path / "head")
    corrupt(tmp_path / "head" / "model.safetensors", how)
    with pytest.raises(BertflowError, match="altered or truncated"):
        FlowHead.load(tmp_path / "head")


def rewrite(folder, name, text):
    """Edit a file of a head and re-sign the manifest, to reach the checks behind it."""
    (folder / name).write_text(text)
    write_manifest(folder, "bertflow-head")


def test_malformed_configs_are_refused(head, tmp_path):
    folder = tmp_path / "head"
    head.save(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    rewrite(folder, "config.json", "{not json")
    with pytest.raises(BertflowError, match="not valid JSON"):
        FlowHead.load(folder)
    for version in (1, 99):
        rewrite(folder, "config.json", json.dumps({**config, "format_version": version}))
        with pytest.raises(BertflowError, match=f"head format version {version}; this "
                                                "bertflow reads version 2"):
            FlowHead.load(folder)
    rewrite(folder, "config.json", json.dumps({**config, "dim": 13}))
    with pytest.raises(BertflowError, match=r"does not fit its config: size mismatch .*"
                                            r"torch.Size\(\[12\]\) from checkpoint.*\[13\]"):
        FlowHead.load(folder)
    for field, value in [("weights", "model.safetensors"), ("weights", {"file": 3}),
                         ("weights", {"file": "../../x", "sha256": "0"}), ("training", [1]),
                         ("flow", {"levels": "many"}), ("flow", {"hidden": 32.5}),
                         ("flow", {k: v for k, v in config["flow"].items() if k != "factor_out"}),
                         ("dim", None), ("dim", config["dim"] + 0.5), ("encoder", "bert"),
                         ("max_length", "abc"),
                         ("pooling", "max")]:
        rewrite(folder, "config.json", json.dumps({**config, field: value}))
        with pytest.raises(BertflowError, match="malformed|is not"):
            FlowHead.load(folder)
    with pytest.raises(BertflowError, match="no flow head folder"):
        FlowHead.load(tmp_path / "missing")


def test_missing_fields_and_bad_out_dim_are_malformed(head, tmp_path):
    """One line naming the config, never a bare KeyError or torch's RuntimeError."""
    folder = tmp_path / "head"
    head.save(folder)
    config = json.loads((folder / "config.json").read_text())
    for field in ("standardize", "linear"):
        rewrite(folder, "config.json", json.dumps({k: v for k, v in config.items() if k != field}))
        with pytest.raises(BertflowError, match=r"config.json is malformed \(KeyError"):
            FlowHead.load(folder)
    linear = tmp_path / "linear"
    FlowHead.fit_linear(np.random.default_rng(0).normal(size=(40, 12)), "whitening-k",
                        k=4).save(linear)
    config = json.loads((linear / "config.json").read_text())
    for out_dim in (-3, 0, 13, 4.5):
        rewrite(linear, "config.json",
                json.dumps({**config, "linear": {**config["linear"], "out_dim": out_dim}}))
        with pytest.raises(BertflowError, match=r"config.json is malformed \(ValueError"):
            FlowHead.load(linear)


def test_weights_that_are_not_safetensors_are_refused(head, tmp_path):
    """A pickle in place of the weights is never unpickled, even with a matching checksum."""
    folder = tmp_path / "head"
    head.save(folder)
    weights = folder / "model.safetensors"
    torch.save(head.state_dict(), weights)
    config = json.loads((folder / "config.json").read_text())
    config["weights"]["sha256"] = __import__("hashlib").sha256(weights.read_bytes()).hexdigest()
    rewrite(folder, "config.json", json.dumps(config))
    with pytest.raises(BertflowError, match="not a valid safetensors file"):
        FlowHead.load(folder)


def test_failed_save_leaves_the_previous_head_intact(head, tmp_path, monkeypatch):
    folder = tmp_path / "head"
    head.save(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("bertflow.heads.format.write_json", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        head.save(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["head"]  # no temporary folder left


def test_killed_save_leaves_the_previous_head_intact(head, tmp_path):
    folder = tmp_path / "head"
    head.save(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        import bertflow.storage.files as files
        from bertflow import FlowHead, fit_head
        head = FlowHead.load({str(folder)!r})
        def die(*args):
            os.kill(os.getpid(), signal.SIGKILL)
        files._replace_directory = die  # the process dies just before the swap
        head.save({str(folder)!r})
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert done.returncode == -9
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    FlowHead.load(folder)


def test_save_replaces_an_older_head_but_not_another_folder(head, tmp_path):
    folder = tmp_path / "head"
    head.save(folder)
    head.save(folder)
    assert FlowHead.load(folder).dim == 12
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    (precious / "config.json").write_text('{"model_type": "bert"}')  # e.g. an encoder folder
    with pytest.raises(BertflowError, match="not a flow head"):
        head.save(precious)
    assert (precious / "notes.txt").read_text() == "keep me"


def test_log_prob_includes_the_standardisation_jacobian(head):
    x = torch.randn(6, 12, dtype=torch.float64)
    h = head.double()
    try:
        for row, value in zip(x, h.log_prob(x), strict=True):
            jac = torch.autograd.functional.jacobian(lambda v: h(v[None])[0][0], row)
            z = h(row[None])[0][0]
            expected = (-0.5 * z @ z - 6 * np.log(2 * np.pi) + torch.linalg.slogdet(jac)[1])
            assert torch.allclose(value, expected, atol=1e-8)
    finally:
        head.float()


def test_samples_come_back_in_embedding_space(head):
    x = np.random.default_rng(0).normal(size=(300, 12)) * 2 + 1  # the fixture's training data
    s = head.sample(2000, seed=1)
    assert s.shape == (2000, 12)
    assert np.abs(s.mean(0) - x.mean(0)).max() < 0.3  # its own means are 0.24 off 1
    assert np.abs(s.std(0) - x.std(0)).max() < 0.3


def test_log_prob_of_arrays_is_checked_and_matches_tensors(head):
    x = np.random.default_rng(2).normal(size=(5, 12)).astype(np.float32)
    got = head.log_prob(x)
    assert isinstance(got, np.ndarray) and got.shape == (5,)
    np.testing.assert_allclose(got, head.log_prob(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-6)
    with pytest.raises(BertflowError, match="12-d"):
        head.log_prob(np.zeros((2, 7), np.float32))
    with pytest.raises(BertflowError, match="inf values"):
        head.log_prob(np.full((1, 12), np.inf, np.float32))


def test_a_file_is_fit_a_block_at_a_time_to_the_in_memory_head(tmp_path, monkeypatch):
    """Fitting from an EmbeddingFile reads minibatches from disk and never the whole array,
    and gives the head an in-memory fit gives, bit for bit (noise included)."""
    from bertflow.embeddings.file import EmbeddingFile

    x = np.random.default_rng(5).normal(size=(500, 12)).astype(np.float32) * 3 - 2
    x[:, 4] = 7.0  # a dead feature
    np.save(tmp_path / "x.npy", x)
    file = EmbeddingFile(tmp_path / "x.npy")
    sizes = []

    def counted(method):
        def read(self, *args):
            rows = method(self, *args)
            sizes.append(len(rows))
            return rows
        return read

    monkeypatch.setattr(EmbeddingFile, "read", counted(EmbeddingFile.read))
    monkeypatch.setattr(EmbeddingFile, "take", counted(EmbeddingFile.take))
    monkeypatch.setattr(EmbeddingFile, "load", lambda self: pytest.fail("loaded whole"))
    train = TrainConfig(epochs=3, seed=2, noise=0.01, batch_size=32, init_size=100)
    flow = FlowConfig(levels=2, depth=2, linear="lu")
    streamed = fit_head(file, flow=flow, train=train)
    in_memory = fit_head(x, flow=flow, train=train)
    for key, value in in_memory.state_dict().items():
        assert torch.equal(streamed.state_dict()[key], value), key
    assert streamed.training_info == in_memory.training_info
    assert streamed.history.epochs[-1]["val_nll"] == in_memory.history.epochs[-1]["val_nll"]
    # whole-table reads: the statistics pass (and the noise scale); the rest are minibatches,
    # the ActNorm initialisation and the held-out rows
    assert sorted(sizes)[-3:] == [100, 500, 500]
    np.testing.assert_allclose(streamed.standardize.mean, x.mean(0), rtol=1e-6)
    np.testing.assert_allclose(streamed.standardize.std[[0, 1, 2, 3, 5]],
                               x.std(0, ddof=1)[[0, 1, 2, 3, 5]], rtol=1e-5)
    assert streamed.standardize.std[4] == 1.0


def test_a_head_describes_itself_in_rows():
    from bertflow.config import nll_text
    from bertflow.export.card import details, tagline

    x = np.random.default_rng(0).normal(size=(60, 8)).astype(np.float32)
    head = fit_head(x, pooling="cls", flow=FlowConfig(levels=1, depth=2),
                        train=TrainConfig(epochs=1), corpus={"file": "c.txt", "sha256": "ab" * 32})
    rows = dict(details(head))
    assert list(rows)[:3] == ["dim", "encoder", "pooling"] and rows["dim"] == "8"
    assert rows["corpus"] == f"c.txt: 60 rows, sha256 {'ab' * 8}"
    assert rows["before"] == "standardisation" and rows["epochs"] == "best 1 of 1"
    assert rows["val NLL"] == nll_text(head.training_info)
    assert tagline(head) == "?, cls pooling, 8-d, fit on 60 sentences"
    assert nll_text({"val_nll": 1.5, "val_bits_per_dim": 0.25}) == "1.500 nats (0.2500 bits/dim)"
    assert nll_text({"val_nll": None}) is None
    linear = dict(details(FlowHead.fit_linear(x, "whitening-k", k=3)))
    assert linear["dim"] == "8 → 3" and "val NLL" not in linear  # fit in closed form
    assert linear["method"] == "whitening-k (k 3), a linear map 8 → 3"
    assert linear["corpus"].startswith("60 rows, sha256 ") and "?" not in linear["corpus"]


def test_what_comes_before_the_flow_is_one_argument():
    """`before` picks standardisation, whitening or nothing; anything else is refused."""
    x = np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32) * 4 + 1
    options = {"flow": FlowConfig(levels=1, depth=2), "train": TrainConfig(epochs=1, lr=1e-12)}
    bare = fit_head(x, before="none", **options)
    assert bare.standardize is None and bare.linear is None and bare.before is None
    assert fit_head(x, **options).standardize is not None
    with pytest.raises(BertflowError, match="one of standardize, whiten, none, not 'white'"):
        fit_head(x, before="white", **options)
    with pytest.raises(TypeError):
        fit_head(x, standardize=False, **options)


def test_a_head_whitened_before_its_flow_round_trips_and_has_a_density(tmp_path):
    """`before="whiten"`: the training rows' full whitening, then a Glow; the flow starts at the
    identity, so an unfit-looking head whitens exactly, and it saves, loads and inverts."""
    rng = np.random.default_rng(0)
    mix = rng.normal(size=(8, 8))
    x = (rng.normal(size=(400, 8)) @ mix + 3).astype(np.float32)
    head = fit_head(x, flow=FlowConfig(levels=2, depth=2),
                        train=TrainConfig(epochs=1, lr=1e-12), before="whiten")
    assert head.method == "flow" and head.standardize is None and head.linear.invertible
    z = head.transform(x)
    np.testing.assert_allclose(np.cov(z, rowvar=False), np.eye(8), atol=0.05)
    folder = head.save(tmp_path / "white")
    assert json.loads((folder / "config.json").read_text())["linear"] is not None
    loaded = FlowHead.load(folder)
    np.testing.assert_array_equal(loaded.transform(x[:5]), z[:5])
    with torch.no_grad():
        back = loaded.inverse(torch.from_numpy(z[:5]))[0].numpy()
    np.testing.assert_allclose(back, x[:5], atol=1e-3)
    np.testing.assert_array_equal(loaded.log_prob(x[:5]), head.log_prob(x[:5]))
    assert np.isfinite(loaded.log_prob(x[:5])).all()
    assert dict(details(loaded))["before"] == "whitening"
    (folder / "config.json").write_text(json.dumps(
        {**json.loads((folder / "config.json").read_text()), "linear": None}))
    write_manifest(folder, "bertflow-head")
    with pytest.raises(BertflowError, match="does not fit its config: Unexpected key.*linear"):
        FlowHead.load(folder)


def test_a_flow_after_a_projection_is_refused(head):
    from bertflow.heads.linear import LinearMap

    projection = LinearMap(torch.zeros(12), torch.eye(12)[:, :4], "whitening-k")
    with pytest.raises(BertflowError, match="at full width, not whitening-k"):
        FlowHead(head.glow, linear=projection)


def test_a_flow_after_fractional_whitening_saves_and_reloads_bit_for_bit(tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(600, 8)) @ rng.normal(size=(8, 8))).astype(np.float32)
    fractional = FlowHead.fit_linear(x, "fractional", gamma=0.25).linear
    head = fit_head(x, before=fractional, flow=FlowConfig(levels=2, depth=2),
                    train=TrainConfig(epochs=1))
    assert head.method == "flow" and head.linear is fractional and head.standardize is None
    loaded = FlowHead.load(head.save(tmp_path / "head"))
    assert loaded.config()["linear"]["method"] == "fractional"
    np.testing.assert_array_equal(loaded.transform(x[:50]), head.transform(x[:50]))
    assert np.isfinite(loaded.log_prob(x[:5])).all()


def _whitened(x: np.ndarray, **train) -> FlowHead:
    return fit_head(x, flow=FlowConfig(levels=2, depth=2),
                        train=TrainConfig(**{"epochs": 1, "lr": 1e-12, **train}),
                        before="whiten")


def test_a_head_whitened_before_its_flow_holds_its_tensors_as_a_loaded_one(tmp_path):
    """Row-major, as a reload: the fitted and the loaded head compute the same bits on any
    CPU."""
    x = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32) @ np.diag(
        np.linspace(3, 0.5, 8)).astype(np.float32)
    head = _whitened(x)
    loaded = FlowHead.load(head.save(tmp_path / "white"))
    for name, tensor in head.state_dict().items():
        assert tensor.is_contiguous(), name
        assert tensor.stride() == loaded.state_dict()[name].stride(), name


def test_a_whitened_flow_head_in_float64_inverts_and_samples_in_float64():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(300, 8)) @ rng.normal(size=(8, 8)) + 3).astype(np.float32)
    head = _whitened(x).double()
    x64 = torch.from_numpy(x[:5].astype(np.float64))
    with torch.no_grad():
        z, log_det = head(x64)
        back, inverse_log_det = head.inverse(z)
    assert back.dtype == inverse_log_det.dtype == torch.float64
    np.testing.assert_allclose(back.numpy(), x64.numpy(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(inverse_log_det.numpy(), -log_det.numpy(), rtol=1e-6)
    sample = head.sample(4, seed=2)
    assert sample.dtype == np.float64 and np.isfinite(sample).all()


def test_whitening_before_a_flow_centres_directions_without_variance_and_needs_rows(
        monkeypatch):
    """A constant feature and a linear dependency: the whitening before the flow leaves their
    directions in range (embeddings that move along them are not blown up); fewer rows than
    dimensions plus one are refused before any training."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(300, 8)) @ rng.normal(size=(8, 8)) + 3).astype(np.float32)
    x[:, 2] = 1.5
    x[:, 5] = x[:, 0] + x[:, 1]
    head = _whitened(x, epochs=2, lr=1e-3)
    moved = x.copy()
    moved[:, 2] += 0.5
    moved[:, 5] += 0.5
    assert np.abs(head.transform(moved)).max() < 20
    assert np.isfinite(head.log_prob(moved)).all()
    monkeypatch.setattr("bertflow.training.trainer.fit", lambda *a, **k: pytest.fail("it trained"))
    with pytest.raises(BertflowError, match="to 8 components needs at least 9 rows, got 8"):
        fit_head(x[:8], before="whiten")


def test_weights_of_another_dtype_are_refused(head, tmp_path):
    from safetensors.torch import load_file, save

    folder = head.save(tmp_path / "head")
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").write_bytes(save(
        {k: v.double() if v.is_floating_point() else v for k, v in tensors.items()}))
    write_manifest(folder, "bertflow-head")
    with pytest.raises(BertflowError, match="does not fit its config: it holds tensors of type "
                                            "torch.float64"):
        FlowHead.load(folder)


def test_the_head_class_keeps_its_first_name_and_its_format_lives_apart():
    """`Head` is the class of every head; `FlowHead` names the same class; the folder format
    is `bertflow.heads.format`, which the class's save and load go through."""
    import bertflow
    from bertflow.heads import format as head_format
    from bertflow.heads.head import FlowHead, Head

    assert bertflow.Head is bertflow.FlowHead is Head is FlowHead
    assert {"save_head", "load_head", "head_config"} <= set(head_format.__all__)
    head = head_format.load_head("minilm-first_last-wiki")
    assert isinstance(head, Head) and head.config() == head_format.head_config(head)
