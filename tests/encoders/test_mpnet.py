"""MPNet, the second architecture: its relative position bias on the fused path, every pooling,
and the real all-mpnet-base-v2 (`make mpnet` fetches it; those tests skip without it)."""

import json
import socket
import subprocess
import sys

import numpy as np
import pytest

from bertflow import FlowHead, default_encoder_path, load_encoder, sts
from bertflow.cli.main import main
from bertflow.constants import POOLINGS
from bertflow.errors import BertflowError

from ..conftest import SENTENCES, data_dir, mpnet_dir
from .test_encoder import hand_pooled


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def sentence_transformers_mean(folder, sentences) -> np.ndarray:
    """sentence-transformers' own mean pooling of the model in `folder` (its own modules, else
    mean pooling of a plain transformer), max length 128, unit vectors."""
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(folder), device="cpu")
    model.max_seq_length = 128
    return model.encode(sentences, batch_size=32, normalize_embeddings=True)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_a_tiny_mpnet_runs_fused_and_pools_as_by_hand(tiny_mpnet_dir, pooling):
    encoder = load_encoder(tiny_mpnet_dir, device="cpu")
    assert encoder.fused is not None and encoder.fused.position_bias is not None
    got = encoder.encode(SENTENCES, pooling, batch_size=3)
    for row, sentence in zip(got, SENTENCES, strict=True):
        np.testing.assert_allclose(row, hand_pooled(encoder, sentence, pooling), atol=1e-5)


def test_a_tiny_mpnets_mean_pooling_is_sentence_transformers(tiny_mpnet_dir):
    ours = load_encoder(tiny_mpnet_dir, device="cpu").encode(SENTENCES, "mean", batch_size=3)
    assert np.abs(unit(ours) - sentence_transformers_mean(tiny_mpnet_dir, SENTENCES)).max() <= 1e-5


def real_mpnet():
    folder = mpnet_dir()
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"all-mpnet-base-v2 is not at {folder}: `make mpnet` fetches it "
                    "(or set BERTFLOW_MPNET to its folder)")
    return folder


@pytest.fixture(scope="module")
def real_sentences() -> list[str]:
    folder = data_dir() / "STSBenchmark"
    if not folder.is_dir():
        pytest.skip(f"no STS-B at {folder}")
    return sts.read_stsb(folder, "dev").sentences()[:200]


@pytest.mark.integration
def test_all_mpnet_base_v2_is_fused_and_equals_sentence_transformers(real_sentences):
    folder = real_mpnet()
    encoder = load_encoder(folder, device="cpu")
    assert encoder.fused is not None and encoder.dim == 768 and encoder.num_layers == 12
    every = encoder.encode(real_sentences, list(POOLINGS))
    assert all(x.shape == (200, 768) and np.isfinite(x).all() for x in every.values())
    reference = sentence_transformers_mean(folder, real_sentences)
    assert np.abs(unit(every["mean"]) - reference).max() <= 1e-5


@pytest.mark.integration
def test_a_head_fit_on_mpnet_records_it_and_refuses_minilm(real_sentences, tmp_path, capsys):
    folder = real_mpnet()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(real_sentences) + "\n", encoding="utf-8")
    head = tmp_path / "head"
    assert main(["fit", str(corpus), "--encoder", str(folder), "--pooling", "mean",
                 "--method", "abtt", "--out", str(head), "--cache", str(tmp_path / "cache")]) == 0
    loaded = FlowHead.load(head)
    assert loaded.encoder.name == "all-mpnet-base-v2" and loaded.dim == 768
    assert loaded.encoder == load_encoder(folder, device="cpu").id
    record = json.loads((head / "config.json").read_text())
    assert record["encoder"]["fingerprint"] == loaded.encoder.fingerprint
    with pytest.raises(BertflowError, match="encoder"):
        loaded.settings(load_encoder(device="cpu"))
    capsys.readouterr()
    assert main(["transform", "--head", str(head), "--sentences", str(corpus),
                 "--out", str(tmp_path / "z.npy"), "--encoder", str(default_encoder_path())]) != 0
    assert "head" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.xdist_group("torchrun")
def test_two_processes_encode_with_mpnet_bit_for_bit(real_sentences, tmp_path):
    """A 2-process torchrun encode equals one process's, byte for byte."""
    folder = real_mpnet()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(real_sentences[:64]) + "\n", encoding="utf-8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    command = ["-m", "bertflow", "encode", str(corpus), "--encoder", str(folder), "--pooling",
               "first_last", "--no-cache", "--out"]
    one = subprocess.run([sys.executable, *command, str(tmp_path / "one.npy")],
                         capture_output=True, text=True)
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", port, *command, str(tmp_path / "two.npy")],
                         capture_output=True, text=True)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr + two.stderr)[-3000:]
    assert (tmp_path / "two.npy").read_bytes() == (tmp_path / "one.npy").read_bytes()
