"""The command line refuses missing inputs and bad options before it imports torch; one name per
option meaning; the recipes are printed."""

import json
import os
import subprocess
import sys

import pytest

from bertflow.cli.main import main

from ..conftest import REPO

_NOTHING_HEAVY = """\
import contextlib, io, json, sys
from bertflow.cli.main import main
for args in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(args)
    heavy = [m for m in ("torch", "transformers", "faiss", "scipy") if m in sys.modules]
    print(json.dumps([code, err.getvalue(), heavy]))
"""


def test_missing_inputs_and_bad_options_are_refused_before_torch_is_imported(tmp_path):
    """Every command, one after the other in one process: each case fails with its one line
    and exit 1, and no heavy module is imported yet."""
    missing, out = tmp_path / "missing", tmp_path / "out"
    cases = [
        (["encode", missing, "--out", out / "e.npy"], f"no such file: {missing}"),
        (["fit", missing, "--out", out], f"no such file: {missing}"),
        (["fit", tmp_path, "--out", out], f"{tmp_path} is not a file"),
        (["fit", missing, "--out", out, "--method", "abtt", "--dims", "3"], "--dims applies to"),
        (["fit", missing, "--out", out, "--shrinkage", "0.5"],
         "--shrinkage applies to --method whitening, whitening-k, fractional"),
        (["transform", "--head", missing, "--sentences", missing, "--out", out / "z.npy"],
         f"no such file: {missing}"),
        (["transform", "--head", missing, "--embeddings", tmp_path, "--out", out / "z.npy",
          "--dtype", "float16"], "--dtype float16 cannot apply"),
        (["eval", "sts", missing], f"no data folder at {missing}"),
        (["eval", "sts", missing, "--method", "raw", "--lr", "0.1"],
         "--lr apply to --method flow only"),
        (["eval", "retrieval", missing, "--method", "abtt", "--shrinkage", "0"],
         "--shrinkage applies to --method whitening, whitening-k, fractional"),
        (["eval", "sts", missing, "--head", missing, "--shrinkage", "0.9"],
         "--dims, --d, --shrinkage and --gamma apply to a linear method fit here, not to "
         f"--head {missing}"),
        (["eval", "sts", tmp_path, "--head", missing], f"no flow head folder at {missing}"),
        (["eval", "sts", tmp_path, "--fit-on", "target", missing],
         f"no such file: {missing}"),
        (["eval", "retrieval", missing], f"no BEIR folder at {missing}"),
        (["eval", "retrieval", tmp_path], f"no corpus.jsonl in the BEIR folder {tmp_path}"),
        (["eval", "retrieval", tmp_path, "--fit-on", "target"],
         "--fit-on target applies to eval sts"),
        (["diagnose", missing, "--out", out], f"no such file: {missing}"),
        (["export", "--head", missing, "--format", "onnx", "--out", out / "h.onnx"],
         f"no flow head folder at {missing}"),
        (["export", "--head", missing, "--format", "onnx", "--out", out / "h.onnx",
          "--normalize"], "--normalize apply to --format sentence-transformers and onnx-pipeline"),
        (["index", missing, "--out", out], f"no such file: {missing}"),
        (["index", missing, "--out", out, "--kind", "HNSW100000000"],
         "index kind 'HNSW100000000': its sizes must be at most 1048576"),
        (["search", "--index", missing, "--query", "a"], f"no index folder at {missing}"),
        (["search", "--index", tmp_path, "--queries", missing], f"no such file: {missing}"),
        (["info", missing], f"nothing at {missing}, nor a ready head of that name"),
        (["index", missing, "--out", out, "--feedback-k", "0"],
         "feedback's k (--feedback-k) must be an integer of at least 1, got 0"),
        (["index", missing, "--out", out, "--feedback-beta", "0.3"],
         "--feedback-beta apply with --feedback-k"),
        (["search", "--index", missing, "--query", "a", "--feedback-beta", "-0.5"],
         "feedback's beta (--feedback-beta) must be a finite number of at least 0, got -0.5"),
        (["search", "--index", missing, "--query", "a", "--no-feedback", "--feedback-k", "2"],
         "--feedback-k cannot apply with --no-feedback"),
        (["eval", "retrieval", missing, "--feedback-k", "2", "--feedback-beta", "nan"],
         "(--feedback-beta) must be a finite number of at least 0, got nan"),
        (["eval", "retrieval", missing, "--feedback-k", "-1", "--feedback-beta", "inf"],
         "(--feedback-k) must be an integer of at least 1, got -1"),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = json.dumps([[str(a) for a in args] for args, _ in cases])
    done = subprocess.run([sys.executable, "-c", _NOTHING_HEAVY, argv], capture_output=True,
                          text=True, env=env)
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(cases), done.stderr
    for (args, message), (code, err, heavy) in zip(cases, results, strict=True):
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1 and message in lines[0], (args, lines)
        assert heavy == [], (args, heavy)
    assert not out.exists()


def test_search_takes_top_and_refuses_k(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["search", "--index", str(tmp_path), "--query", "a", "--k", "3"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1
    assert "argument --k: hits per query are --top" in lines[0]


@pytest.mark.parametrize("value,message", [
    ("1.5", "must be in [0, 1], got 1.5"), ("-0.1", "must be in [0, 1], got -0.1"),
    ("nan", "must be a finite number, got nan"),
    ("half", "expected α in [0, 1] or one of ledoit-wolf, oas, likelihood, got 'half'")])
def test_shrinkage_out_of_range_is_refused(capsys, tmp_path, value, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", str(tmp_path / "x.npy"), "--out", str(tmp_path / "h"), "--method",
              "whitening", "--shrinkage", value])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1
    assert f"argument --shrinkage: {message}" in lines[0]
    assert not (tmp_path / "h").exists()


def test_recipes_prints_each_poolings_recipe(capsys):
    from bertflow.training.recipes import ISOTROPIC, ISOTROPIC_RECIPES, RECIPES

    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert [line[:-1] for line in out.splitlines() if not line.startswith(" ")] == list(RECIPES)
    assert main(["recipes", "--pooling", "cls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cls = RECIPES["cls"]
    assert lines[:3] == ["cls:", f"  before:   {cls.before}", f"  corpus:   {cls.corpus}"]
    assert f"lr={cls.train.lr}" in lines[4] and f"hidden={cls.flow.hidden}" in lines[3]
    iso = ISOTROPIC_RECIPES["cls"]  # and the rule's: under a mean pair cosine
    assert lines[5] == (f"  where the fit embeddings' mean pair cosine is under {ISOTROPIC} "
                        "(--isotropic):")
    assert lines[6:8] == [f"    before:   {iso.before}", f"    corpus:   {iso.corpus}"]
    assert f"lr={iso.train.lr}" in lines[9] and len(lines) == 10
