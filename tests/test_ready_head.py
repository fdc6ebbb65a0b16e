"""The ready head that comes with bertflow transforms, samples and scores as it did when it was
pinned: its outputs on fixed inputs are compared bit for bit, so that a change to the head's
code or file format that moves a single bit shows here."""

import hashlib

import numpy as np
import pytest
import torch

from bertflow import FlowHead
from bertflow.cli import main

from .conftest import REPO, data_dir

HEAD = REPO / "checkpoints" / "minilm-first_last-wiki"

# sha256 of the float32 bytes of each output, taken on this head as shipped
PINNED = {
    "transform": "266665459da6d9f26de0a85d9375d8679bf6d07a05ede9e082cfc505bd49e55d",
    "log_prob": "9cddc222707ed029d941efa5da6e5b96d91b7847bf37829dc435fd14f342909a",
    "inverse": "d2e7180cb43be1a43fa5ebfbe5b726a5564d5f83ca99c141c872e198e175ef14",
}


def inputs(head: FlowHead) -> np.ndarray:
    """Rows spread like the embeddings the head was fit on: its standardisation's mean and
    spread, with seeded Gaussian noise."""
    state = head.state_dict()
    mean, std = state["standardize.mean"].numpy(), state["standardize.std"].numpy()
    noise = np.random.default_rng(0).standard_normal((64, head.dim)).astype(np.float32)
    return (mean + std * noise).astype(np.float32)


def outputs(head: FlowHead) -> dict[str, np.ndarray]:
    x = inputs(head)
    z = head.transform(x)
    with torch.no_grad():
        back = head.inverse(torch.from_numpy(z))[0].numpy()
    return {"transform": z, "log_prob": np.asarray(head.log_prob(x), dtype=np.float32),
            "inverse": back}


def digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array, dtype=np.float32).tobytes()).hexdigest()


def test_the_ready_head_computes_the_pinned_bits():
    head = FlowHead.load(HEAD)
    assert {name: digest(value) for name, value in outputs(head).items()} == PINNED


@pytest.mark.integration
def test_the_ready_head_is_rebuilt_by_its_command(tmp_path):
    """The command that made the ready head, the first_last recipe on the Wikipedia sample with
    seed 0, gives its files byte for byte (about 3 CPU minutes: it encodes 11,913 sentences)."""
    corpus = data_dir() / "unlabeled" / "wiki-sample.txt"
    if not corpus.is_file():
        pytest.skip(f"no {corpus}")
    out = tmp_path / "head"
    assert main(["fit", str(corpus), "--out", str(out), "--seed", "0",
                 "--cache", str(tmp_path / "cache"), "--quiet"]) == 0
    for name in ("config.json", "model.safetensors", "manifest.json"):
        assert (out / name).read_bytes() == (HEAD / name).read_bytes(), name
