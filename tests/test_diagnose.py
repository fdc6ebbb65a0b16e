import matplotlib.image
import numpy as np
import pytest

from bertflow import BertflowError
from bertflow.cli import main
from bertflow.diagnose import PLOTS, plot_all, token_frequencies


def test_diagnose_writes_four_valid_pngs(tmp_path, capsys, corpus_file, tiny_encoder_dir):
    out = tmp_path / "plots"
    code = main(["diagnose", str(corpus_file), "--out", str(out), "--encoder",
                 str(tiny_encoder_dir), "--pooling", "cls", "--cache", str(tmp_path / "c"),
                 "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*PLOTS, "manifest.json"])
    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 200 and image.shape[1] > 300
        assert image[..., :3].std() > 0.01  # not a blank canvas
    assert "mean_cosine" in printed and "isotropy" in printed


def test_diagnose_with_a_head_and_refusals(tmp_path, capsys, corpus_file, tiny_encoder_dir,
                                           other_encoder_dir):
    head = tmp_path / "head"
    main(["fit", str(corpus_file), "--out", str(head), "--encoder", str(tiny_encoder_dir),
          "--pooling", "static", "--cache", str(tmp_path / "c"), "--quiet"])
    out = tmp_path / "plots"
    assert main(["diagnose", str(corpus_file), "--out", str(out), "--head", str(head),
                 "--encoder", str(tiny_encoder_dir), "--cache", str(tmp_path / "c"),
                 "--quiet"]) == 0
    capsys.readouterr()
    code = main(["diagnose", str(corpus_file), "--out", str(tmp_path / "p2"), "--head",
                 str(head), "--encoder", str(other_encoder_dir), "--quiet"])
    assert code == 1 and "but these come from encoder" in capsys.readouterr().err
    assert not (tmp_path / "p2").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep")
    with pytest.raises(BertflowError, match="not a folder of bertflow plots"):
        x = np.random.default_rng(0).normal(size=(50, 16))
        plot_all(x, x, tmp_path / "mine", encoder=None, corpus=[], title="t")


def test_token_frequencies(tiny_encoder):
    counts = token_frequencies(tiny_encoder, ["the dog", "the cat the"])
    the = tiny_encoder.tokenizer.convert_tokens_to_ids("the")
    assert counts[the] == 3 and sum(counts.values()) == 5
