"""`bertflow fit` leaves what it did not make alone: checkpoints, log folders, bad options,
constant data."""

import json
import os
import zipfile

import numpy as np
import pytest
import torch

from bertflow import BertflowError, FlowConfig, FlowHead, TrainConfig, fit_head
from bertflow.cli.main import main

from ..conftest import REPO

SMALL = ["--epochs", "1", "--levels", "1", "--depth", "2", "--quiet"]


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, args, message):
    """Run a command that must fail with one line naming `message`."""
    code, out, err = run(capsys, *args)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("bertflow: error: ") and message in lines[0], lines[0]


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


@pytest.fixture
def npy(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).normal(size=(60, 16)).astype(np.float32))
    return path


@pytest.fixture
def no_training(monkeypatch):
    """Any training is a test failure: the refusals come before it."""
    import bertflow.training.job

    def fail(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(bertflow.training.job, "fit_head", fail)


# --checkpoint is never an input or an output of the run ---------------------------------------

def test_checkpoint_that_is_the_input_or_an_output_is_refused_before_training(
    tmp_path, capsys, npy, no_training
):
    sidecar = tmp_path / "x.meta.json"
    (tmp_path / "out").mkdir()
    (tmp_path / "logs").mkdir()
    os.symlink(npy, tmp_path / "link.npy")
    os.link(npy, tmp_path / "hard.npy")
    before = npy.read_bytes()
    base = ["fit", npy, "--pooling", "cls", "--out", tmp_path / "out", "--logdir",
            tmp_path / "logs", *SMALL]
    for checkpoint, message in [
        (npy, "the input"),
        (tmp_path / "link.npy", "the input"),
        (tmp_path / "hard.npy", "the input"),
        (tmp_path / "sub" / ".." / "x.npy", "the input"),
        (sidecar, "sidecar"),
        (tmp_path / "out", "folder"),
        (tmp_path / "out" / "state.pt", "--out"),
        (tmp_path / "new-out" / "state.pt", "--out"),
        (tmp_path / "logs" / "state.pt", "--logdir"),
    ]:
        args = [*base, "--checkpoint", checkpoint]
        if "new-out" in str(checkpoint):
            args[args.index(tmp_path / "out")] = tmp_path / "new-out"
        refused(capsys, args, message)
        refused(capsys, [*args, "--resume"], message)
    assert npy.read_bytes() == before and not sidecar.exists()
    assert not any((tmp_path / "out").iterdir()) and not any((tmp_path / "logs").iterdir())


def test_the_head_may_be_written_inside_the_log_folder(tmp_path, capsys, npy):
    """A run only adds its own subfolder to --logdir, so the head may go inside it; the log
    folder may not go inside the head, which a save replaces."""
    code, out, err = run(capsys, "fit", npy, "--pooling", "cls", "--out", tmp_path / "runs" /
                         "head", "--logdir", tmp_path / "runs", *SMALL)
    assert code == 0, err
    FlowHead.load(tmp_path / "runs" / "head")
    assert len([p for p in (tmp_path / "runs").iterdir() if p.name != "head"]) == 1
    refused(capsys, ["fit", npy, "--pooling", "cls", "--out", tmp_path / "h", "--logdir",
                     tmp_path / "h" / "runs", *SMALL], "inside another output")


def test_checkpoint_in_the_embedding_cache_or_the_encoder_is_refused(
    tmp_path, capsys, corpus_file, tiny_encoder_dir, no_training
):
    cache = tmp_path / "cache"
    base = ["fit", corpus_file, "--out", tmp_path / "h", "--encoder", tiny_encoder_dir,
            "--cache", cache, *SMALL]
    refused(capsys, [*base, "--checkpoint", corpus_file], "the input")
    refused(capsys, [*base, "--checkpoint", cache / "state.pt"], "embedding cache")
    refused(capsys, [*base, "--checkpoint", tiny_encoder_dir / "new.pt"], "encoder")
    assert not cache.exists() or not any(cache.rglob("*.npy"))


def test_existing_file_that_is_not_a_bertflow_checkpoint_is_not_overwritten(
    tmp_path, capsys, npy, no_training
):
    text = tmp_path / "notes.txt"
    text.write_text("precious\n")
    archive = tmp_path / "other.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("a/data.pkl", b"not a pickle")
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.ones(3)}, foreign)

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "pwned"),))

    evil = tmp_path / "evil.pt"
    torch.save({"run": {}, "state": Payload()}, evil)
    files = [text, archive, foreign, evil, tmp_path / "empty.pt"]
    (tmp_path / "empty.pt").write_bytes(b"")
    before = {f: f.read_bytes() for f in files}
    for checkpoint in files:
        for resume in ([], ["--resume"]):
            refused(capsys, ["fit", npy, "--pooling", "cls", "--out", tmp_path / "h",
                             "--checkpoint", checkpoint, *resume, *SMALL],
                    "is not a bertflow training checkpoint")
    assert {f: f.read_bytes() for f in files} == before
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "h").exists()


def test_checkpoint_of_another_run_is_refused_unless_it_is_this_run(tmp_path, capsys, npy,
                                                                   monkeypatch):
    import bertflow.training.checkpoint

    ckpt = tmp_path / "state.pt"
    base = ["fit", npy, "--pooling", "cls", "--checkpoint", ckpt, *SMALL]
    assert run(capsys, *base, "--out", tmp_path / "a")[0] == 0
    before = ckpt.read_bytes()
    reads, read = [], bertflow.training.checkpoint.open_checkpoint
    monkeypatch.setattr(bertflow.training.checkpoint, "open_checkpoint",
                        lambda path, **kw: reads.append(path) or read(path, **kw))
    refused(capsys, [*base, "--out", tmp_path / "b", "--seed", "3"], "other settings or data")
    assert len(reads) == 1  # read once, before any work
    refused(capsys, [*base, "--out", tmp_path / "b", "--seed", "3", "--resume"],
            "other settings or data")
    assert ckpt.read_bytes() == before and not (tmp_path / "b").exists()
    code, _, err = run(capsys, *base, "--out", tmp_path / "c")  # the same run starts afresh
    assert code == 0, err


def test_a_run_does_not_read_back_the_checkpoints_it_wrote(tmp_path, capsys, npy, monkeypatch):
    import bertflow.training.checkpoint

    reads, read = [], bertflow.training.checkpoint.open_checkpoint
    monkeypatch.setattr(bertflow.training.checkpoint, "open_checkpoint",  # a file there, read
                        lambda path, **kw: reads.extend([path] * path.exists()) or read(path, **kw))
    code, _, err = run(capsys, "fit", npy, "--pooling", "cls", "--out", tmp_path / "h",
                       "--checkpoint", tmp_path / "state.pt", *SMALL, "--epochs", "3")
    assert code == 0, err
    assert reads == [] and read(tmp_path / "state.pt").state.epoch == 3


def test_a_failure_of_a_resumed_fit_is_not_blamed_on_the_checkpoint(tmp_path, capsys, npy,
                                                                    monkeypatch):
    import bertflow.training.trainer

    base = ["fit", npy, "--pooling", "cls", "--checkpoint", tmp_path / "state.pt", *SMALL]
    assert run(capsys, *base, "--out", tmp_path / "a")[0] == 0

    def out_of_memory(*args):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(bertflow.training.trainer._Trainer, "train", out_of_memory)
    refused(capsys, [*base, "--epochs", "2", "--resume", "--out", tmp_path / "b"],
            "unexpected RuntimeError: CUDA out of memory")


def test_checkpoint_save_and_read(tmp_path):
    from bertflow.training.checkpoint import Checkpoint, open_checkpoint

    states = []
    x = np.random.default_rng(0).normal(size=(60, 8)).astype(np.float32)
    fit_head(x, flow=FlowConfig(levels=1, depth=2), train=TrainConfig(epochs=1),
                 on_epoch_end=states.append)
    path = tmp_path / "state.pt"
    Checkpoint(states[0], {"seed": 0}, logs="20260101-000000-seed0").save(path)
    loaded = open_checkpoint(path)
    assert loaded.state.epoch == 1
    assert loaded.state.history.best_epoch == states[0].history.best_epoch
    assert loaded.logs == "20260101-000000-seed0"
    assert open_checkpoint(tmp_path / "absent.pt") is None
    with pytest.raises(BertflowError, match="other settings or data"):
        loaded.check(path, {"seed": 1}, extended=False)
    (tmp_path / "bad.pt").write_text("x")
    with pytest.raises(BertflowError, match="is not a bertflow training checkpoint"):
        open_checkpoint(tmp_path / "bad.pt")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_checkpoint_of_another_version_or_without_the_format_is_refused(tmp_path, capsys,
                                                                          npy, no_training):
    from bertflow.storage.artifacts import CHECKPOINT

    saved = {"run": {}, "logs": None, "state": {"epoch": 1}}
    torch.save({"format": CHECKPOINT.kind, "format_version": 1, **saved}, tmp_path / "v1.pt")
    torch.save(saved, tmp_path / "unmarked.pt")
    for name, message in [("v1.pt", "v1.pt has training checkpoint format version 1; "
                           "this bertflow reads version 2"),
                          ("unmarked.pt", "unmarked.pt is not a bertflow training checkpoint")]:
        refused(capsys, ["fit", npy, "--pooling", "cls", "--out", tmp_path / "h",
                         "--checkpoint", tmp_path / name, "--resume", *SMALL], message)


def test_a_full_disk_while_writing_the_checkpoint_is_one_line(tmp_path, capsys, npy):
    resource = pytest.importorskip("resource")
    import signal

    ckpt = tmp_path / "state.pt"
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, old_limit[1]))
    try:
        code, _, err = run(capsys, "fit", npy, "--pooling", "cls", "--out", tmp_path / "h",
                           "--checkpoint", ckpt, *SMALL)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "file too large" in err and f"while writing {ckpt}" in err
    assert not ckpt.exists() and not (tmp_path / "h").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".state.pt")]


# --logdir: each run in its own new subfolder; a failed run leaves the folder as it was -------

def test_failed_fit_leaves_an_existing_logdir_as_it_was(tmp_path, capsys, npy, monkeypatch):
    import bertflow.training.job

    def diverge(*args, **kwargs):
        kwargs["hook"].scalars(1, {"nll": 1.0})
        raise BertflowError("non-finite loss (nan) at step 3 (epoch 1)")

    logdir = tmp_path / "runs"
    (logdir / "earlier").mkdir(parents=True)
    (logdir / "earlier" / "events.out").write_text("old")
    before = snapshot(logdir)
    monkeypatch.setattr(bertflow.training.job, "fit_head", diverge)
    refused(capsys, ["fit", npy, "--pooling", "cls", "--out", tmp_path / "h", "--logdir", logdir,
                     *SMALL], "non-finite loss")
    assert snapshot(logdir) == before
    # a failed run with a --checkpoint but no epoch saved cannot be resumed either
    refused(capsys, ["fit", npy, "--pooling", "cls", "--out", tmp_path / "h", "--logdir", logdir,
                     "--checkpoint", tmp_path / "state.pt", *SMALL], "non-finite loss")
    assert snapshot(logdir) == before
    nested = tmp_path / "new" / "deeper" / "runs"
    refused(capsys, ["fit", npy, "--pooling", "cls", "--out", tmp_path / "h", "--logdir", nested,
                     *SMALL], "non-finite loss")
    assert not (tmp_path / "new").exists()


def test_each_run_logs_to_its_own_subfolder_and_a_resumed_run_continues_it(
    tmp_path, capsys, npy, monkeypatch
):
    logdir, ckpt = tmp_path / "runs", tmp_path / "state.pt"
    base = ["fit", npy, "--pooling", "cls", "--logdir", logdir, "--levels", "1", "--depth", "2",
            "--patience", "0", "--epochs", "3", "--quiet", "--seed", "4"]
    assert run(capsys, *base, "--out", tmp_path / "a")[0] == 0
    [first] = logdir.iterdir()
    assert first.is_dir() and first.name.endswith("-seed4") and any(first.iterdir())

    saves, real_save = [], torch.save

    def interrupt_second_save(obj, f):
        saves.append(f)
        if len(saves) == 2:
            raise KeyboardInterrupt
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", interrupt_second_save)
    code, _, _ = run(capsys, *base, "--out", tmp_path / "b", "--checkpoint", ckpt)
    monkeypatch.undo()
    assert code == 130
    [second] = set(logdir.iterdir()) - {first}
    events = set(second.iterdir())
    assert events  # kept: the checkpoint can resume it
    code, _, err = run(capsys, *base, "--out", tmp_path / "b", "--checkpoint", ckpt, "--resume")
    assert code == 0, err
    assert set(logdir.iterdir()) == {first, second} and set(second.iterdir()) > events


# constant data -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["zeros", "identical"])
def test_constant_embeddings_are_named_as_such(kind):
    x = np.zeros((50, 16), np.float32)
    if kind == "identical":
        x[:] = np.random.default_rng(0).normal(size=16).astype(np.float32) * 10
    for before in ("standardize", "none"):
        with pytest.raises(BertflowError, match="constant: every row is the same"):
            fit_head(x, flow=FlowConfig(levels=1, depth=2), train=TrainConfig(epochs=1),
                         before=before)


def test_partly_constant_embeddings_still_fit():
    x = np.random.default_rng(0).normal(size=(80, 8)).astype(np.float32)
    x[:, 2] = 3.0
    x[:, 5] = 0.0
    head = fit_head(x, flow=FlowConfig(levels=1, depth=2), train=TrainConfig(epochs=2))
    assert np.isfinite(head.history.best_val_nll)


def test_a_validation_split_that_leaves_under_3_training_rows_is_refused(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(40, 16)).astype(np.float32))
    refused(capsys, ["fit", tmp_path / "x.npy", "--pooling", "cls", "--out", tmp_path / "h",
                     "--val-fraction", "0.99", *SMALL],
            "need at least 3 training rows: 40 rows, 40 of them held out for validation")
    assert not (tmp_path / "h").exists()


def test_fit_on_a_constant_npy_or_a_corpus_of_one_sentence_says_so(
    tmp_path, capsys, tiny_encoder_dir
):
    np.save(tmp_path / "zeros.npy", np.zeros((40, 16), np.float32))
    refused(capsys, ["fit", tmp_path / "zeros.npy", "--pooling", "cls", "--out", tmp_path / "h",
                     *SMALL], "the training embeddings are constant")
    (tmp_path / "same.txt").write_text("a man plays the guitar\n" * 30)
    refused(capsys, ["fit", tmp_path / "same.txt", "--out", tmp_path / "h", "--encoder",
                     tiny_encoder_dir, "--cache", tmp_path / "cache", *SMALL],
            "the training embeddings are constant")
    assert not (tmp_path / "h").exists()


# numeric options are checked when parsed -------------------------------------------------------

@pytest.mark.parametrize(
    "command,option,value",
    [
        ("fit", "--encode-batch-size", "0"),
        ("fit", "--max-length", "1"),
        ("fit", "--levels", "0"),
        ("fit", "--depth", "0"),
        ("fit", "--hidden", "-3"),
        ("fit", "--epochs", "0"),
        ("fit", "--batch-size", "0"),
        ("fit", "--lr", "0"),
        ("fit", "--lr", "nan"),
        ("fit", "--val-fraction", "1"),
        ("fit", "--val-fraction", "-0.1"),
        ("fit", "--patience", "-1"),
        ("fit", "--seed", "-1"),
        ("fit", "--seed", "99999999999999999"),
        ("fit", "--epochs", "two"),
        ("encode", "--encode-batch-size", "0"),
        ("encode", "--max-length", "1"),
        ("transform", "--encode-batch-size", "0"),
        ("eval", "--encode-batch-size", "0"),
        ("eval", "--dims", "0"),
        ("eval", "--d", "-1"),
        ("eval", "--epochs", "0"),
        ("diagnose", "--encode-batch-size", "-2"),
        ("diagnose", "--levels", "0"),
        ("fit", "--depth", "1000000000"),
        ("fit", "--levels", "17"),
        ("eval", "--hidden", "100000"),
        ("diagnose", "--depth", "257"),
        ("index", "--encode-batch-size", "0"),
        ("index", "--max-length", "0"),
        ("index", "--dims", "0"),
        ("search", "--top", "0"),
    ],
)
def test_numeric_options_are_refused_when_parsed(tmp_path, capsys, command, option, value):
    required = {
        "fit": [tmp_path / "c.txt", "--out", tmp_path / "h"],
        "encode": [tmp_path / "c.txt", "--out", tmp_path / "e.npy"],
        "transform": ["--head", tmp_path / "h", "--embeddings", tmp_path / "e.npy", "--out",
                      tmp_path / "z.npy"],
        "eval": ["sts", tmp_path, "--out", tmp_path / "r.json"],
        "diagnose": [tmp_path / "c.txt", "--out", tmp_path / "plots"],
        "index": [tmp_path / "c.txt", "--out", tmp_path / "i"],
        "search": ["--index", tmp_path / "i", "--query", "q"],
    }[command]
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in [command, *required, option, value]])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"argument {option}" in err, err
    assert list(tmp_path.iterdir()) == []


def test_encode_batch_size_zero_is_refused_even_when_the_corpus_is_cached(
    tmp_path, capsys, corpus_file, tiny_encoder_dir
):
    base = ["fit", corpus_file, "--encoder", tiny_encoder_dir, "--cache", tmp_path / "cache",
            *SMALL]
    assert run(capsys, *base, "--out", tmp_path / "a")[0] == 0
    with pytest.raises(SystemExit) as exit_info:
        run(capsys, *base, "--out", tmp_path / "b", "--encode-batch-size", "0")
    assert exit_info.value.code == 2 and not (tmp_path / "b").exists()


def test_config_from_dict_refuses_unknown_keys_and_reads_the_shipped_head():
    with pytest.raises(BertflowError, match="unknown training config keys: lerning_rate"):
        TrainConfig.from_dict({"epochs": 2, "lerning_rate": 0.1})
    with pytest.raises(BertflowError, match="unknown flow config keys: width"):
        FlowConfig.from_dict({"levels": 2, "width": 3})
    config = json.loads((REPO / "checkpoints" / "minilm-first_last-wiki" /
                         "config.json").read_text())
    assert TrainConfig.from_dict(config["training"]["config"]).to_dict() == \
        config["training"]["config"]
    assert FlowConfig.from_dict(config["flow"]).to_dict() == config["flow"]


def test_a_flow_too_large_for_the_width_is_refused_before_encoding(
    tmp_path, capsys, npy, corpus_file, tiny_encoder_dir, monkeypatch, no_training
):
    import bertflow.embeddings.cache

    def fail(*args, **kwargs):
        raise AssertionError("encoding started")

    monkeypatch.setattr(bertflow.embeddings.cache, "write_embeddings", fail)
    data = tmp_path / "data"
    from ..data.test_sts import write_stsb

    write_stsb(data / "STSBenchmark", rows_per_split=6)
    common = ["--encoder", tiny_encoder_dir, "--cache", tmp_path / "cache", "--quiet"]
    for args, message in [
        (["fit", npy, "--pooling", "cls", "--out", tmp_path / "h", "--levels", "5"],
         "5 levels halve 16 features below 2"),
        (["fit", corpus_file, "--out", tmp_path / "h", "--levels", "5", *common],
         "5 levels halve 16 features below 2"),
        (["fit", corpus_file, "--out", tmp_path / "h", "--hidden", "16384", "--depth", "2",
          *common], "parameters, more than 268,435,456"),
        (["eval", "sts", data, "--levels", "5", *common], "5 levels halve 16 features"),
        (["diagnose", corpus_file, "--out", tmp_path / "p", "--depth", "256", "--hidden",
          "8192", *common], "parameters, more than"),
    ]:
        refused(capsys, args, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "data", "x.npy"]


@pytest.mark.parametrize("moment", ["before training", "while written", "over a checkpoint"])
def test_a_file_made_at_checkpoint_while_fit_ran_is_kept(tmp_path, capsys, monkeypatch, npy,
                                                         moment):
    """Made while the data is read (before training starts), while a checkpoint is being
    written, or over the checkpoint of the epoch before, the user's file at --checkpoint is
    kept, and the fit fails in one line."""
    import bertflow.training.checkpoint
    import bertflow.training.job

    from ..embeddings.test_outputs import (
        made_by_the_user,
        made_while_written,
        refused_keeping_the_users,
    )

    out = tmp_path / "out"
    out.mkdir()
    if moment == "before training":
        made_by_the_user(monkeypatch, bertflow.training.job, "_train", out / "ck.pt")
    elif moment == "while written":
        made_while_written(monkeypatch, out / "ck.pt")
    else:
        made_by_the_user(monkeypatch, bertflow.training.checkpoint.Checkpoint, "save",
                         out / "ck.pt", after=True)
    refused_keeping_the_users(
        capsys, ["fit", npy, "--pooling", "cls", "--out", tmp_path / "head", "--checkpoint",
                 out / "ck.pt", "--epochs", "2", "--levels", "1", "--depth", "2", "--quiet"], out,
        "ck.pt is not a bertflow training checkpoint; not overwriting it")
    assert not (tmp_path / "head").exists()
