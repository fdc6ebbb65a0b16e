"""encode, fit and index across 2 processes started by PyTorch's own launcher (torchrun),
on the CPU with gloo, against the same commands in one process."""

import json
import os
import random
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from bertflow import FlowHead
from bertflow.training.trainer import split_indices

from ..conftest import WORDS, make_tiny_encoder

# one worker runs them in turn: two torchrun jobs at once would share the machine's cores
pytestmark = pytest.mark.xdist_group("torchrun")

def free_port() -> str:
    """A port no process listens on now, chosen by the system (not by a seeded draw)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


# Chunks of 16 sentences so that a few hundred make many; a crash can be injected on one rank.
SCRIPT = """
import os, sys
import bertflow.encoders.encoder, bertflow.embeddings.writer
bertflow.encoders.encoder.CHUNK_SIZE = bertflow.embeddings.writer.CHUNK_SIZE = 16
crash = os.environ.get("CRASH_RANK_AFTER")
if crash and os.environ.get("RANK") == crash.split(":")[0]:
    real, calls = bertflow.encoders.encoder.Encoder.encode_chunk, []
    def encode_chunk(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > int(crash.split(":")[1]):
            os._exit(9)
        return real(self, *args, **kwargs)
    bertflow.encoders.encoder.Encoder.encode_chunk = encode_chunk
from bertflow.cli.main import main
sys.exit(main(sys.argv[1:]))
"""

# A fit through the library, with jitter and a writer that keeps every scalar: minibatches
# whose last has one row, then minibatches of one row (rank 1's share is always empty).
FIT_SCRIPT = """
import sys
import numpy as np, torch
from bertflow.runtime import distributed
from bertflow.config import FlowConfig, TrainConfig
from bertflow.heads.flow import Glow
from bertflow.training.tensorboard import TensorBoard
from bertflow.training.trainer import fit

class Writer:
    def __init__(self):
        self.scalars = {}
    def add_scalar(self, tag, value, step):
        if tag != "train/rows_per_second":  # a timing
            self.scalars[tag, step] = float(value)
    def add_histogram(self, tag, values, step):
        pass

distributed.join("cpu")
results = []
for rows, batch in ((40, 7), (12, 1)):  # 36 and 11 training rows
    x = np.random.default_rng(rows).normal(size=(rows, 8)).astype(np.float32)
    torch.manual_seed(0)
    flow, writer = Glow(8, FlowConfig(levels=2, coupling="affine")), Writer()
    config = TrainConfig(epochs=2, batch_size=batch, noise=0.1, max_grad_norm=1.0)
    fit(flow, x, config, hook=TensorBoard(writer))
    results.append((flow.state_dict(), writer.scalars))
if distributed.is_main():
    torch.save(results, sys.argv[1])
distributed.leave()
"""

SAME_FIT = 1e-6  # |one process - two| of weights and latents; measured: up to 3e-8 and 2.4e-7


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    (root / "run.py").write_text(SCRIPT)
    # head dimension 16: PyTorch's CPU attention rounds differently with the thread count
    # for head dimension 8, and torchrun gives each process one thread
    make_tiny_encoder(root / "encoder", hidden=32, heads=2)
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(300)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n")
    return root


def bertflow(root, *args, **kwargs):
    return launch(root, "run.py", *args, **kwargs)


def launch(root, script, *args, processes=1, env=None, check=True):
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                 str(processes), "--master_port", free_port()]
                if processes > 1 else [sys.executable])
    result = subprocess.run([*launcher, str(root / script), *map(str, args)],
                            capture_output=True, text=True, cwd=root,
                            env={**os.environ, **(env or {})})
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def encode(root, out, *extra, **kwargs):
    cache = [] if "--no-cache" in extra else ["--cache", root / "cache"]
    return bertflow(root, "encode", "corpus.txt", "--out", out, "--encoder", "encoder",
                    "--pooling", "first_last", *cache, "--encode-batch-size", "4", *extra,
                    **kwargs)


def test_two_processes_encode_the_same_file_bit_for_bit(setup):
    encode(setup, "one.npy", "--no-cache")
    encode(setup, "two.npy", "--no-cache", processes=2)
    assert (setup / "two.npy").read_bytes() == (setup / "one.npy").read_bytes()
    one, two = (json.loads((setup / f"{n}.meta.json").read_text()) for n in ("one", "two"))
    assert one == two
    assert not list(setup.glob("two.npy.*")) and not list(setup.glob(".two.npy*"))


def test_a_rank_that_dies_is_resumed_by_the_same_launch(setup):
    died = encode(setup, "resumed.npy", "--no-cache", processes=2,
                  env={"CRASH_RANK_AFTER": "1:3"}, check=False)
    assert died.returncode != 0
    records = sorted(p.name for p in setup.glob("resumed.npy.progress-*"))
    assert records == ["resumed.npy.progress-0-of-2.json", "resumed.npy.progress-1-of-2.json"]
    # rank 1's share starts at chunk 9 of 19; it wrote 3 chunks before it died
    assert json.loads((setup / records[1]).read_text())["done"] == 9 * 16 + 3 * 16

    other = encode(setup, "resumed.npy", "--no-cache", "--resume", check=False)
    assert other.returncode == 1
    [line] = other.stderr.strip().splitlines()
    assert "progress-0-of-2.json was written with world 2, not 1" in line

    encode(setup, "resumed.npy", "--no-cache", "--resume", processes=2)
    if not (setup / "one.npy").exists():  # the module's folder is made afresh for this test
        encode(setup, "one.npy", "--no-cache")
    assert (setup / "resumed.npy").read_bytes() == (setup / "one.npy").read_bytes()
    assert not list(setup.glob("resumed.npy.*"))


@pytest.mark.parametrize("rows, fraction, batch, last", [
    (300, 0.1, 32, 14),  # 270 training rows
    (300, 29 / 300, 30, 1),  # 271: rank 1 gets none of the last minibatch
    (40, 0.1, 1, 1),  # 36: rank 1 gets none of any minibatch
], ids=["even", "last-of-one", "all-of-one"])
def test_fit_with_ddp_matches_one_process_and_writes_the_head_once(setup, request, rows,
                                                                   fraction, batch, last):
    train, _ = split_indices(rows, fraction, seed=0)
    assert (len(train) - 1) % batch + 1 == last  # the rows of the last minibatch
    name = request.node.callspec.id
    lines = (setup / "corpus.txt").read_text().splitlines(keepends=True)
    (setup / f"{name}.txt").write_text("".join(lines[:rows]))
    common = [f"{name}.txt", "--encoder", "encoder", "--cache", setup / "cache", "--pooling",
              "mean", "--epochs", "3", "--batch-size", batch, "--val-fraction", fraction,
              "--levels", "2", "--quiet"]
    bertflow(setup, "fit", "--out", f"{name}-one", *common)
    result = bertflow(setup, "fit", "--out", f"{name}-two", *common, processes=2)
    assert result.stdout.count(f"wrote {name}-two") == 1
    one, two = FlowHead.load(setup / f"{name}-one"), FlowHead.load(setup / f"{name}-two")
    # the same minibatches; only the order of float sums differs (DDP's gradient all-reduce)
    assert_same_weights(one.state_dict(), two.state_dict())
    x = np.load(next((setup / "cache").glob("mean-*.npy")))
    assert np.abs(one.transform(x) - two.transform(x)).max() < SAME_FIT
    assert one.training_info["val_nll"] == pytest.approx(two.training_info["val_nll"], abs=1e-6)
    assert one.training_info["corpus"] == two.training_info["corpus"]


def test_ddp_fit_with_jitter_and_empty_shares_logs_and_ends_as_one_process(setup):
    (setup / "fit.py").write_text(FIT_SCRIPT)
    launch(setup, "fit.py", "fit-one.pt")
    launch(setup, "fit.py", "fit-two.pt", processes=2)
    one, two = (torch.load(setup / f"fit-{n}.pt") for n in ("one", "two"))
    for (weights_one, scalars_one), (weights_two, scalars_two) in zip(one, two, strict=True):
        assert_same_weights(weights_one, weights_two)
        # the step loss and log-det are the whole minibatch's mean, not rank 0's share's
        assert scalars_one.keys() == scalars_two.keys()
        for key, value in scalars_one.items():
            assert scalars_two[key] == pytest.approx(value, rel=1e-6, abs=1e-6, nan_ok=True), key


def assert_same_weights(one, two):
    """The state dicts `one` and `two` hold the same tensors up to `SAME_FIT`."""
    assert one.keys() == two.keys()
    for key, value in one.items():
        assert (value.double() - two[key].double()).abs().max() < SAME_FIT, key


def test_index_encodes_across_processes_and_builds_one_index(setup):
    bertflow(setup, "index", "corpus.txt", "--out", "index-one", "--encoder", "encoder",
             "--pooling", "cls", "--cache", setup / "cache-one")
    bertflow(setup, "index", "corpus.txt", "--out", "index-two", "--encoder", "encoder",
             "--pooling", "cls", "--cache", setup / "cache-two", processes=2)
    for name in ("index.faiss", "items.json"):
        two, one = (setup / "index-two" / name), (setup / "index-one" / name)
        assert two.read_bytes() == one.read_bytes()


def test_commands_that_do_not_split_are_refused_under_torchrun(setup):
    result = bertflow(setup, "info", "head-one", processes=2, check=False)
    assert result.returncode != 0
    assert "bertflow: error: [rank 0] bertflow info runs in one process" in result.stderr


def test_two_machines_meet_at_a_rendezvous_endpoint(setup):
    """Two launchers, as on two machines (`--nnodes 2 --node_rank`, one endpoint), write the
    same file as one process."""
    port = free_port()
    launchers = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank",
             str(node), "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
             f"127.0.0.1:{port}", "--rdzv_id", "bertflow-test", str(setup / "run.py"),
             "encode", "corpus.txt", "--out", "nodes.npy", "--encoder", "encoder",
             "--pooling", "first_last", "--encode-batch-size", "4", "--no-cache"],
            cwd=setup, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)
    ]
    for launcher in launchers:
        _, err = launcher.communicate(timeout=600)
        assert launcher.returncode == 0, err[-3000:]
    if not (setup / "one.npy").exists():
        encode(setup, "one.npy", "--no-cache")
    assert (setup / "nodes.npy").read_bytes() == (setup / "one.npy").read_bytes()


def test_each_process_takes_its_own_gpu_and_nccl_with_gloo_for_cpu_tensors(monkeypatch):
    """The CUDA branch of joining a torchrun job, checked on the CPU with CUDA stood in for."""
    import torch

    from bertflow.runtime import distributed

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    joined, chosen = [], []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group",
                        lambda backend, timeout: joined.append(backend))
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert distributed.join("cuda") == "cuda:3"
    assert distributed.join("cuda:1") == "cuda:1"
    assert distributed.join("cpu") == "cpu"
    assert joined == ["cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl", "gloo"]
    assert chosen == [torch.device("cuda", 3), torch.device("cuda", 1)]

    monkeypatch.setenv("WORLD_SIZE", "1")  # not launched: cuda stays as asked, nothing joined
    assert distributed.join("cuda") == "cuda"
    assert len(joined) == 3


def test_encode_from_the_cache_refuses_a_stopped_run_on_every_rank(setup):
    """rank 0 checks what a stopped run left at --out before putting the cache's copy there;
    its refusal stops every rank (no rank waits at a barrier)."""
    encode(setup, "first.npy")  # fills the cache
    died = encode(setup, "stopped.npy", "--no-cache", processes=2,
                  env={"CRASH_RANK_AFTER": "1:1"}, check=False)
    assert died.returncode != 0
    left = sorted(p.name for p in setup.glob("stopped.npy*"))
    result = encode(setup, "stopped.npy", processes=2, check=False)
    assert result.returncode != 0
    assert result.stderr.count("bertflow: error: ") == 1
    assert "[rank 0] stopped.npy holds an interrupted encode of this request" in result.stderr
    assert sorted(p.name for p in setup.glob("stopped.npy*")) == left
    done = encode(setup, "stopped.npy", "--restart", processes=2)
    assert "from the cache" in done.stdout
    assert (setup / "stopped.npy").read_bytes() == (setup / "first.npy").read_bytes()
    assert sorted(p.name for p in setup.glob("stopped.*")) == ["stopped.meta.json",
                                                               "stopped.npy"]
