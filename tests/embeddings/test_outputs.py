"""No command writes over what it reads: every output is checked against every input (the file,
its sidecar, a file inside an input folder, a hard or symbolic link to an input) before any
work; and a full disk while writing an output is one line."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bertflow.cli.main import main

from ..conftest import REPO, fit_tiny_head
from ..data.test_sts import write_stsb


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_encoder_dir, tiny_encoder):
    """A folder of inputs: an encoder, a corpus, its embeddings, a head, an STS data folder, a
    folder holding sentences, a cache, and links to some of them."""
    root = tmp_path_factory.mktemp("world")
    shutil.copytree(tiny_encoder_dir, root / "enc")
    corpus = root / "corpus.txt"
    corpus.write_text("a man plays the guitar\nthe dog runs in the park\na green house\n")
    code = main(["encode", str(corpus), "--out", str(root / "emb.npy"), "--encoder",
                 str(root / "enc"), "--pooling", "cls", "--cache", str(root / "cache")])
    assert code == 0
    fit_tiny_head(tiny_encoder, "cls", max_length=128).save(root / "head")  # as emb.npy
    write_stsb(root / "data" / "STSBenchmark", rows_per_split=6)
    (root / "d").mkdir()
    (root / "d" / "s.txt").write_text("a big red car\nmusic\n")
    (root / "lines.meta.json").write_text("a cat sleeps\na dog runs\n")
    for name in ("corpus-link.npy", "corpus-link.json"):
        (root / name).symlink_to("corpus.txt")
    for name in ("corpus-hard.npy", "corpus-hard.json"):
        os.link(corpus, root / name)
    os.link(root / "emb.npy", root / "emb-hard.npy")
    (root / "side.meta.json").symlink_to("emb.meta.json")
    (root / "head-link").symlink_to("head")
    return root


@pytest.fixture
def no_encoding(monkeypatch):
    """Encoding anything fails the test: the refusals come before it."""
    import bertflow.embeddings.cache
    import bertflow.encoders.encoder

    def fail(*args, **kwargs):
        raise AssertionError("encoding started")

    monkeypatch.setattr(bertflow.embeddings.cache, "write_embeddings", fail)
    monkeypatch.setattr(bertflow.encoders.encoder.Encoder, "encode", fail)


ENC = ["--encoder", "enc"]
INPUT = "an input of this command"
CASES = [
    (["encode", "corpus.txt", "--out", "enc/x.npy", *ENC],
     f"--out enc/x.npy is inside {INPUT} (--encoder enc)"),
    (["encode", "corpus.txt", "--out", "cache/x.npy", "--cache", "cache", *ENC],
     f"is inside {INPUT} (the embedding cache cache)"),
    (["encode", "lines.meta.json", "--out", "lines.npy", *ENC],
     "lines.meta.json exists and is not a bertflow sidecar; not replacing it"),
    (["encode", "corpus.txt", "--out", "corpus-link.npy", *ENC], "is a symbolic link"),
    (["encode", "corpus.txt", "--out", "corpus-hard.npy", *ENC], "is not a bertflow output"),
    (["fit", "corpus.txt", "--out", "enc/h", *ENC], f"--out enc/h is inside {INPUT} (--encoder"),
    (["fit", "corpus.txt", "--out", "cache/h", "--cache", "cache", *ENC],
     f"is inside {INPUT} (the embedding cache cache)"),
    (["fit", "emb.npy", "--out", "h", "--logdir", "h/runs"],
     "--logdir h/runs is inside another output of this command (--out h)"),
    (["transform", "--head", "head", "--embeddings", "emb.npy", "--out", "head/z.npy"],
     f"--out head/z.npy is inside {INPUT} (--head head)"),
    (["transform", "--head", "head", "--embeddings", "emb.npy", "--out", "emb.npy"],
     f"--out emb.npy is {INPUT} (--embeddings emb.npy)"),
    (["transform", "--head", "head", "--embeddings", "emb.npy", "--out", "emb-hard.npy"],
     f"is {INPUT} (--embeddings emb.npy)"),
    (["transform", "--head", "head", "--embeddings", "emb.npy", "--out", "side.npy"],
     f"--out's sidecar side.meta.json is {INPUT} (--embeddings's sidecar emb.meta.json)"),
    (["transform", "--head", "head", "--sentences", "corpus.txt", "--out", "corpus-link.npy"],
     f"is {INPUT} (the sentences corpus.txt)"),
    (["eval", "sts", "data", "--method", "whitening", "--out",
      "data/STSBenchmark/sts-dev.csv", *ENC], f"is inside {INPUT} (--data data)"),
    (["eval", "sts", "data", "--method", "whitening", "--fit-on", "corpus.txt", "--out",
      "corpus.txt", *ENC], f"--out corpus.txt is {INPUT} (--fit-on corpus.txt)"),
    (["eval", "sts", "data", "--fit-on", "target", "corpus.txt", "--out",
      "corpus-link.json", *ENC], f"is {INPUT} (--fit-on corpus.txt)"),
    (["eval", "sts", "data", "--method", "standardize", "--fit-on", "corpus.txt", "--out",
      "corpus-hard.json", *ENC], f"is {INPUT} (--fit-on corpus.txt)"),
    (["eval", "sts", "data", "--head", "head", "--out", "head/model.safetensors"],
     f"is inside {INPUT} (--head head)"),
    (["eval", "sts", "data", "--head", "head-link", "--out", "head/config.json"],
     f"is inside {INPUT} (--head head-link)"),
    (["diagnose", "d/s.txt", "--out", "d", *ENC], f"--out d holds {INPUT} (the sentences d/s"),
    (["diagnose", "corpus.txt", "--data", "data", "--out", "data/plots", *ENC],
     f"is inside {INPUT} (--data data)"),
    (["export", "--head", "head", "--format", "onnx", "--out", "head/h.onnx"],
     f"is inside {INPUT} (--head head)"),
    (["export", "--head", "head", "--format", "torch-export", "--out", "head-link/h.pt2"],
     f"is inside {INPUT} (--head head)"),
    (["export", "--head", "head", "--format", "sentence-transformers", "--out", "enc", *ENC],
     f"--out enc is {INPUT} (--encoder enc)"),
    (["index", "corpus.txt", "--head", "head", "--out", "head/idx", *ENC],
     f"is inside {INPUT} (--head head)"),
    (["index", "corpus.txt", "--out", "enc/idx", *ENC], f"is inside {INPUT} (--encoder enc)"),
]


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(c[0][:1] + c[0][-3:])
                                                      for c in CASES])
def test_no_output_is_an_input_or_inside_one(world, capsys, monkeypatch, no_encoding, args,
                                             message):
    monkeypatch.chdir(world)
    before = snapshot(world)
    code = main(args)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("bertflow: error: ") and message in lines[0], lines[0]
    assert snapshot(world) == before


def test_eval_json_replaces_only_rows_of_an_earlier_eval(world, tmp_path, capsys, no_encoding):
    base = ["eval", "sts", str(world / "data"), "--method", "whitening", "--encoder",
            str(world / "enc"), "--cache", str(tmp_path / "cache")]
    (tmp_path / "notes.json").write_text('{"mine": true}\n')
    (tmp_path / "list.json").write_text('[{"task": "mine"}]\n')
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "folder.json").mkdir()
    before = snapshot(tmp_path)
    for name, message in [("notes.json", "is not rows written by bertflow eval"),
                          ("list.json", "is not rows written by bertflow eval"),
                          ("link.json", "is a symbolic link"),
                          ("folder.json", "is a folder")]:
        code = main([*base, "--out", str(tmp_path / name)])
        err = capsys.readouterr().err
        assert code == 1 and len(err.strip().splitlines()) == 1 and message in err, err
    assert snapshot(tmp_path) == before


def run_limited(kilobytes, *args, cwd):
    """`python -m bertflow ARGS` with files limited to `kilobytes` (as on a full disk), in a
    shell that delivers SIGXFSZ as `ulimit -f` does (Python ignores it: writes fail)."""
    command = " ".join(map(str, [sys.executable, "-m", "bertflow", *args]))
    return subprocess.run(["bash", "-c", f"ulimit -f {kilobytes}; exec {command}"],
                          capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_transform_on_a_full_disk_is_one_line_naming_the_file(tmp_path, tiny_encoder):
    fit_tiny_head(tiny_encoder, "cls").save(tmp_path / "head")
    np.save(tmp_path / "e.npy", np.random.default_rng(0).normal(size=(2000, 16))
            .astype(np.float32))
    done = run_limited(64, "transform", "--head", "head", "--embeddings", "e.npy",
                       "--pooling", "cls", "--out", "z.npy", cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0] == "bertflow: error: file too large (a file size limit) while writing z.npy"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.npy", "head"]


def test_a_transformed_file_is_what_numpy_saves(tmp_path):
    import hashlib

    from bertflow.embeddings.outputs import write_transformed

    z = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    write_transformed(tmp_path / "z.npy", np.asfortranarray(z, dtype=np.float64), {}, {})
    np.save(tmp_path / "n.npy", z)
    assert (tmp_path / "z.npy").read_bytes() == (tmp_path / "n.npy").read_bytes()
    meta = json.loads((tmp_path / "z.meta.json").read_text())
    assert meta["count"] == 7
    assert meta["sha256"] == hashlib.sha256((tmp_path / "z.npy").read_bytes()).hexdigest()


# Runs `bertflow ARGS` in a fresh process that dies (kill -9's way: no cleanup) just before or
# just after the rename of the file named TARGET into place.
KILLED = """
import os, sys
target, when = sys.argv[1:3]
rename = os.replace
def replace(src, dst):
    if os.path.basename(dst) == target and when == "before":
        os._exit(9)
    rename(src, dst)
    if os.path.basename(dst) == target and when == "after":
        os._exit(9)
os.replace = replace
from bertflow.cli.main import main
sys.exit(main(sys.argv[3:]))
"""


def files_of(folder, *names):
    return tuple((folder / n).read_bytes() if (folder / n).exists() else None for n in names)


@pytest.mark.parametrize("earlier", [False, True], ids=["first write", "over an earlier one"])
def test_transform_killed_at_any_point_is_rerun_to_the_same_files(tmp_path, monkeypatch,
                                                                  tiny_encoder, earlier):
    """Killed before or after either rename, `transform` leaves the earlier pair, the new pair,
    or the new sidecar beside the earlier data (or none), which its checksum does not
    describe; the same command again writes what an uninterrupted run writes."""
    import hashlib

    monkeypatch.chdir(tmp_path)
    fit_tiny_head(tiny_encoder, "cls").save(tmp_path / "head")
    rng = np.random.default_rng(0)
    for name, rows in (("old.npy", 5), ("e.npy", 9)):
        np.save(tmp_path / name, rng.normal(size=(rows, 16)).astype(np.float32))

    def transform(embeddings):
        return ["transform", "--head", "head", "--embeddings", embeddings, "--pooling", "cls",
                "--out", "z.npy"]

    names = ("z.npy", "z.meta.json")
    assert main(transform("old.npy")) == 0
    old = files_of(tmp_path, *names)
    assert main(transform("e.npy")) == 0
    new = files_of(tmp_path, *names)
    start = old if earlier else (None, None)
    for target in names:
        for when in ("before", "after"):
            for name, data in zip(names, start, strict=True):
                (tmp_path / name).unlink(missing_ok=True)
                if data is not None:
                    (tmp_path / name).write_bytes(data)
            done = subprocess.run([sys.executable, "-c", KILLED, target, when,
                                   *transform("e.npy")], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
            assert done.returncode == 9, done.stderr[-3000:]
            left = files_of(tmp_path, *names)
            assert left in (start, new, (start[0], new[1])), (target, when)
            if None not in left:  # the sidecar describes the data beside it, or is refused
                described = hashlib.sha256(left[0]).hexdigest() == json.loads(left[1])["sha256"]
                assert described == (left in (start, new))
            assert main(transform("e.npy")) == 0, (target, when)
            assert files_of(tmp_path, *names) == new
            assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
                ["e.npy", "head", "old.npy", *names])  # the killed run's temporary is gone


def test_transform_leaves_a_sidecar_that_is_not_bertflows_alone(tmp_path, capsys, monkeypatch,
                                                                  tiny_encoder):
    monkeypatch.chdir(tmp_path)
    fit_tiny_head(tiny_encoder, "cls").save(tmp_path / "head")
    np.save(tmp_path / "e.npy", np.ones((3, 16), dtype=np.float32))
    (tmp_path / "z.meta.json").write_text('{"mine": true}\n')
    (tmp_path / "w.meta.json").symlink_to("elsewhere.json")
    before = snapshot(tmp_path)
    for out, message in (("z.npy", "z.meta.json exists and is not a bertflow sidecar; not "
                          "replacing it"), ("w.npy", "w.meta.json is a symbolic link")):
        code = main(["transform", "--head", "head", "--embeddings", "e.npy", "--pooling", "cls",
                     "--out", out])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(lines) == 1 and message in lines[0], lines
    assert snapshot(tmp_path) == before


def test_two_transforms_of_one_output_take_turns(tmp_path):
    """A second writer of the same output waits for the first; the pair left is one writer's
    data with that writer's sidecar."""
    import threading

    from bertflow.embeddings.outputs import lock, write_transformed
    from bertflow.storage.files import meta_path, sha256_file

    out = tmp_path / "z.npy"
    first, second = (np.full((4, 3), v, np.float32) for v in (1.0, 2.0))
    with lock(out, wait=False):
        writer = threading.Thread(target=write_transformed, args=(out, second, {}, {}))
        writer.start()
        writer.join(timeout=1.0)
        assert writer.is_alive() and not out.exists()  # waits for the lock's holder
        np.save(out, first)  # the holder's own write, as a transform under the lock makes it
    writer.join(timeout=60)
    assert not writer.is_alive()
    np.testing.assert_array_equal(np.load(out), second)
    assert json.loads(meta_path(out).read_text())["sha256"] == sha256_file(out)
    assert not (tmp_path / ".z.npy.lock").exists()


@pytest.fixture(scope="module")
def head_of_enc(world):
    """A head in the world that records its encoder folder `enc`: used without --encoder."""
    from bertflow import load_encoder

    fit_tiny_head(load_encoder(world / "enc"), "cls").save(world / "head-enc")
    return world / "head-enc"


RECORDED = [
    ["transform", "--head", "head-enc", "--sentences", "corpus.txt", "--out", "enc/z.npy"],
    ["transform", "--head", "head-enc", "--embeddings", "emb.npy", "--out", "enc/z.npy"],
    ["eval", "sts", "data", "--head", "head-enc", "--out", "enc/rows.json"],
    ["diagnose", "corpus.txt", "--head", "head-enc", "--out", "enc/plots"],
    ["export", "--head", "head-enc", "--format", "sentence-transformers", "--out", "enc/st"],
    ["export", "--head", "head-enc", "--format", "onnx", "--out", "enc/h.onnx"],
    ["index", "corpus.txt", "--head", "head-enc", "--out", "enc/ix"],
]


@pytest.mark.parametrize("args", RECORDED, ids=[" ".join(a[:1] + a[-3:]) for a in RECORDED])
def test_no_output_is_inside_the_encoder_a_head_records(world, head_of_enc, capsys, monkeypatch,
                                                        no_encoding, args):
    monkeypatch.chdir(world)
    before = snapshot(world)
    code = main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1, lines
    assert f"{args[-1]} is inside {INPUT} (the head's encoder {world / 'enc'})" in lines[0]
    assert snapshot(world) == before


USERS = b'{"my": 1}\n'


def made_by_the_user(monkeypatch, owner, name, path, after=False):
    """Make `owner.name` (a function a command calls after checking its output) write the
    user's file at `path` (with `after`, once it has returned), as another process would
    while the command runs."""
    original = getattr(owner, name)

    def meanwhile(*args, **kwargs):
        if not after:
            path.write_bytes(USERS)
        value = original(*args, **kwargs)
        if after:
            path.write_bytes(USERS)
        return value

    monkeypatch.setattr(owner, name, meanwhile)


def made_while_written(monkeypatch, path):
    """Write the user's file at `path` when a temporary file of a write of `path` is flushed,
    just before it would be renamed into place."""
    import bertflow.storage.files

    original = bertflow.storage.files.fsync

    def fsync(name):
        if os.path.basename(name).startswith(f".{path.name}.") and not path.exists():
            path.write_bytes(USERS)
        original(name)

    monkeypatch.setattr(bertflow.storage.files, "fsync", fsync)


def refused_keeping_the_users(capsys, args, folder, message):
    """The command fails in one line naming `message`, leaving the user's file (at most one
    in `folder`, besides its inputs) byte for byte, and nothing else of its own."""
    before = {p.name for p in folder.iterdir()}
    code = main([str(a) for a in args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and message in lines[0], lines
    made = {p.name: p.read_bytes() for p in folder.iterdir() if p.name not in before}
    assert list(made.values()) == [USERS], sorted(made)


@pytest.mark.parametrize("moment", ["before the write", "while written"])
def test_eval_keeps_a_file_made_at_out_while_it_ran(world, tmp_path, capsys, monkeypatch,
                                                    moment):
    import bertflow.storage.files

    rows = tmp_path / "out" / "rows.json"
    rows.parent.mkdir()
    if moment == "before the write":
        made_by_the_user(monkeypatch, bertflow.storage.files, "write_json", rows)
    else:
        made_while_written(monkeypatch, rows)
    refused_keeping_the_users(
        capsys, ["eval", "sts", world / "data", "--head", world / "head", "--out", rows,
                 "--cache", tmp_path / "cache", "--quiet"], rows.parent,
        f"{rows} exists and is not rows written by bertflow eval; not replacing it")


@pytest.mark.parametrize("made, after, message", [
    ("z.npy", False, "z.npy exists and is not a bertflow output (no z.meta.json)"),
    ("z.meta.json", False, "z.meta.json exists and is not a bertflow sidecar"),
    ("z.npy", True, "z.npy was made or changed by another process while this one wrote it"),
], ids=["data", "sidecar", "data after the sidecar"])
def test_transform_keeps_a_file_made_at_its_output_while_it_ran(world, tmp_path, capsys,
                                                                monkeypatch, made, after,
                                                                message):
    """Made while the vectors are transformed, the user's file is refused by the second check
    of the pair; made once the new sidecar is in place, it stays alone (the new sidecar, which
    does not describe it, is removed)."""
    import bertflow.embeddings.outputs
    import bertflow.heads.head

    out = tmp_path / "out"
    out.mkdir()
    if after:
        made_by_the_user(monkeypatch, bertflow.embeddings.outputs, "write_json", out / made,
                         after=True)
    else:
        made_by_the_user(monkeypatch, bertflow.heads.head.FlowHead, "transform", out / made)
    refused_keeping_the_users(capsys, ["transform", "--head", world / "head", "--embeddings",
                                       world / "emb.npy", "--out", out / "z.npy"], out, message)
