import re
from collections import Counter

import matplotlib.image
import numpy as np
import pytest
from matplotlib.figure import Figure

from bertflow import BertflowError
from bertflow.cli.main import main
from bertflow.data.sts import read_stsb_splits, sentences_of
from bertflow.evaluation.diagnose import PLOTS, method_points, plot_all, token_frequencies
from bertflow.storage.artifacts import MANIFEST

from ..conftest import WORDS, fit_tiny_head

FIRST_PLOTS = ["spectrum.png", "cosines.png", "token_norms.png", "projection.png"]


def write_stsb_words(folder, pairs=24, seed=0):
    """STS-B dev and test in SentEval's layout, with words the tiny model knows and gold
    scores spread over 0-5 (a sixth of them at least 4)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for split in ("dev", "test"):
        lines = []
        for i in range(pairs):
            a, b = (" ".join(rng.choice(WORDS, size=rng.integers(3, 7))) for _ in range(2))
            lines.append(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{5 * i / pairs:.3f}\t"
                         f"{a}\t{b}")
        (folder / f"sts-{split}.csv").write_text("\n".join(lines) + "\n")


def check_pngs(folder, names):
    assert sorted(p.name for p in folder.iterdir()) == sorted([*names, MANIFEST])
    for name in names:
        data = (folder / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(folder / name)
        assert image.shape[0] > 200 and image.shape[1] > 300
        assert image[..., :3].std() > 0.01  # not a blank canvas


def test_diagnose_with_data_writes_every_plot(tmp_path, capsys, corpus_file, tiny_encoder_dir):
    data = tmp_path / "data"
    write_stsb_words(data / "STSBenchmark")
    out = tmp_path / "plots"
    code = main(["diagnose", str(corpus_file), "--out", str(out), "--encoder",
                 str(tiny_encoder_dir), "--pooling", "cls", "--cache", str(tmp_path / "c"),
                 "--data", str(data), "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0
    assert len(PLOTS) == 7 and PLOTS[:4] == tuple(FIRST_PLOTS)
    check_pngs(out, PLOTS)
    for name, number in (("mean pair cosine", r"-?\d\.\d{3}"), ("effective rank", r"\d+\.\d"),
                         ("condition number", r"[\d.e+]+|inf"),
                         ("partition isotropy I\(W\)", r"\d\.\d{3}")):  # one format a row
        assert re.search(rf"^{name} +({number}) +({number})$", printed, re.MULTILINE), name
    assert "alignment and uniformity (STS-B dev+test: 8 pairs with gold ≥ 4" in printed
    for label in ("raw", "standardize", "whitening", "whitening-5", "abtt-1", "flow"):
        assert f"\n  {label} " in printed
    assert "left out" not in printed


def test_the_pictures_say_what_they_show(tiny_encoder):
    """The token norms' title gives a rank correlation and the binned medians (a rise then a
    fall, which no linear r summarises), a zero unsigned; the spectrum's axis spans its data."""
    from bertflow.evaluation.diagnose import _spectrum, _token_norms

    rank = np.arange(201)
    norms = 1.25 - 0.35 * ((rank - 100) / 100) ** 2  # Spearman's ρ -0.0007
    counts = Counter(dict(enumerate(np.round(np.geomspace(1, 10000, 201)).astype(int))))
    weights = np.outer(norms, [1.0, 0.0, 0.0])
    axis = Figure().add_subplot()
    _token_norms(axis, tiny_encoder, weights, counts, 1000)
    title = axis.get_title()
    assert "201 tokens; Spearman ρ = 0.00; bin medians 0.9" in title and "-0.00" not in title
    assert re.search(r"bin medians 0\.9\d to 1\.2\d$", title), title
    x = np.random.default_rng(0).normal(size=(500, 16)) * np.geomspace(1, 0.02, 16)
    axis = Figure().add_subplot()
    _spectrum(axis, ((x, "before", "red"), (x * 2, "after", "blue")), "t")
    lowest = min(line.get_ydata().min() for line in axis.get_lines())
    assert 1e-3 < lowest and lowest / 2 < axis.get_ylim()[0] < lowest


def test_method_points(tiny_encoder, tmp_path):
    write_stsb_words(tmp_path / "STSBenchmark")
    pairs = list(read_stsb_splits(tmp_path / "STSBenchmark", ("dev", "test")).values())
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 16)) * np.geomspace(3, 0.1, 16) + 2
    y = tiny_encoder.encode(sentences_of(pairs), "mean")
    head = fit_tiny_head(tiny_encoder, "mean")
    points = method_points(x, pairs, y, head, flow_label="the head")
    assert list(points) == ["raw", "standardize", "whitening", "whitening-5", "abtt-1",
                            "the head"]
    for values in points.values():
        assert 0 <= values["alignment"] <= 4 and -4 <= values["uniformity"] <= 0


def test_diagnose_with_a_head_and_refusals(tmp_path, capsys, corpus_file, tiny_encoder_dir,
                                           other_encoder_dir):
    head = tmp_path / "head"
    main(["fit", str(corpus_file), "--out", str(head), "--encoder", str(tiny_encoder_dir),
          "--pooling", "static", "--cache", str(tmp_path / "c"), "--quiet"])
    out = tmp_path / "plots"
    assert main(["diagnose", str(corpus_file), "--out", str(out), "--head", str(head),
                 "--encoder", str(tiny_encoder_dir), "--cache", str(tmp_path / "c"),
                 "--quiet"]) == 0
    assert "alignment_uniformity.png left out: it needs STS-B" in capsys.readouterr().out
    check_pngs(out, [p for p in PLOTS if p != "alignment_uniformity.png"])
    (tmp_path / "no-sts").mkdir()
    code = main(["diagnose", str(corpus_file), "--out", str(tmp_path / "p3"), "--head",
                 str(head), "--encoder", str(tiny_encoder_dir), "--data",
                 str(tmp_path / "no-sts"), "--quiet"])
    assert code == 1 and "STSBenchmark/sts-dev.csv" in capsys.readouterr().err
    assert not (tmp_path / "p3").exists()
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


def test_plots_replace_their_own_folder_only(tmp_path, tiny_encoder):
    """A folder of plots without a manifest (written before manifests, or the user's own
    plots) is not told from the user's: it is refused; a folder of bertflow's plots is
    replaced."""
    old = tmp_path / "old"
    old.mkdir()
    for name in FIRST_PLOTS:
        (old / name).write_bytes(b"\x89PNG old")
    x = np.random.default_rng(0).normal(size=(60, 16))
    with pytest.raises(BertflowError, match="old is a non-empty folder but not a folder of "
                                            "bertflow plots; not replacing it"):
        plot_all(x, x * 2, old, encoder=tiny_encoder, corpus=["the dog"], title="t")
    assert {p.name: p.read_bytes() for p in old.iterdir()} == dict.fromkeys(
        FIRST_PLOTS, b"\x89PNG old")
    for name in FIRST_PLOTS:
        (old / name).unlink()
    paths = plot_all(x, x * 2, old, encoder=tiny_encoder, corpus=["the dog", "a cat"],
                     title="t")
    assert [p.name for p in paths] == [p for p in PLOTS if p != "alignment_uniformity.png"]
    check_pngs(old, [p.name for p in paths])
    points = {"raw": {"alignment": 0.5, "uniformity": -1.0},
              "flow": {"alignment": 0.8, "uniformity": -3.0},
              "none": {"alignment": None, "uniformity": -2.0}}
    paths = plot_all(x, x * 2, old, encoder=tiny_encoder, corpus=["the dog"], title="t",
                     points=points, points_title="toy")
    check_pngs(old, PLOTS)
