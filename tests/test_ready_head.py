"""The ready head that comes with bertflow transforms, samples and scores as it did when it was
pinned: its outputs on fixed inputs are compared bit for bit, so that a change to the head's
code or file format that moves a single bit shows here."""

import hashlib
import json
import os

import numpy as np
import pytest
import torch

from bertflow import FlowHead
from bertflow.cli import main

from .conftest import REPO, data_dir

HEAD = REPO / "checkpoints" / "minilm-first_last-wiki"

# sha256 of the float32 bytes of each output, taken on this head as shipped
PINNED = {
    "transform": "6ea1af5c29f00ee9bcc213e4d1266d3f9805ac2bbcdf0f9ba7c73f3ef3f5f494",
    "log_prob": "fcf4231f2dd2cd770619d76d1f839dddffb2bf57f56d78f86dc36e4ed8449bf8",
    "inverse": "407794b38fa50e7353d56170fc35182826282e16a14cdcda47a21d8de613c1c8",
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
@pytest.mark.skipif(os.environ.get("BERTFLOW_SLOW") != "1",
                    reason="encodes the Wikipedia sample (about 5 CPU minutes); "
                           "BERTFLOW_SLOW=1 runs it")
def test_the_ready_head_is_rebuilt_by_its_command(tmp_path):
    """The command that made the ready head: the first_last recipe with the release's learning
    rate, on the Wikipedia sample, seed 0. It gives the head's configuration and its transform
    up to float rounding: the head was made on another machine, and the weights of a fit are
    bit-equal from run to run on one machine, not across machines."""
    corpus = data_dir() / "unlabeled" / "wiki-sample.txt"
    if not corpus.is_file():
        pytest.skip(f"no {corpus}")
    out = tmp_path / "head"
    assert main(["fit", str(corpus), "--out", str(out), "--seed", "0", "--lr", "1e-3",
                 "--cache", str(tmp_path / "cache"), "--quiet"]) == 0
    configs = [json.loads((folder / "config.json").read_text()) for folder in (HEAD, out)]
    for config in configs:  # what float rounding moves
        del config["weights"]
        for key in ("train_nll", "val_nll", "val_bits_per_dim"):
            del config["training"][key]
    assert configs[0] == configs[1]
    shipped, made = FlowHead.load(HEAD), FlowHead.load(out)
    x = inputs(shipped)
    np.testing.assert_allclose(made.transform(x), shipped.transform(x), atol=1e-3)
