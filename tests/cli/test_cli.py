import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertflow import FlowHead
from bertflow.cli.main import main

from ..conftest import REPO

FAST = ["--epochs", "2", "--levels", "2", "--depth", "2", "--quiet"]


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(capsys, args, message, leftover):
    code, out, err = run(capsys, *args)
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bertflow: error: ") and message in lines[0], lines[0]
    assert not leftover.exists(), f"{leftover} was left behind"
    assert not [p for p in leftover.parent.iterdir() if p.name.startswith(f".{leftover.name}")]


@pytest.fixture
def fitted(tmp_path, capsys, corpus_file, tiny_encoder_dir):
    head = tmp_path / "head"
    code, out, err = run(capsys, "fit", corpus_file, "--out", head, "--encoder", tiny_encoder_dir,
                         "--pooling", "cls", "--cache", tmp_path / "cache", *FAST)
    assert code == 0, err
    return head


def test_encode_fit_transform_info(tmp_path, capsys, corpus_file, tiny_encoder_dir):
    emb = tmp_path / "emb.npy"
    code, out, err = run(capsys, "encode", corpus_file, "--out", emb, "--encoder",
                         tiny_encoder_dir, "--pooling", "first_last")
    assert code == 0, err
    assert "120 × 16" in out
    meta = json.loads((tmp_path / "emb.meta.json").read_text())
    assert meta["pooling"] == "first_last" and meta["count"] == 120

    head = tmp_path / "head"
    code, out, err = run(capsys, "fit", emb, "--out", head, "--seed", "1", *FAST)
    assert code == 0, err
    assert "best epoch" in out
    loaded = FlowHead.load(head)
    assert loaded.pooling == "first_last" and loaded.dim == 16

    z_emb, z_txt = tmp_path / "z1.npy", tmp_path / "z2.npy"
    assert run(capsys, "transform", "--head", head, "--embeddings", emb, "--out", z_emb)[0] == 0
    code, out, err = run(capsys, "transform", "--head", head, "--sentences", corpus_file,
                         "--out", z_txt, "--encoder", tiny_encoder_dir)
    assert code == 0, err
    np.testing.assert_allclose(np.load(z_emb), np.load(z_txt), atol=1e-5)
    np.testing.assert_allclose(np.load(z_emb), loaded.transform(np.load(emb)), atol=1e-6)
    cache = tmp_path / "cache"  # --sentences are encoded into the cache once, then read
    stamps = []
    for _ in range(2):
        code, out, err = run(capsys, "transform", "--head", head, "--sentences", corpus_file,
                             "--out", z_txt, "--encoder", tiny_encoder_dir, "--cache", cache)
        assert code == 0, err
        np.testing.assert_allclose(np.load(z_emb), np.load(z_txt), atol=1e-5)
        kept, = cache.rglob("*.npy")
        stamps.append((kept.stat().st_ino, kept.stat().st_mtime_ns))
    assert np.load(kept).shape == (120, 16) and stamps[0] == stamps[1]

    code, out, err = run(capsys, "info", head)
    assert code == 0
    assert "first_last" in out and "120 rows" in out and "Glow: 2 levels" in out
    code, out, err = run(capsys, "info", head, "--json")
    assert json.loads(out)["dim"] == 16


def test_same_command_twice_gives_the_same_head_bit_for_bit(
    tmp_path, capsys, corpus_file, tiny_encoder_dir
):
    for name in ("a", "b"):
        code, _, err = run(capsys, "fit", corpus_file, "--out", tmp_path / name, "--encoder",
                           tiny_encoder_dir, "--cache", tmp_path / f"cache-{name}", *FAST)
        assert code == 0, err
    for file in ("model.safetensors", "config.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()


def test_interrupted_fit_resumes_to_the_same_head(
    tmp_path, capsys, corpus_file, tiny_encoder_dir, monkeypatch
):
    import torch

    base = ["fit", corpus_file, "--encoder", tiny_encoder_dir, "--cache", tmp_path / "cache",
            "--levels", "1", "--depth", "2", "--patience", "0", "--quiet", "--epochs", "3"]
    assert run(capsys, *base, "--out", tmp_path / "straight")[0] == 0

    ckpt, saves, real_save = tmp_path / "state.pt", [], torch.save

    def interrupt_third_save(obj, f):
        saves.append(f)
        if len(saves) == 3:
            raise KeyboardInterrupt
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", interrupt_third_save)
    code, _, _ = run(capsys, *base, "--out", tmp_path / "resumed", "--checkpoint", ckpt,
                     "--logdir", tmp_path / "tb")
    monkeypatch.undo()
    assert code == 130 and not (tmp_path / "resumed").exists()
    assert torch.load(ckpt, weights_only=True)["state"]["epoch"] == 2
    assert any((tmp_path / "tb").iterdir())

    code, _, err = run(capsys, *base, "--out", tmp_path / "resumed", "--checkpoint", ckpt,
                       "--resume")
    assert code == 0, err
    straight = (tmp_path / "straight" / "model.safetensors").read_bytes()
    assert (tmp_path / "resumed" / "model.safetensors").read_bytes() == straight

    other = tmp_path / "other"  # a resume may extend a run (test_tensorboard), not shorten it
    assert_refused(capsys, [*base[:-1], "2", "--out", other, "--checkpoint", ckpt, "--resume"],
                   "other settings", other)


def test_bad_corpora(tmp_path, capsys, tiny_encoder_dir):
    out = tmp_path / "e.npy"
    assert_refused(capsys, ["encode", tmp_path / "missing.txt", "--out", out], "no such file", out)
    (tmp_path / "empty.txt").write_text("")
    assert_refused(capsys, ["encode", tmp_path / "empty.txt", "--out", out], "is empty", out)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    assert_refused(capsys, ["encode", tmp_path / "latin1.txt", "--out", out], "not UTF-8", out)
    head = tmp_path / "head"
    assert_refused(capsys, ["fit", tmp_path / "empty.txt", "--out", head], "is empty", head)


def test_bad_embeddings(tmp_path, capsys, fitted):
    out = tmp_path / "z.npy"
    np.save(tmp_path / "wide.npy", np.zeros((5, 24), np.float32))
    assert_refused(capsys, ["transform", "--head", fitted, "--embeddings", tmp_path / "wide.npy",
                            "--out", out], "no wide.meta.json sidecar; pass --pooling", out)
    assert_refused(capsys, ["transform", "--head", fitted, "--embeddings", tmp_path / "wide.npy",
                            "--pooling", "cls", "--out", out], "expects 16-d embeddings", out)
    np.save(tmp_path / "narrow.npy", np.ones((5, 16), np.float32))
    assert_refused(capsys, ["transform", "--head", fitted, "--embeddings",
                            tmp_path / "narrow.npy", "--pooling", "mean", "--out", out],
                   "fit on cls pooling", out)
    nan = np.ones((5, 16), np.float32)
    nan[3, 1] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    assert_refused(capsys, ["transform", "--head", fitted, "--embeddings", tmp_path / "nan.npy",
                            "--pooling", "cls", "--out", out], "NaN values (first in row 3)", out)
    head = tmp_path / "head2"
    assert_refused(capsys, ["fit", tmp_path / "nan.npy", "--out", head, "--pooling", "cls"],
                   "NaN", head)
    np.save(tmp_path / "plain.npy", np.ones((50, 16), np.float32))
    assert_refused(capsys, ["fit", tmp_path / "plain.npy", "--out", head], "--pooling", head)


def test_mismatched_head(tmp_path, capsys, fitted, corpus_file, other_encoder_dir,
                         tiny_encoder_dir, wide_encoder_dir):
    out = tmp_path / "z.npy"
    assert_refused(capsys, ["transform", "--head", fitted, "--sentences", corpus_file,
                            "--encoder", other_encoder_dir, "--out", out],
                   "but these come from encoder", out)
    emb = tmp_path / "mean.npy"
    run(capsys, "encode", corpus_file, "--out", emb, "--encoder", tiny_encoder_dir,
        "--pooling", "mean")
    assert_refused(capsys, ["transform", "--head", fitted, "--embeddings", emb, "--out", out],
                   "fit on cls pooling, but these embeddings use mean pooling", out)
    for encoder, options, message in (
            (tiny_encoder_dir, ["--max-length", "16"],
             "fit on embeddings of at most 128 tokens, but these were cut at 16"),
            (wide_encoder_dir, [],
             "cls pooling), got 24-d embeddings from encoder tiny-bert-wide")):
        other = tmp_path / f"{encoder.name}.npy"
        run(capsys, "encode", corpus_file, "--out", other, "--encoder", encoder, "--pooling",
            "cls", *options)
        assert_refused(capsys, ["transform", "--head", fitted, "--embeddings", other,
                                "--out", out], message, out)
    assert_refused(capsys, ["transform", "--head", tmp_path / "nohead", "--embeddings", emb,
                            "--out", out], "no flow head folder", out)
    (fitted / "model.safetensors").write_bytes(b"garbage")
    assert_refused(capsys, ["transform", "--head", fitted, "--embeddings", emb, "--out", out],
                   "altered or truncated", out)


def test_unknown_pooling_and_usage_errors_are_one_line(tmp_path, capsys, corpus_file):
    out = tmp_path / "e.npy"
    with pytest.raises(SystemExit) as exit_info:
        main(["encode", str(corpus_file), "--out", str(out), "--pooling", "max"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "invalid choice: 'max'" in err
    assert not out.exists()


def test_module_and_console_script_entry_points(tmp_path, fitted):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "bertflow", "info", str(fitted)],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0 and "cls" in done.stdout
    done = subprocess.run([sys.executable, "-m", "bertflow", "info", str(tmp_path / "nope")],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"bertflow: error: nothing at {tmp_path / 'nope'}, nor a "
                                   "ready head of that name (minilm-first_last-wiki)")


def test_bad_checkpoints_and_resume_with_other_pooling(
    tmp_path, capsys, corpus_file, tiny_encoder_dir
):
    base = ["fit", corpus_file, "--encoder", tiny_encoder_dir, "--cache", tmp_path / "cache",
            "--levels", "1", "--depth", "2", "--quiet"]
    head = tmp_path / "head"
    for content in (b"garbage", b""):
        (tmp_path / "bad.pt").write_bytes(content)
        assert_refused(capsys, [*base, "--out", head, "--checkpoint", tmp_path / "bad.pt",
                                "--resume"], "is not a bertflow training checkpoint", head)
    ckpt = tmp_path / "state.pt"
    assert run(capsys, *base, "--pooling", "cls", "--out", head, "--checkpoint", ckpt)[0] == 0
    other = tmp_path / "other"
    assert_refused(capsys, [*base, "--pooling", "mean", "--out", other, "--checkpoint", ckpt,
                            "--resume"], "other settings or data", other)


def test_fit_refuses_to_overwrite_a_folder_that_is_not_a_head(
    tmp_path, capsys, corpus_file, tiny_encoder_dir, monkeypatch
):
    import bertflow.training.job

    encoder_copy = tmp_path / "encoder"
    __import__("shutil").copytree(tiny_encoder_dir, encoder_copy)
    before = sorted(p.name for p in encoder_copy.iterdir())
    monkeypatch.setattr(bertflow.training.job, "fit_head", None)  # refused before any training
    code, _, err = run(capsys, "fit", corpus_file, "--out", encoder_copy, "--encoder",
                       tiny_encoder_dir, "--cache", tmp_path / "cache")
    assert code == 1 and "is a non-empty folder but not a flow head" in err
    assert sorted(p.name for p in encoder_copy.iterdir()) == before


@pytest.mark.parametrize(
    "args,message",
    [
        (["--device", "cuda"], "device cuda asked for, but this torch"),
        (["--device", "cuda:1"], "device cuda:1 asked for, but this torch"),
        (["--device", "gpu"], "unknown device 'gpu'"),
        (["--dtype", "float16", "--device", "cpu"], "float16 is not supported on the CPU"),
    ],
)
def test_bad_encoding_options(tmp_path, capsys, corpus_file, tiny_encoder_dir, args, message):
    out = tmp_path / "e.npy"
    assert_refused(capsys, ["encode", corpus_file, "--out", out, "--encoder", tiny_encoder_dir,
                            *args], message, out)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--levels", "9"], "use fewer levels"),
    ],
)
def test_bad_training_options(tmp_path, capsys, corpus_file, tiny_encoder_dir, args, message):
    head = tmp_path / "head"
    assert_refused(capsys, ["fit", corpus_file, "--out", head, "--encoder", tiny_encoder_dir,
                            "--cache", tmp_path / "cache", "--quiet", *args], message, head)


def test_failed_fit_leaves_no_head_and_no_new_logdir(
    tmp_path, capsys, corpus_file, tiny_encoder_dir, monkeypatch
):
    import bertflow.training.job
    from bertflow import BertflowError

    def diverge(*args, **kwargs):
        kwargs["hook"].scalars(1, {"nll": 1.0})
        raise BertflowError("non-finite loss (nan) at step 3 (epoch 1)")

    monkeypatch.setattr(bertflow.training.job, "fit_head", diverge)
    head, logdir = tmp_path / "head", tmp_path / "runs"
    assert_refused(capsys, ["fit", corpus_file, "--out", head, "--encoder", tiny_encoder_dir,
                            "--cache", tmp_path / "cache", "--logdir", logdir],
                   "non-finite loss (nan) at step 3", head)
    assert not logdir.exists()


def test_embeddings_without_sidecar_and_an_encoder_of_another_width(
    tmp_path, capsys, tiny_encoder_dir, wide_encoder_dir
):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(60, 16)).astype(np.float32))
    head = tmp_path / "head"
    assert_refused(capsys, ["fit", tmp_path / "x.npy", "--pooling", "cls", "--out", head,
                            "--encoder", wide_encoder_dir], "makes 24-d ones", head)
    code, _, err = run(capsys, "fit", tmp_path / "x.npy", "--pooling", "cls", "--out", head,
                       "--encoder", tiny_encoder_dir, *FAST)
    assert code == 0, err
    code, out, _ = run(capsys, "info", head)
    assert "60 rows, sha256 " in out and "?" not in out.split("sha256")[1].split()[0]


def test_sidecar_encoder_must_match_a_given_encoder(
    tmp_path, capsys, corpus_file, tiny_encoder_dir, other_encoder_dir
):
    emb = tmp_path / "emb.npy"
    run(capsys, "encode", corpus_file, "--out", emb, "--encoder", tiny_encoder_dir)
    head = tmp_path / "head"
    assert_refused(capsys, ["fit", emb, "--out", head, "--encoder", other_encoder_dir],
                   "not by --encoder", head)
    meta = tmp_path / "emb.meta.json"
    record = json.loads(meta.read_text())
    meta.write_text(json.dumps({**record, "max_length": "abc"}))
    assert_refused(capsys, ["fit", emb, "--out", head], "is malformed: max_length", head)


def commands():
    """Every command's parser by name, `eval sts` and `eval retrieval` among them."""
    from bertflow.cli.main import build_parser

    found = {}
    for name, parser in build_parser()._subparsers._group_actions[0].choices.items():
        if parser._subparsers is None:
            found[name] = parser
        else:
            for kind, inner in parser._subparsers._group_actions[0].choices.items():
                found[f"{name} {kind}"] = inner
    return found


@pytest.mark.parametrize("command", ["encode", "fit", "transform", "eval sts", "eval retrieval",
                                     "diagnose", "index", "search"])
def test_every_encoding_command_takes_device_and_dtype(command):
    options = {o for action in commands()[command]._actions for o in action.option_strings}
    assert {"--device", "--dtype", "--cache", "--quiet"} <= options


def test_int8_embeddings_are_recorded_and_cached_apart(tmp_path, capsys, corpus_file,
                                                       tiny_encoder_dir):
    cache = tmp_path / "cache"
    common = ["--encoder", tiny_encoder_dir, "--pooling", "mean", "--cache", cache]
    for dtype, out in (("int8", "low.npy"), ("float32", "exact.npy"), ("int8", "again.npy")):
        code, printed, err = run(capsys, "encode", corpus_file, "--out", tmp_path / out,
                                 *common, "--dtype", dtype)
        assert code == 0, err
    assert "from the cache" in printed
    assert json.loads((tmp_path / "low.meta.json").read_text())["precision"] == "int8"
    low, exact = np.load(tmp_path / "low.npy"), np.load(tmp_path / "exact.npy")
    assert np.array_equal(low, np.load(tmp_path / "again.npy")) and not np.array_equal(low, exact)
    assert len(list(cache.glob("mean-*.npy"))) == 2


def test_encode_fills_the_cache_that_fit_and_index_read(tmp_path, capsys, corpus_file,
                                                        tiny_encoder_dir, monkeypatch):
    from bertflow.encoders.encoder import Encoder

    chunks = []
    real = Encoder.encode_chunk
    monkeypatch.setattr(Encoder, "encode_chunk", lambda self, sentences, *a, **k: (
        chunks.append(len(sentences)) or real(self, sentences, *a, **k)))
    cache, emb = tmp_path / "cache", tmp_path / "emb.npy"
    common = ["--encoder", tiny_encoder_dir, "--pooling", "cls", "--cache", cache]
    code, out, err = run(capsys, "encode", corpus_file, "--out", emb, *common, "--dtype",
                         "bfloat16")
    assert code == 0, err
    assert chunks == [120] and "bfloat16" in out
    assert json.loads((tmp_path / "emb.meta.json").read_text())["precision"] == "bfloat16"
    code, out, err = run(capsys, "fit", corpus_file, "--out", tmp_path / "h", *common,
                         "--dtype", "bfloat16", *FAST)
    assert code == 0, err
    code, out, err = run(capsys, "index", corpus_file, "--out", tmp_path / "i", *common,
                         "--dtype", "bfloat16")
    assert code == 0, err
    assert chunks == [120]  # encoded once
    [cached] = cache.glob("cls-*.npy")
    assert cached.stat().st_ino == emb.stat().st_ino  # a link, not a copy
    code, out, err = run(capsys, "fit", corpus_file, "--out", tmp_path / "h32", *common, *FAST)
    assert code == 0, err
    assert chunks == [120, 120]  # float32 embeddings are not the bfloat16 ones
    [float32] = set(cache.glob("cls-*.npy")) - {cached}
    again = tmp_path / "again.npy"
    code, out, err = run(capsys, "encode", corpus_file, "--out", again, *common)
    assert code == 0 and "from the cache" in out
    assert chunks == [120, 120]
    assert again.read_bytes() == float32.read_bytes()
    assert json.loads((tmp_path / "again.meta.json").read_text())["precision"] == "float32"


def test_an_unexpected_failure_is_one_line_unless_debugging(capsys, monkeypatch, tmp_path):
    import bertflow.cli.main

    def broken(args):
        raise RuntimeError("something deep\nwith a second line")

    parser = bertflow.cli.main.build_parser

    def patched():
        p = parser()
        p._subparsers._group_actions[0].choices["info"].set_defaults(run=broken)
        return p

    monkeypatch.setattr(bertflow.cli.main, "build_parser", patched)
    code, out, err = run(capsys, "info", tmp_path)
    assert code == 1 and err.strip().splitlines() == [
        "bertflow: error: unexpected RuntimeError: something deep (run with --debug for the "
        "traceback)"]
    with pytest.raises(RuntimeError, match="something deep"):
        main(["--debug", "info", str(tmp_path)])
    monkeypatch.setenv("BERTFLOW_DEBUG", "1")
    with pytest.raises(RuntimeError, match="something deep"):
        main(["info", str(tmp_path)])


def test_help_is_fast_shows_defaults_and_every_option_has_a_meaning():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    script = ("import sys, runpy; sys.argv = ['bertflow', 'fit', '--help']\n"
              "try:\n    runpy.run_module('bertflow', run_name='__main__')\n"
              "except SystemExit:\n    pass\n"
              "print('torch' in sys.modules, 'numpy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env)
    assert done.stdout.strip().endswith("False False"), done.stdout[-500:] + done.stderr
    assert "else 128" in done.stdout and "(default: 0)" in done.stdout  # max length, seed

    every = commands()
    flags = {name: {f for a in c._actions for f in a.option_strings} for name, c in every.items()}
    assert not {"--split", "--mteb", "--ignore-identical-ids"} & flags["eval sts"]
    assert "--tasks" not in flags["eval retrieval"] and "--tasks" in flags["eval sts"]
    assert "--k" not in flags["fit"] | flags["eval sts"] and "--dims" in flags["fit"]
    for name, command in every.items():
        assert command.description, name
        text = " ".join(command.format_help().split())  # every default said one way:
        assert text.count("default") == text.count("(default: "), (name, text)  # (default: X)
        for action in command._actions:
            if action.dest != "help":
                assert action.help, f"bertflow {name} {action.option_strings or action.dest}"
        flags = {f for a in command._actions for f in a.option_strings}
        # --batch-size is the flow's; the encoder's is --encode-batch-size everywhere
        assert "--batch-size" not in flags or "--epochs" in flags, name
        if {"--encoder", "--pooling"} <= flags:
            assert "--encode-batch-size" in flags, name


def test_ready_heads_load_by_name_and_are_listed(capsys, tmp_path):
    code, out, _ = run(capsys, "info")
    assert code == 0 and "minilm-first_last-wiki: all-MiniLM-L6-v2, first_last pooling" in out
    head = FlowHead.load("minilm-first_last-wiki")
    assert head.dim == 384 and head.pooling == "first_last"
    code, out, _ = run(capsys, "info", "minilm-first_last-wiki", "--json")
    assert code == 0 and json.loads(out)["pooling"] == "first_last"


def test_recipes_and_info_import_no_heavy_library():
    """`recipes` and `info` print what JSON and a weights file's header hold: neither imports
    torch, transformers, FAISS, scipy or scikit-learn (each costs seconds at start)."""
    probe = ("import sys\nfrom bertflow.cli.main import main\n"
             "for argv in (['recipes'], ['info'], ['info', 'minilm-first_last-wiki'], "
             "['info', 'minilm-first_last-wiki', '--json']):\n"
             "    assert main(argv) == 0, argv\n"
             "heavy = ('torch', 'transformers', 'faiss', 'scipy', 'sklearn', 'safetensors.torch')\n"
             "print('imported:', *sorted(set(heavy) & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "imported:"


def test_a_head_finds_its_encoder(tmp_path, capsys, corpus_file, tiny_encoder_dir):
    """A head fit with --encoder DIR records where that encoder lives; transform, eval and
    index load it from there when --encoder is not given, and refuse a changed one."""
    import shutil

    encoder = tmp_path / "my-encoder"
    shutil.copytree(tiny_encoder_dir, encoder)
    head = tmp_path / "head"
    assert run(capsys, "fit", corpus_file, "--out", head, "--encoder", encoder, "--pooling",
               "mean", "--cache", tmp_path / "cache", *FAST)[0] == 0
    config = json.loads((head / "config.json").read_text())
    assert config["encoder"]["source"] == f"folder:{encoder.resolve()}"
    z = tmp_path / "z.npy"
    code, out, err = run(capsys, "transform", "--head", head, "--sentences", corpus_file,
                         "--out", z)
    assert code == 0, err
    assert run(capsys, "index", corpus_file, "--out", tmp_path / "idx", "--head", head,
               "--cache", tmp_path / "cache")[0] == 0
    code, out, err = run(capsys, "search", "--index", tmp_path / "idx", "--query", "a dog")
    assert code == 0 and out.startswith("a dog"), err
    # the folder's weights change: refused, naming both
    from transformers import BertModel

    model = BertModel.from_pretrained(str(encoder))
    model.embeddings.word_embeddings.weight.data += 1.0
    model.save_pretrained(str(encoder))
    assert_refused(capsys, ["transform", "--head", head, "--sentences", corpus_file, "--out",
                            tmp_path / "z2.npy"], "has changed since", tmp_path / "z2.npy")
    shutil.rmtree(encoder)
    assert_refused(capsys, ["transform", "--head", head, "--sentences", corpus_file, "--out",
                            tmp_path / "z2.npy"], "which is gone; pass --encoder",
                   tmp_path / "z2.npy")
    assert run(capsys, "transform", "--head", head, "--sentences", corpus_file, "--encoder",
               tiny_encoder_dir, "--out", tmp_path / "z3.npy")[0] == 0


def test_fit_and_eval_follow_the_recipe_of_the_pooling_unless_told(
        tmp_path, capsys, corpus_file, tiny_encoder_dir, monkeypatch):
    """Options left unset take the pooling's recommended recipe (here: whitening, then a
    2-level flow for cls); a given option changes only itself."""
    from bertflow.config import FlowConfig, TrainConfig
    from bertflow.training import recipes

    monkeypatch.setitem(recipes.RECIPES, "cls", recipes.Recipe(
        FlowConfig(levels=2, depth=2), TrainConfig(epochs=1, batch_size=16), "whiten"))
    common = ("--encoder", tiny_encoder_dir, "--pooling", "cls", "--cache", tmp_path / "c")
    code, _, err = run(capsys, "fit", corpus_file, "--out", tmp_path / "a", *common)
    assert code == 0, err
    head = FlowHead.load(tmp_path / "a")
    assert head.glow.config.levels == 2 and head.linear is not None and head.standardize is None
    assert head.training_info["config"]["batch_size"] == 16
    code, _, err = run(capsys, "fit", corpus_file, "--out", tmp_path / "b", *common,
                       "--before", "standardize", "--levels", "1", "--linear", "lu")
    assert code == 0, err
    head = FlowHead.load(tmp_path / "b")
    assert (head.glow.config.levels, head.glow.config.depth) == (1, 2)
    assert head.glow.config.linear == "lu" and head.training_info["config"]["batch_size"] == 16
    assert head.linear is None and head.standardize is not None
    fits = []
    monkeypatch.setattr("bertflow.evaluation.methods.fit_head",
                        lambda x, **kw: fits.append(kw) or FlowHead.load(tmp_path / "a"))
    data = tmp_path / "data" / "STSBenchmark"
    data.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (data / f"sts-{split}.csv").write_text("".join(
            f"g\tf\t2012\t{i}\t{i % 5}.0\t{split} sentence {i}\tanother {i} there\n"
            for i in range(8)))
    code, _, err = run(capsys, "eval", "sts", tmp_path / "data", *common, "--tasks", "STS-B")
    assert code == 0, err
    assert fits and fits[0]["before"] == "whiten" and fits[0]["flow"].levels == 2


def _stsb(folder):
    data = folder / "STSBenchmark"
    data.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (data / f"sts-{split}.csv").write_text("".join(
            f"g\tf\t2012\t{i}\t{i % 5}.0\t{split} sentence {i}\tanother {i} there\n"
            for i in range(8)))
    return folder


def test_whitening_with_k_is_whitening_k_in_fit_and_eval(tmp_path, capsys, corpus_file,
                                                         tiny_encoder_dir):
    """`--method whitening --dims K`, as BERT-whitening's users write it, is whitening-k keeping
    K in both commands: fit writes the same head as `--method whitening-k --dims K`, byte for
    byte, and eval names its rows whitening-k (k=K)."""
    common = ("--encoder", tiny_encoder_dir, "--pooling", "mean", "--cache", tmp_path / "c")
    heads = {}
    for method in ("whitening", "whitening-k"):
        code, out, err = run(capsys, "fit", corpus_file, "--out", tmp_path / method,
                             "--method", method, "--dims", "6", *common)
        assert code == 0 and "whitening-k (k 6), a linear map 16 → 6" in out, err
        heads[method] = {p.name: p.read_bytes() for p in (tmp_path / method).iterdir()}
    assert heads["whitening"] == heads["whitening-k"]
    rows = tmp_path / "rows.json"
    code, out, err = run(capsys, "eval", "sts", _stsb(tmp_path / "data"), "--method",
                         "whitening", "--dims", "6", "--fit-on", corpus_file, "--out", rows,
                         "--tasks", "STS-B", *common, "--quiet")
    assert code == 0, err
    assert {(r["method"], r["k"]) for r in json.loads(rows.read_text())} == {("whitening-k", 6)}
    assert "| whitening-k (k=6) | corpus.txt |" in out


def test_shrinkage_in_fit_and_eval(tmp_path, capsys, corpus_file, tiny_encoder_dir):
    """`--shrinkage` reaches the head fit (its config records it) and eval's rows and table."""
    common = ("--encoder", tiny_encoder_dir, "--pooling", "mean", "--cache", tmp_path / "c")
    code, out, err = run(capsys, "fit", corpus_file, "--out", tmp_path / "h", "--method",
                         "whitening", "--shrinkage", "0.9", *common)
    assert code == 0 and "whitening (shrinkage 0.9), a linear map 16 → 16" in out, err
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["training"]["shrinkage"] == 0.9
    rows = tmp_path / "rows.json"
    code, out, err = run(capsys, "eval", "sts", _stsb(tmp_path / "data"), "--method",
                         "whitening", "--dims", "6", "--shrinkage", "0.5", "--fit-on", corpus_file,
                         "--out", rows, "--tasks", "STS-B", *common, "--quiet")
    assert code == 0, err
    assert {(r["method"], r["k"], r["shrinkage"]) for r in json.loads(rows.read_text())} == {
        ("whitening-k", 6, 0.5)}
    assert "| whitening-k (k=6, shrinkage=0.5) | corpus.txt |" in out


def test_k_and_d_are_refused_where_they_do_not_apply(tmp_path, capsys, corpus_file,
                                                     tiny_encoder_dir):
    data = _stsb(tmp_path / "data")
    common = ("--encoder", tiny_encoder_dir, "--cache", tmp_path / "c", "--quiet")
    for method, option in [("abtt", "--dims"), ("raw", "--dims"), ("standardize", "--dims"),
                           ("flow", "--dims"), ("whitening", "--d"), ("whitening-k", "--d"),
                           ("flow", "--d"), ("abtt", "--shrinkage"), ("raw", "--shrinkage"),
                           ("flow", "--shrinkage")]:
        value = "0.5" if option == "--shrinkage" else "3"
        if method not in ("raw", "standardize"):  # not methods of fit
            assert_refused(capsys, ["fit", corpus_file, "--out", tmp_path / "h", "--method",
                                    method, option, value, *common], "applies to",
                           tmp_path / "h")
        assert_refused(capsys, ["eval", "sts", data, "--method", method, option, value,
                                "--out", tmp_path / "rows.json", *common],
                       "applies to", tmp_path / "rows.json")


def test_whitening_on_fewer_rows_than_dimensions_is_refused(tmp_path, capsys, corpus_file,
                                                            tiny_encoder_dir):
    few = tmp_path / "few.txt"
    few.write_text("".join(line + "\n" for line in corpus_file.read_text().splitlines()[:10]))
    common = ("--encoder", tiny_encoder_dir, "--cache", tmp_path / "c", "--quiet")
    for options in (["--method", "whitening"], ["--before", "whiten"]):
        assert_refused(capsys, ["fit", few, "--out", tmp_path / "h", *options, *common],
                       "to 16 components needs at least 17 rows, got 10", tmp_path / "h")


# Options that cannot apply are refused, before an encoder is loaded --------------------------

@pytest.fixture
def inputs(tmp_path, capsys, corpus_file, tiny_encoder_dir, tiny_encoder):
    """Embeddings with their sidecar (max length 128), a head (max length 32) and a data
    folder; then loading any encoder fails the test."""
    from ..conftest import fit_tiny_head
    from ..data.test_sts import write_stsb

    emb = tmp_path / "emb.npy"
    assert run(capsys, "encode", corpus_file, "--out", emb, "--encoder", tiny_encoder_dir,
               "--pooling", "cls", "--cache", tmp_path / "cache")[0] == 0
    fit_tiny_head(tiny_encoder, "cls").save(tmp_path / "head")
    write_stsb(tmp_path / "data" / "STSBenchmark", rows_per_split=6)
    return {"emb": emb, "head": tmp_path / "head", "data": tmp_path / "data",
            "corpus": corpus_file}


@pytest.fixture
def no_encoder(monkeypatch):
    import bertflow.encoders.loading
    import bertflow.training.job

    def fail(*args, **kwargs):
        raise AssertionError("an encoder was loaded")

    monkeypatch.setattr(bertflow.encoders.loading, "load_encoder", fail)
    monkeypatch.setattr(bertflow.training.job, "load_encoder", fail)


@pytest.mark.parametrize("args,message", [
    (["fit", "{emb}", "--device", "cuda"],
     "--device cuda cannot apply: {emb} holds embeddings, encoded already"),
    (["fit", "{emb}", "--dtype", "float16"], "--dtype float16 cannot apply"),
    (["fit", "{emb}", "--device", "cuda:0", "--dtype", "bfloat16", "--method", "whitening"],
     "--device cuda:0 and --dtype bfloat16 cannot apply"),
    (["fit", "{emb}", "--max-length", "64"],
     "--max-length 64 differs from the 128 that {emb} was encoded with"),
    (["fit", "{emb}", "--method", "whitening", "--lr", "0.5", "--epochs", "9"],
     "--epochs, --lr apply to --method flow only"),
    (["fit", "{emb}", "--method", "abtt", "--before", "none", "--seed", "3"],
     "--before, --seed apply to --method flow only"),
    (["transform", "--head", "{head}", "--embeddings", "{emb}", "--dtype", "bfloat16"],
     "--dtype bfloat16 cannot apply: --embeddings {emb} are transformed as they are"),
    (["transform", "--head", "{head}", "--embeddings", "{emb}", "--device", "cuda"],
     "--device cuda cannot apply"),
    (["eval", "sts", "{data}", "--head", "{head}", "--levels", "2"],
     "--levels apply to a flow fit here, not to --head {head}"),
    (["eval", "sts", "{data}", "--method", "whitening", "--lr", "0.1", "--before", "whiten"],
     "--before, --lr apply to --method flow only"),
    (["eval", "sts", "{data}", "--head", "{head}", "--max-length", "64"],
     "--max-length 64 differs from the head's 32"),
    (["diagnose", "{corpus}", "--head", "{head}", "--depth", "3"],
     "--depth apply to a flow fit here"),
    (["diagnose", "{corpus}", "--head", "{head}", "--max-length", "64"],
     "--max-length 64 differs from the head's 32"),
])
def test_options_that_cannot_apply_are_refused(tmp_path, capsys, inputs, no_encoder, args,
                                               message):
    out = tmp_path / "out"
    outputs = {"fit": ["--out", out], "transform": ["--out", tmp_path / "z.npy"],
               "eval": ["--out", tmp_path / "rows.json"], "diagnose": ["--out", out]}
    args = [a.format(**inputs) for a in args] + outputs[args[0]] + ["--quiet"] * (
        args[0] != "transform")
    assert_refused(capsys, args, message.format(**inputs), out)
    assert not (tmp_path / "z.npy").exists() and not (tmp_path / "rows.json").exists()


@pytest.mark.parametrize("options", [["--dims", "3"], ["--d", "3"], ["--dims", "3", "--d", "2"],
                                     ["--shrinkage", "0.5"]])
def test_eval_refuses_k_d_and_shrinkage_with_a_head(tmp_path, capsys, inputs, no_encoder,
                                                    options):
    rows = tmp_path / "rows.json"
    assert_refused(capsys, ["eval", "sts", inputs["data"], "--head", inputs["head"], *options,
                            "--out", rows, "--quiet"],
                   "--dims, --d, --shrinkage and --gamma apply to a linear method fit here, "
                   f"not to --head {inputs['head']}", rows)


@pytest.mark.parametrize("args,message", [
    (["fit", "{emb}", "--encode-batch-size", "7"],
     "--encode-batch-size 7 cannot apply: {emb} holds embeddings, encoded already"),
    (["fit", "{emb}", "--cache", "{nowhere}", "--method", "abtt"],
     "--cache {nowhere} cannot apply: {emb} holds embeddings, encoded already"),
    (["fit", "{emb}", "--dev-sts", "{data}", "--dtype", "float16", "--cache", "{nowhere}"],
     "--dtype float16 cannot apply"),  # --dev-sts encodes: --cache applies
    (["transform", "--head", "{head}", "--embeddings", "{emb}", "--encode-batch-size", "3"],
     "--encode-batch-size 3 cannot apply: --embeddings {emb} are transformed as they are"),
    (["transform", "--head", "{head}", "--sentences", "{corpus}", "--pooling", "mean"],
     "--pooling mean differs from the head's cls"),
])
def test_encoder_options_where_nothing_is_encoded_and_another_pooling_are_refused(
        tmp_path, capsys, inputs, no_encoder, args, message):
    inputs = {**inputs, "nowhere": tmp_path / "no" / "cache"}
    out = tmp_path / "out"
    outputs = {"fit": ["--out", out, "--quiet"], "transform": ["--out", tmp_path / "z.npy"]}
    assert_refused(capsys, [a.format(**inputs) for a in args] + outputs[args[0]],
                   message.format(**inputs), out)
    assert not (tmp_path / "z.npy").exists() and not (tmp_path / "no").exists()


def test_encode_refuses_cache_with_no_cache(tmp_path, capsys, corpus_file, no_encoder):
    with pytest.raises(SystemExit) as exit_info:
        main(["encode", str(corpus_file), "--out", str(tmp_path / "e.npy"), "--cache",
              str(tmp_path / "cache"), "--no-cache"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert "argument --no-cache: not allowed with argument --cache" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_diagnose_leaves_a_folder_of_the_users_plots_alone(tmp_path, capsys, inputs):
    """A folder holding files named as bertflow's plots, but without bertflow's manifest, is
    the user's."""
    mine = tmp_path / "myplots"
    mine.mkdir()
    (mine / "spectrum.png").write_text("mine\n")
    assert_refused(capsys, ["diagnose", inputs["corpus"], "--head", inputs["head"], "--out",
                            mine, "--quiet"],
                   f"{mine} is a non-empty folder but not a folder of bertflow plots; not "
                   "replacing it", tmp_path / "none")
    assert [p.name for p in mine.iterdir()] == ["spectrum.png"]
    assert (mine / "spectrum.png").read_text() == "mine\n"


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`bertflow ... | head`: the closed pipe ends the command with 141 and no error line."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "bertflow", "recipes"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    assert process.wait(timeout=120) == 141
    assert process.stderr.read() == b""
