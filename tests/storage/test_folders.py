"""Artifact folders and outputs as a hostile user meets them: foreign files, symlinks, `.`,
edited configs, killed and racing saves, full disks, outputs equal to inputs."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bertflow import BertflowError, FlowHead
from bertflow.cli.main import main
from bertflow.storage.artifacts import HEAD_FOLDER, FolderFormat

from ..conftest import REPO, fit_tiny_head

FAST = ["--epochs", "1", "--levels", "2", "--depth", "2", "--quiet"]


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(capsys, *args) -> str:
    code, out, err = run(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("bertflow: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def head(tiny_encoder):
    return fit_tiny_head(tiny_encoder, "cls")


@pytest.fixture
def emb(tmp_path, capsys, corpus_file, tiny_encoder_dir):
    path = tmp_path / "emb.npy"
    code, _, err = run(capsys, "encode", corpus_file, "--out", path, "--encoder",
                       tiny_encoder_dir, "--pooling", "cls", "--no-cache")
    assert code == 0, err
    return path


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fit_never_deletes_the_users_files_in_out(tmp_path, capsys, emb):
    out = tmp_path / "h"
    assert run(capsys, "fit", emb, "--out", out, *FAST)[0] == 0
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    line = one_line_error(capsys, "fit", emb, "--out", out, *FAST)
    assert "not part of a flow head: notes.txt" in line
    assert snapshot(out) == before
    # the embeddings being fit, inside the head folder, are an input: never deleted
    (out / "notes.txt").unlink()
    shutil.copy(emb, out / "emb.npy")
    shutil.copy(emb.with_name("emb.meta.json"), out / "emb.meta.json")
    line = one_line_error(capsys, "fit", out / "emb.npy", "--out", out, *FAST)
    assert "emb.meta.json, emb.npy" in line and (out / "emb.npy").exists()
    # a head and only its own files is replaced
    (out / "emb.npy").unlink()
    (out / "emb.meta.json").unlink()
    assert run(capsys, "fit", emb, "--out", out, "--seed", "1", *FAST)[0] == 0
    assert FlowHead.load(out).training_info["seed"] == 1


def test_index_and_export_never_replace_foreign_folders(tmp_path, capsys, corpus_file,
                                                        tiny_encoder_dir, head):
    head.save(tmp_path / "head")
    common = ["--head", tmp_path / "head", "--encoder", tiny_encoder_dir]
    index = tmp_path / "idx"
    assert run(capsys, "index", corpus_file, "--out", index, *common)[0] == 0
    (index / "todo.md").write_text("mine")
    assert "not part of an index: todo.md" in one_line_error(
        capsys, "index", corpus_file, "--out", index, *common)
    assert (index / "todo.md").read_text() == "mine"
    # the head folder is not an index, and an index is not a head
    assert "not an index" in one_line_error(capsys, "index", corpus_file, "--out",
                                            tmp_path / "head", *common)
    (index / "todo.md").unlink()
    assert "is an index, not a flow head" in one_line_error(
        capsys, "fit", corpus_file, "--out", index, "--encoder", tiny_encoder_dir, *FAST)

    st = tmp_path / "st"
    export = ["export", "--format", "sentence-transformers", *common]
    assert run(capsys, *export, "--out", st)[0] == 0
    (st / "README.md").write_text("edited by hand")  # a file of ours, altered: still ours
    assert run(capsys, *export, "--out", st)[0] == 0
    shutil.copytree(st, tmp_path / "theirs")
    (tmp_path / "theirs" / "manifest.json").unlink()  # a model saved by sentence-transformers
    before = snapshot(tmp_path / "theirs")
    assert "not a bertflow sentence-transformers export" in one_line_error(
        capsys, *export, "--out", tmp_path / "theirs")
    assert snapshot(tmp_path / "theirs") == before


@pytest.mark.parametrize("where", [".", "..", "link", "cwd"])
def test_out_is_neither_the_working_folder_nor_a_link(tmp_path, capsys, emb, monkeypatch,
                                                      where):
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    (tmp_path / "real").mkdir()
    (work / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(work)
    out = {"cwd": work}.get(where, where)
    line = one_line_error(capsys, "fit", emb, "--out", out, *FAST)
    assert ("current folder or one of its parents" in line) == (where != "link")
    assert ("symbolic link" in line) == (where == "link")
    assert (work / "link").is_symlink() and (work / "keep.txt").exists()
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt", "link"]
    assert list((tmp_path / "real").iterdir()) == []


def test_editing_a_heads_config_is_refused(tmp_path, head):
    folder = head.save(tmp_path / "head")
    config = json.loads((folder / "config.json").read_text())
    for field, value in [("pooling", "mean"), ("max_length", 512),
                         ("encoder", {**config["encoder"], "fingerprint": "0" * 16})]:
        (folder / "config.json").write_text(json.dumps({**config, field: value}))
        with pytest.raises(BertflowError, match="config.json does not match the checksum"):
            FlowHead.load(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    FlowHead.load(folder)
    (folder / "manifest.json").unlink()
    with pytest.raises(BertflowError, match="no manifest.json"):
        FlowHead.load(folder)


def test_the_shipped_head_loads_and_a_head_without_a_manifest_is_not_bertflows(tmp_path,
                                                                               head):
    shipped = FlowHead.load(REPO / "checkpoints" / "minilm-first_last-wiki")
    assert shipped.dim == 384 and shipped.pooling == "first_last"
    folder = head.save(tmp_path / "old")
    (folder / "manifest.json").unlink()
    with pytest.raises(BertflowError, match="no manifest.json"):
        FlowHead.load(folder)
    with pytest.raises(BertflowError, match="a non-empty folder but not a flow head"):
        head.save(folder)
    assert HEAD_FOLDER.verify(folder) is None


def test_a_config_claiming_a_huge_dimension_is_refused_before_building(tmp_path, head):
    folder = head.save(tmp_path / "head")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "dim": 100_000_000}))
    from bertflow.storage.artifacts import write_manifest

    write_manifest(folder, "bertflow-head")
    script = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a 5.5 GB build would fail
        sys.path.insert(0, {str(REPO)!r})
        from bertflow import BertflowError, FlowHead
        try:
            FlowHead.load({str(folder)!r})
        except BertflowError as e:
            print(e)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "model.safetensors does not fit its config: it holds " in done.stdout


def test_heads_that_would_give_nan_are_refused(tmp_path, head, capsys):
    import torch
    from safetensors.torch import load_file, save

    from bertflow.storage.artifacts import write_manifest

    zero = FlowHead(head.glow, type(head.standardize)(head.standardize.mean,
                                                      torch.zeros_like(head.standardize.std)),
                    encoder=head.encoder, pooling=head.pooling, max_length=head.max_length)
    with pytest.raises(BertflowError, match="standard deviation"):
        zero.save(tmp_path / "zero")
    assert not (tmp_path / "zero").exists()
    folder = head.save(tmp_path / "head")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["standardize.std"][3] = 0.0
    data = save(tensors, metadata={"format": "x"})
    (folder / "model.safetensors").write_bytes(data)
    config = json.loads((folder / "config.json").read_text())
    config["weights"]["sha256"] = __import__("hashlib").sha256(data).hexdigest()
    (folder / "config.json").write_text(json.dumps(config))
    write_manifest(folder, "bertflow-head")
    with pytest.raises(BertflowError, match="1 standard deviation.*of 0"):
        FlowHead.load(folder)
    # finite inputs far outside the data: one line, no NaN written
    good = head.save(tmp_path / "good")
    x = np.full((3, head.dim), 1e38, np.float32)
    np.save(tmp_path / "huge.npy", x)
    out = tmp_path / "z.npy"
    line = one_line_error(capsys, "transform", "--head", good, "--embeddings",
                          tmp_path / "huge.npy", "--pooling", "cls", "--out", out)
    assert "to NaN or inf" in line and not out.exists()


def test_transform_never_overwrites_its_input_and_marks_its_output(tmp_path, capsys, emb,
                                                                   tiny_encoder_dir):
    head = tmp_path / "h"
    assert run(capsys, "fit", emb, "--out", head, *FAST)[0] == 0
    before = emb.read_bytes(), emb.with_name("emb.meta.json").read_bytes()
    assert "is an input of this command" in one_line_error(
        capsys, "transform", "--head", head, "--embeddings", emb, "--out", emb)
    os.link(emb, tmp_path / "alias.npy")
    assert "is an input of this command" in one_line_error(
        capsys, "transform", "--head", head, "--embeddings", emb, "--out",
        tmp_path / "alias.npy")
    assert (emb.read_bytes(), emb.with_name("emb.meta.json").read_bytes()) == before
    (tmp_path / "mine.npy").write_bytes(b"not ours")
    assert "is not a bertflow output" in one_line_error(
        capsys, "transform", "--head", head, "--embeddings", emb, "--out",
        tmp_path / "mine.npy")

    z = tmp_path / "z.npy"
    assert run(capsys, "transform", "--head", head, "--embeddings", emb, "--out", z)[0] == 0
    meta = json.loads(z.with_name("z.meta.json").read_text())
    assert meta["format"] == "bertflow-transformed" and meta["head"]["pooling"] == "cls"
    # transformed vectors are not embeddings: fit and transform refuse them
    for args in (["fit", z, "--out", tmp_path / "h2", *FAST],
                 ["transform", "--head", head, "--embeddings", z, "--out", tmp_path / "zz.npy"]):
        assert "transformed by a flow head" in one_line_error(capsys, *args)
    # a bertflow output is replaced
    assert run(capsys, "transform", "--head", head, "--embeddings", emb, "--out", z)[0] == 0


def run_limited(kilobytes, *args, cwd):
    """`python -m bertflow ARGS` with files limited to `kilobytes` (as on a full disk)."""
    command = " ".join(map(str, [sys.executable, "-m", "bertflow", *args]))
    return subprocess.run(["bash", "-c", f"ulimit -f {kilobytes}; exec {command}"],
                          capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys, emb, corpus_file,
                                                    tiny_encoder_dir, head):
    head.save(tmp_path / "head")
    cache = ["--cache", tmp_path / "cache"]
    common = ["--head", tmp_path / "head", "--encoder", tiny_encoder_dir]
    assert run(capsys, "index", corpus_file, "--out", tmp_path / "warm", *common, *cache)[0] == 0
    cases = [
        (["fit", emb, "--out", tmp_path / "new-head", *FAST], 2, "new-head"),
        (["index", corpus_file, "--out", tmp_path / "idx", *common, *cache], 4, "idx"),
        (["export", "--format", "sentence-transformers", *common, "--out", tmp_path / "st"],
         16, "st"),
        (["export", "--format", "onnx", "--head", tmp_path / "head", "--out",
          tmp_path / "h.onnx"], 8, "h.onnx"),
    ]
    for args, kilobytes, name in cases:
        before = sorted(p.name for p in tmp_path.iterdir())
        done = run_limited(kilobytes, *args, cwd=tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
        assert "file too large (a file size limit) while writing" in lines[0], lines[0]
        assert name in lines[0]
        assert sorted(p.name for p in tmp_path.iterdir()) == before, name


def test_stale_temporaries_of_killed_saves_are_cleaned(tmp_path, head):
    folder = tmp_path / "head"
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        import bertflow.storage.files as files
        from bertflow import FlowHead
        head = FlowHead.load(sys.argv[1])
        def die(*args):
            os.kill(os.getpid(), signal.SIGKILL)
        files._replace_directory = die
        head.save({str(folder)!r})
    """)
    head.save(tmp_path / "source")
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "source")])
        assert done.returncode == -9
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".head.")]
    assert len(left) == 1  # each save removed what the one killed before it left
    (tmp_path / ".head.notes.tmp").write_text("a user's file that merely looks alike")
    head.save(folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".head.notes.tmp", "head", "source"]


def test_a_save_that_loses_the_race_for_an_absent_folder_still_lands(tmp_path, head):
    """Two processes save the same absent folder: the one that finds it made meanwhile
    replaces it, as it would an existing head, instead of failing after its work."""
    import bertflow.storage.files as files

    folder = tmp_path / "head"
    real = files._replace_directory

    def other_process_wins_first(new, target, recheck):
        files._replace_directory = real
        head.save(target)  # made while this save was writing
        real(new, target, recheck)

    files._replace_directory = other_process_wins_first
    try:
        head.save(folder)
    finally:
        files._replace_directory = real
    FlowHead.load(folder)
    assert [p.name for p in tmp_path.iterdir()] == ["head"]

    # a folder of someone else's made meanwhile is not replaced
    def user_makes_it(new, target, recheck):
        files._replace_directory = real
        target.mkdir()
        (target / "mine.txt").write_text("mine")
        real(new, target, recheck)

    files._replace_directory = user_makes_it
    try:
        with pytest.raises(BertflowError, match="not a flow head"):
            head.save(tmp_path / "other")
    finally:
        files._replace_directory = real
    assert (tmp_path / "other" / "mine.txt").read_text() == "mine"


def test_a_folder_format_writes_checks_and_reads_its_folders(tmp_path):
    from bertflow.storage.artifacts import write_manifest

    kind = FolderFormat("x-thing", "a thing", "thing", version=2, config="config.json")
    other = FolderFormat("y-thing", "a y-thing", "y-thing")

    def fill(version):
        def write(folder):
            (folder / "config.json").write_text(json.dumps({"format": "x-thing",
                                                            "format_version": version}))
            (folder / "data").write_text("d")
        return write

    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "a.txt").write_text("a")
    with pytest.raises(BertflowError, match="a non-empty folder but not a thing"):
        kind.write(tmp_path / "plain", fill(2))
    made = kind.write(tmp_path / "t", fill(2))
    assert kind.read(made)["format_version"] == 2
    assert set(kind.verify(made)) == {"config.json", "data"}
    with pytest.raises(BertflowError, match="is a x-thing folder, not a y-thing"):
        other.verify(made)
    with pytest.raises(BertflowError, match="is a x-thing folder, not a y-thing; not replacing"):
        other.check_destination(made)
    kind.write(made, fill(3))  # replaced: it is a thing and holds nothing else
    with pytest.raises(BertflowError, match="has thing format version 3; this bertflow reads "
                                            "version 2"):
        kind.read(made)
    kind.write(made, fill(2))
    (made / "data").write_text("altered")
    with pytest.raises(BertflowError, match="data does not match the checksum in manifest"):
        kind.read(made)
    for files, message in [({"../data": "0"}, "lists a file outside the folder: ../data"),
                           ({"gone": "0"}, "is missing gone, which its manifest lists")]:
        (made / "manifest.json").write_text(json.dumps({"format": "bertflow-manifest",
                                                        "kind": "x-thing", "files": files}))
        with pytest.raises(BertflowError, match=message):
            kind.read(made)
    (made / "config.json").write_text(json.dumps({"format": "y-thing", "format_version": 2}))
    write_manifest(made, "x-thing")
    with pytest.raises(BertflowError, match="is not a thing"):
        kind.read(made)
    (made / "manifest.json").unlink()
    with pytest.raises(BertflowError, match="no manifest.json: the thing is incomplete"):
        kind.read(made)
    with pytest.raises(BertflowError, match="a non-empty folder but not a thing"):
        kind.check_destination(made)  # without its manifest, it is not bertflow's


# Every command that writes files, run in one process (the embedding cache inside the folder it
# runs in): what it leaves must not depend on the process's hash seed. (A training checkpoint
# records each epoch's seconds, and torch.save a random id: it is left out.)
EVERY_OUTPUT = """
import sys
from bertflow.cli.main import main
enc, corpus, data = sys.argv[1:]
cache = ["--cache", "cache", "--quiet"]
for args in (
    ["encode", corpus, "--out", "e.npy", "--encoder", enc, "--pooling", "cls", *cache],
    ["fit", "e.npy", "--out", "head", "--epochs", "1", "--levels", "1", "--depth", "2",
     "--quiet"],
    ["fit", "e.npy", "--out", "abtt", "--method", "abtt"],
    ["index", corpus, "--head", "head", "--out", "index", "--kind", "hnsw", *cache],
    ["export", "--head", "head", "--format", "sentence-transformers", "--out", "st"],
    ["transform", "--head", "head", "--embeddings", "e.npy", "--out", "z.npy"],
    ["eval", "sts", data, "--head", "head", "--out", "rows.json", *cache],
):
    assert main(args) == 0, args
"""


def test_every_output_has_the_same_bytes_whatever_the_hash_seed(tmp_path, tiny_encoder_dir,
                                                                 corpus_file):
    """Manifests and every other file bertflow writes (JSON built from sets or dicts included)
    are byte for byte the same in processes of different PYTHONHASHSEED."""
    from ..data.test_sts import write_stsb

    write_stsb(tmp_path / "data" / "STSBenchmark", rows_per_split=6)
    made = {}
    for seed in ("1", "2"):
        (tmp_path / seed).mkdir()
        done = subprocess.run([sys.executable, "-c", EVERY_OUTPUT, str(tiny_encoder_dir),
                               str(corpus_file), str(tmp_path / "data")], cwd=tmp_path / seed,
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr[-3000:]
        made[seed] = {str(p.relative_to(tmp_path / seed)): p.read_bytes()
                      for p in sorted((tmp_path / seed).rglob("*")) if p.is_file()}
    assert {"head/manifest.json", "abtt/manifest.json", "index/manifest.json",
            "st/manifest.json", "rows.json", "z.meta.json"} <= made["1"].keys()
    assert made["1"].keys() == made["2"].keys()
    assert [name for name in made["1"] if made["1"][name] != made["2"][name]] == []
    # the one reader tells each of them by its own description
    from bertflow.storage import artifacts

    for name, kind in [("e.npy", artifacts.EMBEDDINGS), ("head", artifacts.HEAD_FOLDER),
                       ("abtt", artifacts.HEAD_FOLDER), ("index", artifacts.INDEX_FOLDER),
                       ("st", artifacts.PIPELINE_FOLDER), ("z.npy", artifacts.TRANSFORMED),
                       ("rows.json", artifacts.ROWS)]:
        assert artifacts.identify(tmp_path / "1" / name)[0] is kind, name


def test_one_reader_tells_every_output_and_refuses_the_users_files(tmp_path, capsys, head):
    """`identify` (and `bertflow info`) knows a checkpoint, a .pt2 export and an MTEB result
    file as well as the outputs above, checks a record's version, and refuses anything else."""
    import torch

    from bertflow.evaluation.retrieval import write_mteb
    from bertflow.export.graphs import export_program
    from bertflow.storage import artifacts
    from bertflow.training.checkpoint import Checkpoint
    from bertflow.training.trainer import History, TrainState

    Checkpoint(TrainState(1, 3, {"w": torch.ones(2)}, {}, {}, History(), 0),
               {"train": {"epochs": 2}}).save(tmp_path / "ck.pt")
    export_program(head, tmp_path / "h.pt2")
    row = {"task": "scifact", "split": "test", "mteb": {"ndcg_at_10": 0.5}}
    write_mteb(tmp_path / "mteb", row)
    for name, kind in [("ck.pt", artifacts.CHECKPOINT), ("h.pt2", artifacts.PT2_EXPORT),
                       ("mteb/SciFact.json", artifacts.MTEB_RESULT)]:
        assert artifacts.identify(tmp_path / name)[0] is kind, name
    code, out, err = run(capsys, "info", tmp_path / "ck.pt")
    fields = dict(line.split(None, 1) for line in out.strip().splitlines())
    assert code == 0 and fields["kind"] == "training checkpoint", err
    assert fields["run.train.epochs"] == "2" and fields["state.step"] == "3"
    assert not any(name.startswith("state.model") for name in fields)  # tensors left out
    code, out, _ = run(capsys, "info", tmp_path / "ck.pt", "--json")  # strict JSON: no Infinity
    assert json.loads(out, parse_constant=lambda c: 1 / 0)["state"]["history"]["best_val_nll"] \
        == "inf"
    code, out, _ = run(capsys, "info", tmp_path / "mteb/SciFact.json", "--json")
    assert code == 0 and json.loads(out)["task_name"] == "SciFact"

    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a").write_text("a")
    old = tmp_path / "old.npy"
    np.save(old, np.ones((2, 2), np.float32))
    (tmp_path / "old.meta.json").write_text(json.dumps({"format": "bertflow-embeddings",
                                                        "format_version": 1}))
    for path, message in [("notes.txt", "is not a file bertflow wrote"),
                          ("mine", "is not a folder bertflow wrote (no bertflow manifest)"),
                          ("old.npy", "has embeddings format version 1; this bertflow reads "
                                      "version 2")]:
        assert one_line_error(capsys, "info", tmp_path / path).endswith(message), path


def test_the_formats_page_names_every_kind_of_output():
    """docs/formats.md's table has a row for each kind `identify` tells, by its noun."""
    from bertflow.storage import artifacts

    rows = {line.split("|")[1].strip() for line in (REPO / "docs" / "formats.md").read_text()
            .splitlines() if line.startswith("| ")}
    kinds = [*artifacts._FOLDERS.values(), *artifacts._FILES]
    assert {kind.noun for kind in kinds} <= rows and len(kinds) == 13
