"""The head inside a sentence-transformers pipeline, every pooling, save and reload."""

import json
import shutil

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from bertflow import POOLINGS, BertflowError, load_encoder
from bertflow.cli.main import main
from bertflow.export.pipeline import build_pipeline, load_pipeline, save_pipeline

from ..conftest import SENTENCES, fit_tiny_head


@pytest.fixture(scope="module")
def heads(tiny_encoder):
    return {p: fit_tiny_head(tiny_encoder, p) for p in POOLINGS}


@pytest.mark.parametrize("pooling", POOLINGS)
def test_pipeline_embeddings_equal_the_heads_after_save_and_both_reloads(
        tmp_path, heads, tiny_encoder, pooling):
    head = heads[pooling]
    expected = head.encode(SENTENCES, tiny_encoder)
    model = build_pipeline(head, tiny_encoder)
    np.testing.assert_allclose(model.encode(SENTENCES), expected, atol=1e-5)

    save_pipeline(model, tmp_path / "st")
    for reloaded in (SentenceTransformer(str(tmp_path / "st"), trust_remote_code=True,
                                         device="cpu"),
                     load_pipeline(tmp_path / "st")):
        np.testing.assert_allclose(reloaded.encode(SENTENCES), expected, atol=1e-5)
        assert reloaded[2].head.pooling == pooling


def test_sentence_transformers_asks_for_the_flag_and_bertflow_does_not(
        tmp_path, heads, tiny_encoder):
    save_pipeline(build_pipeline(heads["cls"], tiny_encoder), tmp_path / "st")
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(tmp_path / "st"), device="cpu")
    assert load_pipeline(tmp_path / "st") is not None


def test_normalize_gives_unit_vectors_in_the_heads_directions(heads, tiny_encoder):
    head = heads["mean"]
    z = head.encode(SENTENCES, tiny_encoder)
    out = build_pipeline(head, tiny_encoder, normalize=True).encode(SENTENCES)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(out, z / np.linalg.norm(z, axis=1, keepdims=True), atol=1e-5)


def test_heads_from_another_encoder_or_width_are_refused(
        heads, tiny_encoder_dir, other_encoder_dir, wide_encoder_dir):
    wide = fit_tiny_head(load_encoder(wide_encoder_dir), "cls")
    with pytest.raises(BertflowError, match="24-d.*16-d"):
        build_pipeline(wide, tiny_encoder_dir)
    with pytest.raises(BertflowError, match="encoder"):
        build_pipeline(heads["cls"], other_encoder_dir)


def test_reload_refuses_a_head_whose_pooling_was_changed(tmp_path, heads, tiny_encoder):
    save_pipeline(build_pipeline(heads["cls"], tiny_encoder), tmp_path / "st")
    pooling = tmp_path / "st" / "1_PoolingModule" / "config.json"
    pooling.write_text(json.dumps({"pooling": "mean"}))
    with pytest.raises(BertflowError, match="PoolingModule/config.json does not match the "
                       "checksum in manifest.json"):
        load_pipeline(tmp_path / "st")
    (tmp_path / "st" / "manifest.json").unlink()  # as sentence-transformers' own save leaves it
    with pytest.raises(BertflowError, match="cls pooling.*mean"):
        load_pipeline(tmp_path / "st")


def test_load_pipeline_refuses_foreign_classes_and_bad_folders(tmp_path, heads, tiny_encoder):
    with pytest.raises(BertflowError, match="no modules.json"):
        load_pipeline(tmp_path)
    folder = save_pipeline(build_pipeline(heads["cls"], tiny_encoder), tmp_path / "st")
    (folder / "manifest.json").unlink()  # reach the checks behind it
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["type"] = "somewhere.else.Module"
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(BertflowError, match="somewhere.else.Module"):
        load_pipeline(folder)
    (folder / "modules.json").write_text("[{")
    with pytest.raises(BertflowError, match="malformed"):
        load_pipeline(folder)
    modules[1]["type"] = "bertflow.export.pipeline.PoolingModule"
    (folder / "modules.json").write_text(json.dumps(modules))
    shutil.rmtree(folder / "2_HeadModule")
    with pytest.raises(BertflowError, match="no flow head"):
        load_pipeline(folder)


def test_an_export_with_a_module_of_its_own_runs_no_code(tmp_path, heads, tiny_encoder):
    """One more modules.json entry naming a Python file in the folder, re-signed: load_pipeline
    refuses it before importing anything, so the file never runs."""
    from bertflow.storage.artifacts import write_manifest

    folder = save_pipeline(build_pipeline(heads["cls"], tiny_encoder), tmp_path / "st")
    marker = tmp_path / "ran"
    (folder / "evil_module.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                           "from sentence_transformers.base.modules import "
                                           "Normalize as Evil\n")
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": "",
                    "type": "evil_module.Evil"})
    (folder / "modules.json").write_text(json.dumps(modules))
    write_manifest(folder, "bertflow-pipeline")
    with pytest.raises(BertflowError, match="module class evil_module.Evil, which is neither"):
        load_pipeline(folder)
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(folder), device="cpu")
    assert not marker.exists()


def test_save_refuses_to_replace_another_folder(tmp_path, heads, tiny_encoder):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("keep")
    with pytest.raises(BertflowError, match="not a bertflow sentence-transformers export"):
        save_pipeline(build_pipeline(heads["cls"], tiny_encoder), tmp_path / "notes")
    assert (tmp_path / "notes" / "keep.txt").read_text() == "keep"
    # another sentence-transformers model, and a pipeline of ours with a file of the user's
    other = build_pipeline(heads["cls"], tiny_encoder)
    other.save(str(tmp_path / "theirs"))
    with pytest.raises(BertflowError, match="not a bertflow sentence-transformers export"):
        save_pipeline(other, tmp_path / "theirs")
    ours = save_pipeline(other, tmp_path / "ours")
    save_pipeline(other, ours)  # its own files only: replaced
    (ours / "notes.txt").write_text("mine")
    with pytest.raises(BertflowError, match="not part of a bertflow sentence-transformers "
                       "export: notes.txt"):
        save_pipeline(other, ours)
    assert (ours / "notes.txt").read_text() == "mine"


def test_cli_export_matches_bertflow_transform(tmp_path, capsys, heads, tiny_encoder_dir):
    heads["last2"].save(tmp_path / "head")
    sentences = tmp_path / "s.txt"
    sentences.write_text("\n".join(SENTENCES) + "\n")
    assert main(["transform", "--head", str(tmp_path / "head"), "--sentences", str(sentences),
                 "--encoder", str(tiny_encoder_dir), "--out", str(tmp_path / "z.npy")]) == 0
    assert main(["export", "--head", str(tmp_path / "head"), "--format",
                 "sentence-transformers", "--encoder", str(tiny_encoder_dir),
                 "--out", str(tmp_path / "st")]) == 0
    model = load_pipeline(tmp_path / "st")
    np.testing.assert_allclose(model.encode(SENTENCES), np.load(tmp_path / "z.npy"), atol=1e-5)
    capsys.readouterr()
    assert main(["export", "--head", str(tmp_path / "head"), "--format",
                 "sentence-transformers", "--encoder", str(tmp_path / "nowhere"),
                 "--out", str(tmp_path / "st2")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: error:")
    assert not (tmp_path / "st2").exists()


def test_missing_configs_and_damaged_heads_are_refused(tmp_path, heads, tiny_encoder):
    folder = save_pipeline(build_pipeline(heads["mean"], tiny_encoder), tmp_path / "st")
    (folder / "manifest.json").unlink()  # reach the checks behind it
    (folder / "bertflow_encoder.json").rename(tmp_path / "kept.json")
    with pytest.raises(BertflowError, match="no such file: .*bertflow_encoder.json"):
        load_pipeline(folder)
    (tmp_path / "kept.json").write_text(json.dumps({"name": "x", "max_length": 64}))
    (tmp_path / "kept.json").rename(folder / "bertflow_encoder.json")
    with pytest.raises(BertflowError, match="at most 32 tokens"):
        load_pipeline(folder)
    (folder / "bertflow_encoder.json").write_text(json.dumps({"name": "x", "max_length": 32}))
    weights = folder / "2_HeadModule" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4])
    with pytest.raises(BertflowError, match="altered or truncated"):
        load_pipeline(folder)


def test_a_failed_save_leaves_the_previous_pipeline(tmp_path, heads, tiny_encoder, monkeypatch):
    from bertflow.export.pipeline import HeadModule

    folder = save_pipeline(build_pipeline(heads["cls"], tiny_encoder), tmp_path / "st")
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    def broken(self, output_path, *args, **kwargs):
        raise RuntimeError("disk full")
    monkeypatch.setattr(HeadModule, "save", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        save_pipeline(build_pipeline(heads["cls"], tiny_encoder), folder)
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
    assert [p.name for p in tmp_path.iterdir()] == ["st"]
    assert load_pipeline(folder) is not None


def test_the_export_writes_bertflows_model_card(tmp_path, heads, tiny_encoder):
    import copy

    head = copy.deepcopy(heads["last2"])
    head.training_info["corpus"] = {"file": "wiki-sample.txt", "size": 208, "sha256": "ab" * 32}
    folder = save_pipeline(build_pipeline(head, tiny_encoder, normalize=True), tmp_path / "st")
    card = (folder / "README.md").read_text(encoding="utf-8")
    name = tiny_encoder.id.name
    for text in (f"`{name}`", tiny_encoder.id.fingerprint, "`last2`", "BERT-flow head",
                 "Glow", "wiki-sample.txt: 208 rows, sha256 abababababababab",
                 f"of {head.training_info['epochs_run']} |", "lr=", "unit length",
                 "from bertflow.export.pipeline import load_pipeline", 'load_pipeline("st")',
                 "never pass it for a folder you received"):
        assert text in card, text
    assert "sentence-transformers](https://www.SBERT.net) model" not in card  # not ST's card
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "README.md" in manifest["files"]
    assert load_pipeline(folder) is not None
    # a head fit on embeddings alone says so, and a pipeline without Normalize does not claim it
    folder = save_pipeline(build_pipeline(heads["cls"], tiny_encoder), tmp_path / "plain")
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert " rows, sha256 " in card and "`cls`" in card
    assert "unit length" not in card


def test_a_linear_heads_model_card_names_its_map_not_a_flow(tmp_path, tiny_encoder):
    from bertflow import FlowHead

    x = tiny_encoder.encode(SENTENCES * 3, "mean")
    head = FlowHead.fit_linear(x, "abtt", encoder=tiny_encoder.id, pooling="mean")
    folder = save_pipeline(build_pipeline(head, tiny_encoder), tmp_path / "st")
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert "mean pooling, abtt head" in card and "linear map (abtt)" in card
    for text in ("BERT-flow", "normalizing", "Glow"):
        assert text not in card, text
