"""An encoder folder's own sentence-transformers settings (modules.json's pooling,
sentence_bert_config.json's max length) are the defaults where none is given, said once;
anything else in those files leaves today's defaults and says why."""

import json
import shutil
import warnings

import numpy as np
import pytest

from bertflow import load_encoder
from bertflow.cli.main import main
from bertflow.encoders.settings import FolderSettings, read_settings
from bertflow.errors import BertflowWarning

from ..conftest import make_tiny_encoder


def as_sentence_transformers(folder, modes, max_seq_length=None):
    """Give `folder` sentence-transformers' files: a Pooling module with `modes` set."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 16, **{f"pooling_mode_{m}": True for m in modes}}))
    if max_seq_length is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps(
            {"max_seq_length": max_seq_length, "do_lower_case": False}))
    return folder


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory):
    return as_sentence_transformers(make_tiny_encoder(tmp_path_factory.mktemp("st")),
                                    ["mean_tokens"], 24)


def test_the_folders_settings_are_read_from_json_alone(tmp_path, st_folder):
    assert read_settings(st_folder) == FolderSettings("mean", 24)
    assert read_settings(tmp_path) == FolderSettings()  # a plain Hugging Face folder
    cases = {("cls_token",): FolderSettings("cls")}
    for modes, expected in cases.items():
        folder = as_sentence_transformers(tmp_path / "cls", modes)
        assert read_settings(folder) == expected
    other = as_sentence_transformers(tmp_path / "max", ["max_tokens"], 64)
    assert read_settings(other) == FolderSettings(
        None, 64, "its Pooling module's max mode is not one of bertflow's poolings")
    both = as_sentence_transformers(tmp_path / "both", ["cls_token", "mean_tokens"])
    assert read_settings(both).pooling is None and "cls and mean" in read_settings(both).unused
    none = as_sentence_transformers(tmp_path / "none", [])
    (none / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": false}')
    assert read_settings(none).pooling == "mean"  # no flag set: the mean, as ST reads it
    # sentence-transformers 6: one pooling_mode, the length in the tokenizer's config
    st6 = as_sentence_transformers(tmp_path / "st6", [])
    (st6 / "1_Pooling" / "config.json").write_text('{"pooling_mode": "cls"}')
    (st6 / "tokenizer_config.json").write_text('{"model_max_length": 384}')
    assert read_settings(st6) == FolderSettings("cls", 384)
    (st6 / "1_Pooling" / "config.json").write_text('{"pooling_mode": ["mean", "max"]}')
    assert read_settings(st6).unused == \
        "its Pooling module's mean and max mode is not one of bertflow's poolings"
    plain = tmp_path / "plain-tokenizer"  # no modules.json: the tokenizer's limit is no setting
    plain.mkdir()
    (plain / "tokenizer_config.json").write_text('{"model_max_length": 512}')
    assert read_settings(plain) == FolderSettings()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "modules.json").write_text("{not json")
    (bad / "sentence_bert_config.json").write_text('{"max_seq_length": true}')
    assert read_settings(bad) == FolderSettings(None, None, "its modules.json is malformed")
    away = as_sentence_transformers(tmp_path / "away", ["mean_tokens"])
    modules = json.loads((away / "modules.json").read_text())
    modules[1]["path"] = "../max/1_Pooling"
    (away / "modules.json").write_text(json.dumps(modules))
    assert read_settings(away).unused == \
        "its Pooling module lies outside it (../max/1_Pooling)"


def test_an_encoder_takes_its_folders_settings_where_none_is_given(tmp_path, st_folder):
    encoder = load_encoder(st_folder, "cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert encoder.defaults() == ("mean", 24)
        assert encoder.defaults("cls", 8) == ("cls", 8)  # given: kept
        assert encoder.defaults() == ("mean", 24)
    said = [str(w.message) for w in caught if issubclass(w.category, BertflowWarning)]
    assert said == [f"{encoder.id.name}: mean pooling and max length 24: the encoder folder's "
                    "own sentence-transformers settings (--pooling and --max-length choose "
                    "others)"]  # once
    plain = load_encoder(make_tiny_encoder(tmp_path / "plain"), "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say
        assert plain.defaults() == ("first_last", 128)
    long = as_sentence_transformers(make_tiny_encoder(tmp_path / "long"), ["cls_token"], 4096)
    with pytest.warns(BertflowWarning, match="cls pooling and max length 128"):
        assert load_encoder(long, "cpu").defaults() == ("cls", 128)  # within its positions
    odd = as_sentence_transformers(make_tiny_encoder(tmp_path / "odd"), ["lasttoken"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # --pooling given: the folder's mode is not wanted
        assert load_encoder(odd, "cpu").defaults("cls", 32) == ("cls", 32)
    with pytest.warns(BertflowWarning, match="lasttoken mode is not one of bertflow's "
                      "poolings: first_last pooling"):
        assert load_encoder(odd, "cpu").defaults() == ("first_last", 128)


def test_commands_encode_with_the_folders_settings_and_say_so(tmp_path, capsys, st_folder):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a man plays the guitar\nthe cat eats\na dog runs in the park\n")
    out = tmp_path / "emb.npy"
    assert main(["encode", str(corpus), "--out", str(out), "--encoder", str(st_folder),
                 "--no-cache", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "mean, float32" in captured.out
    assert captured.err.count("bertflow: note:") == 1
    assert "mean pooling and max length 24: the encoder folder's own" in captured.err
    meta = json.loads((tmp_path / "emb.meta.json").read_text())
    assert (meta["pooling"], meta["max_length"]) == ("mean", 24)
    expected = load_encoder(st_folder, "cpu").encode(corpus.read_text().splitlines(), "mean", 24)
    np.testing.assert_array_equal(np.load(out), expected)
    assert main(["encode", str(corpus), "--out", str(tmp_path / "cls.npy"), "--encoder",
                 str(st_folder), "--no-cache", "--quiet", "--pooling", "cls",
                 "--max-length", "32"]) == 0
    assert "note" not in capsys.readouterr().err  # both given: nothing of the folder's applies
    meta = json.loads((tmp_path / "cls.meta.json").read_text())
    assert (meta["pooling"], meta["max_length"]) == ("cls", 32)
    plain = tmp_path / "plain"
    shutil.copytree(st_folder, plain)
    for name in ("modules.json", "sentence_bert_config.json"):
        (plain / name).unlink()
    assert main(["encode", str(corpus), "--out", str(tmp_path / "plain.npy"), "--encoder",
                 str(plain), "--no-cache", "--quiet"]) == 0
    assert "note" not in capsys.readouterr().err
    meta = json.loads((tmp_path / "plain.meta.json").read_text())
    assert (meta["pooling"], meta["max_length"]) == ("first_last", 128)
