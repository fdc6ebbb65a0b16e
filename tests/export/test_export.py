"""The head as a standalone graph: ONNX (run by onnxruntime) and torch.export, each in a fresh
process where neither bertflow nor nflows can be imported."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest

from bertflow.cli.main import main
from bertflow.export.graphs import export_onnx, export_program

from ..conftest import fit_tiny_head

# Runs in a fresh interpreter: bertflow and nflows are made unimportable first.
BLOCKED = textwrap.dedent("""
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ImportError(f"{{name}} is blocked")
    sys.meta_path.insert(0, Block())
    import numpy as np
    x = np.load(sys.argv[2])
""")

RUN_ONNX = textwrap.dedent("""
    import onnxruntime
    session = onnxruntime.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
    np.save(sys.argv[3], session.run(["z"], {"embeddings": x})[0])
""")

RUN_PROGRAM = textwrap.dedent("""
    import torch
    program = torch.export.load(sys.argv[1]).module()
    np.save(sys.argv[3], program(torch.from_numpy(x)).detach().numpy())
""")


@pytest.fixture(scope="module")
def head(tiny_encoder):
    return fit_tiny_head(tiny_encoder, "first_last")


def run_blocked(script, blocked, graph, x, tmp_path):
    np.save(tmp_path / "x.npy", x)
    code = BLOCKED.format(blocked=blocked) + script
    done = subprocess.run([sys.executable, "-c", code, str(graph), str(tmp_path / "x.npy"),
                           str(tmp_path / "z.npy")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return np.load(tmp_path / "z.npy")


def batches(dim):
    rng = np.random.default_rng(1)
    return [rng.normal(size=(n, dim)).astype(np.float32) for n in (1, 37)]


def test_onnx_runs_without_bertflow_or_nflows(tmp_path, head):
    path = export_onnx(head, tmp_path / "head.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["head.onnx"]  # weights inside, no temp
    for x in batches(head.dim):
        z = run_blocked(RUN_ONNX, {"bertflow", "nflows", "torch"}, path, x, tmp_path)
        assert z.shape == x.shape
        assert np.abs(z - head.transform(x)).max() <= 1e-4
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    config = json.loads(props["bertflow_head"])
    assert config["pooling"] == "first_last" and config["dim"] == head.dim


def test_torch_export_runs_without_bertflow_or_nflows(tmp_path, head):
    path = export_program(head, tmp_path / "head.pt2")
    for x in batches(head.dim):
        z = run_blocked(RUN_PROGRAM, {"bertflow", "nflows"}, path, x, tmp_path)
        assert np.abs(z - head.transform(x)).max() <= 1e-5


def test_the_blocker_blocks(tmp_path, head):
    path = export_program(head, tmp_path / "head.pt2")
    np.save(tmp_path / "x.npy", batches(head.dim)[0])
    code = BLOCKED.format(blocked={"bertflow"}) + "import bertflow\n"
    done = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "x.npy"),
                           str(tmp_path / "z.npy")], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0 and "bertflow is blocked" in done.stderr


@pytest.mark.parametrize("fmt, name, message", [
    ("onnx", "head.pt2", "must end in .onnx"),
    ("torch-export", "head.onnx", "must end in .pt2"),
])
def test_cli_export_refuses_a_wrong_suffix(tmp_path, capsys, head, fmt, name, message):
    head.save(tmp_path / "head")
    code = main(["export", "--head", str(tmp_path / "head"), "--format", fmt,
                 "--out", str(tmp_path / name)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and message in err[0]
    assert not (tmp_path / name).exists()


def test_cli_export_onnx_and_a_corrupted_head(tmp_path, capsys, head):
    head.save(tmp_path / "head")
    assert main(["export", "--head", str(tmp_path / "head"), "--format", "onnx",
                 "--out", str(tmp_path / "h.onnx")]) == 0
    assert (tmp_path / "h.onnx").stat().st_size > 0
    weights = tmp_path / "head" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    capsys.readouterr()
    assert main(["export", "--head", str(tmp_path / "head"), "--format", "onnx",
                 "--out", str(tmp_path / "h2.onnx")]) == 1
    assert "altered or truncated" in capsys.readouterr().err
    assert not (tmp_path / "h2.onnx").exists()


def test_a_head_whitened_before_its_flow_exports_to_onnx(tmp_path):
    """The CLS recipe's head (whitening, then a Glow) exports: the graph computes the latents
    without the whitening's log-determinant, and gives what `transform` gives."""
    import onnxruntime

    from bertflow import FlowConfig, TrainConfig, fit_head
    from bertflow.export.graphs import export_onnx

    rng = np.random.default_rng(0)
    x = (rng.normal(size=(300, 8)) @ rng.normal(size=(8, 8))).astype(np.float32)
    head = fit_head(x, flow=FlowConfig(levels=2, depth=2), train=TrainConfig(epochs=1),
                        before="whiten")
    path = export_onnx(head, tmp_path / "head.onnx")
    session = onnxruntime.InferenceSession(str(path))
    name = session.get_inputs()[0].name
    got = session.run(None, {name: x[:7]})[0]
    np.testing.assert_allclose(got, head.transform(x[:7]), atol=1e-4)


@pytest.mark.parametrize("method", ["identity", "center", "no-mean-direction", "fractional",
                                    "pca"])
def test_every_linear_candidate_exports_like_any_head(tmp_path, method):
    """The identity (the raw embeddings) and the other closed-form maps export to ONNX and
    torch.export and give what `transform` gives."""
    import onnxruntime
    import torch

    from bertflow import FlowHead

    rng = np.random.default_rng(0)
    x = (rng.normal(size=(300, 8)) @ rng.normal(size=(8, 8)) + 2).astype(np.float32)
    head = FlowHead.fit_linear(x, method)
    session = onnxruntime.InferenceSession(str(export_onnx(head, tmp_path / "h.onnx")))
    got = session.run(None, {session.get_inputs()[0].name: x[:7]})[0]
    np.testing.assert_allclose(got, head.transform(x[:7]), atol=1e-4)
    program = torch.export.load(str(export_program(head, tmp_path / "h.pt2"))).module()
    np.testing.assert_allclose(program(torch.from_numpy(x[:7])).numpy(), head.transform(x[:7]),
                               atol=1e-5)


@pytest.mark.parametrize("fmt, name", [("torch-export", "h.pt2"), ("onnx", "h.onnx")])
def test_export_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, head, fmt, name):
    from ..embeddings.test_outputs import run_limited

    head.save(tmp_path / "head")
    done = run_limited(8, "export", "--head", "head", "--format", fmt, "--out", name,
                       cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0] == f"bertflow: error: file too large (a file size limit) while writing {name}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head"]
    assert main(["export", "--head", str(tmp_path / "head"), "--format", fmt, "--out",
                 str(tmp_path / name)]) == 0
    first = (tmp_path / name).read_bytes()
    assert main(["export", "--head", str(tmp_path / "head"), "--format", fmt, "--out",
                 str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_bytes() == first  # the same bytes each time


def foreign_files(folder):
    """Files at each kind of --out that a bertflow export must not replace: the user's own
    ONNX model and torch.export program (valid, without bertflow's record), bytes of no
    format, and a folder of notes."""
    import torch
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "mine", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph), str(folder / "mine.onnx"))
    program = torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),))
    torch.export.save(program, str(folder / "mine.pt2"))
    (folder / "bytes.onnx").write_bytes(b"\x08\x07 not a model")
    (folder / "bytes.pt2").write_bytes(b"PK\x03\x04 not an archive")
    (folder / "notes").mkdir()
    (folder / "notes" / "keep.txt").write_text("keep")


@pytest.mark.parametrize("fmt, name, message", [
    ("onnx", "mine.onnx", "mine.onnx exists and is not a bertflow export; not replacing it"),
    ("onnx", "bytes.onnx", "bytes.onnx exists and is not a bertflow export; not replacing it"),
    ("torch-export", "mine.pt2", "mine.pt2 exists and is not a bertflow export; not replacing it"),
    ("torch-export", "bytes.pt2", "bytes.pt2 exists and is not a bertflow export; not replacing"),
    ("sentence-transformers", "notes", "notes is a non-empty folder but not a bertflow "
     "sentence-transformers export; not replacing it"),
])
def test_export_replaces_no_file_that_is_not_a_bertflow_export(tmp_path, capsys, head, fmt,
                                                                name, message):
    from ..embeddings.test_outputs import snapshot

    head.save(tmp_path / "head")
    foreign_files(tmp_path)
    before = snapshot(tmp_path)
    code = main(["export", "--head", str(tmp_path / "head"), "--format", fmt,
                 "--out", str(tmp_path / name)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and message in err[0], err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("fmt, name", [("torch-export", "h.pt2"), ("onnx", "h.onnx")])
def test_export_replaces_a_bertflow_export_with_the_bytes_of_a_first_one(tmp_path, tiny_encoder,
                                                                         head, fmt, name):
    """Over an export of another head, or of this one, the file is what a first export
    writes; the .pt2 records the head as the ONNX metadata does."""
    import torch

    head.save(tmp_path / "head")
    fit_tiny_head(tiny_encoder, "cls", seed=1).save(tmp_path / "other")
    export = ["export", "--format", fmt, "--out"]
    assert main([*export, str(tmp_path / "first" / name), "--head", str(tmp_path / "head")]) == 0
    first = (tmp_path / "first" / name).read_bytes()
    for source in ("other", "head", "head"):
        assert main([*export, str(tmp_path / name), "--head", str(tmp_path / source)]) == 0
    assert (tmp_path / name).read_bytes() == first
    if fmt == "torch-export":
        extra = {"bertflow_head.json": ""}
        torch.export.load(tmp_path / name, extra_files=extra)
        assert json.loads(extra["bertflow_head.json"]) == head.config()


@pytest.mark.parametrize("moment", ["before the write", "while written"])
@pytest.mark.parametrize("fmt, name", [("torch-export", "h.pt2"), ("onnx", "h.onnx")])
def test_export_keeps_a_file_made_at_out_while_it_ran(tmp_path, capsys, monkeypatch, head, fmt,
                                                      name, moment):
    import bertflow.export.graphs

    from ..embeddings.test_outputs import (
        made_by_the_user,
        made_while_written,
        refused_keeping_the_users,
    )

    head.save(tmp_path / "head")
    out = tmp_path / "out"
    out.mkdir()
    if moment == "before the write":
        made_by_the_user(monkeypatch, bertflow.export.graphs, "_program", out / name)
    else:
        made_while_written(monkeypatch, out / name)
    refused_keeping_the_users(
        capsys, ["export", "--head", tmp_path / "head", "--format", fmt, "--out", out / name],
        out, f"{name} exists and is not a bertflow export; not replacing it")
