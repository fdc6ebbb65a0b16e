"""The ready head that comes with bertflow transforms, samples and scores as it did when it was
shipped. On any CPU its outputs on fixed inputs match reference values to within float32
rounding; on a CPU whose outputs were pinned they are compared bit for bit, so that a change to
the head's code or file format that moves a single bit shows there. (Matrix products round
differently on different CPUs, so bits are a property of the CPU as well as of the head.)"""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertflow import FlowHead
from bertflow.cli.main import main

from ..conftest import REPO, data_dir

HEAD = REPO / "checkpoints" / "minilm-first_last-wiki"
# the first rows of `outputs(head)` on the head as shipped, the reference on any CPU
REFERENCE = Path(__file__).with_name("ready_head_outputs.npz")
SHIPPED_ON = "AMD EPYC"  # the CPU the head was fit on: its command rebuilds it byte for byte there

# sha256 of the float32 bytes of each output, by CPU (its "model name") and torch version
PINNED = {
    ("AMD EPYC", "2.13.0+cpu"): {
        "transform": "e04438176b7d16c9502f3ab3ef9c849ca31cf1e7e3743e32117af699f41a92cd",
        "log_prob": "21a1c77edfc999f257f80b974b04f503b3c9f000fc5e98a9ef9494049ac12a75",
        "inverse": "e59d31a907b4b66a2579f323c98158a903c27691e46b53d33a55b811decbeb2d",
    },
}


def cpu() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                "unknown")


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


def assert_close_to(reference: dict[str, np.ndarray], got: dict[str, np.ndarray], tol: float):
    for name, expected in reference.items():
        np.testing.assert_allclose(got[name][: len(expected)], expected, rtol=tol, atol=tol,
                                   err_msg=name)


def test_the_ready_head_computes_its_reference_outputs_on_any_cpu():
    with np.load(REFERENCE, allow_pickle=False) as saved:
        reference = {name: saved[name] for name in saved.files}
    assert set(reference) == {"transform", "log_prob", "inverse"}
    assert_close_to(reference, outputs(FlowHead.load(HEAD)), 1e-5)


def test_the_ready_head_computes_the_pinned_bits():
    pins = PINNED.get((cpu(), torch.__version__))
    if pins is None:
        pytest.skip(f"no pinned bits for {cpu()!r} with torch {torch.__version__}: "
                    "the reference-value test covers this CPU")
    assert {name: digest(value) for name, value in outputs(FlowHead.load(HEAD)).items()} == pins


@pytest.mark.integration
def test_the_ready_head_is_rebuilt_by_its_command(tmp_path):
    """The command that made the ready head, the first_last recipe on the Wikipedia sample with
    seed 0, gives its files byte for byte on the CPU it was fit on; on another CPU, the same
    configuration, losses and outputs to within rounding (about 3 CPU minutes: it encodes 11,913
    sentences)."""
    corpus = data_dir() / "unlabeled" / "wiki-sample.txt"
    if not corpus.is_file():
        pytest.skip(f"no {corpus}")
    out = tmp_path / "head"
    assert main(["fit", str(corpus), "--out", str(out), "--seed", "0", "--pooling",
                 "first_last", "--max-length", "128", "--cache", str(tmp_path / "cache"),
                 "--quiet"]) == 0
    if cpu() == SHIPPED_ON:
        for name in ("config.json", "model.safetensors", "manifest.json"):
            assert (out / name).read_bytes() == (HEAD / name).read_bytes(), name
        return
    rebuilt, shipped = (json.loads((path / "config.json").read_text()) for path in (out, HEAD))
    for name in ("train_nll", "val_nll", "val_bits_per_dim"):
        assert rebuilt["training"].pop(name) == pytest.approx(shipped["training"].pop(name),
                                                              rel=1e-5), name
    del rebuilt["weights"]["sha256"], shipped["weights"]["sha256"]
    assert rebuilt == shipped
    assert_close_to(outputs(FlowHead.load(HEAD)), outputs(FlowHead.load(out)), 1e-4)
