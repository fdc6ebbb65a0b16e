import json

import numpy as np
import pytest

from bertflow import BertflowError
from bertflow.cli.main import main
from bertflow.data.sts import Pairs, load_tasks
from bertflow.embeddings.isotropy import uniformity
from bertflow.evaluation.methods import make_method
from bertflow.evaluation.sts import evaluate, fit_sources, format_table, pair_measures
from bertflow.storage.files import read_sentences

from ..conftest import WORDS
from ..data.test_sts import write_sick, write_sts_year, write_stsb

KEYS = {"encoder", "pooling", "method", "fit_on", "task", "aggregation", "spearman",
        "mean_cosine", "effective_rank", "condition_number", "isotropy", "alignment",
        "uniformity"}


@pytest.fixture
def data(tmp_path):
    """STS-B, SICK and STS14 in SentEval's layout, with sentences the tiny model knows."""
    rng = np.random.default_rng(0)

    def sentence():
        return " ".join(rng.choice(WORDS, size=rng.integers(3, 8)))

    folder = tmp_path / "data"
    write_stsb(folder / "STSBenchmark", rows_per_split=30)
    write_sick(folder / "SICK")
    write_sts_year(folder / "STS14-en-test", "STS14")
    for path in folder.rglob("*.*"):  # swap the placeholder sentences for known words
        if path.name in ("readme.txt",):
            continue
        lines = path.read_text().splitlines()
        out = []
        for line in lines:
            fields = line.split("\t")
            if path.name.startswith("STS.input"):
                fields = [sentence(), sentence()]
            elif path.suffix == ".csv":
                fields[5:7] = [sentence(), sentence()]
            elif path.name.startswith("SICK") and not line.startswith("pair_ID"):
                fields[1:3] = [sentence(), sentence()]
            out.append("\t".join(fields))
        path.write_text("\n".join(out) + "\n")
    return folder


def recording(name, fitted):
    """A `make` for `evaluate`: fresh methods `name` that append what each is fit on to
    `fitted`."""
    def make():
        method = make_method(name)
        fit = method.fit
        method.fit = lambda x: fitted.append(np.array(x)) or fit(x)
        return method

    return make


def test_harness_rows_for_every_task_and_both_aggregations(data, tiny_encoder):
    tasks, missing = load_tasks(data)
    labels = {"encoder": "tiny", "pooling": "mean", "method": "whitening", "fit_on": "target"}
    fitted_on = []

    def embed(sentences):
        return tiny_encoder.encode(list(sentences), "mean")

    rows = evaluate(tasks, missing, embed, recording("whitening", fitted_on), "target", labels)
    by = {(r["task"], r["aggregation"]): r for r in rows}
    assert set(by) == {(t, a) for t in ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B",
                                        "SICK-R", "avg"] for a in ("all", "wmean")}
    for task in ("STS12", "STS13", "STS15", "STS16"):
        assert by[task, "all"]["missing"] and by[task, "all"]["spearman"] is None
    for task in ("STS14", "STS-B", "SICK-R"):
        assert KEYS <= set(by[task, "all"]) and np.isfinite(by[task, "all"]["spearman"])
    assert by["STS-B", "all"]["spearman"] == by["STS-B", "wmean"]["spearman"]
    assert by["STS14", "all"]["spearman"] != by["STS14", "wmean"]["spearman"]
    avg = by["avg", "all"]
    assert avg["tasks"] == ["STS14", "STS-B", "SICK-R"]
    assert avg["spearman"] == pytest.approx(np.mean([by[t, "all"]["spearman"]
                                                     for t in ("STS14", "STS-B", "SICK-R")]))
    # target: each task fit on its own sentences (STS-B: 3 splits × 30 pairs × 2)
    assert sorted(map(len, fitted_on)) == sorted([len(tasks[t].unlabeled) for t in tasks])
    assert len(tasks["STS-B"].unlabeled) > len(tasks["STS-B"].sentences())
    table = format_table(rows)
    assert "| tiny | mean | whitening | target | missing |" in table
    # alignment needs pairs with gold ≥ 4: STS-B has them, the SICK-R and STS14 here do not
    assert 0 < by["STS-B", "all"]["alignment"] < 4
    assert by["SICK-R", "all"]["alignment"] is None and avg["alignment"] is None
    assert avg["uniformity"] == pytest.approx(np.mean([by[t, "all"]["uniformity"]
                                                       for t in ("STS14", "STS-B", "SICK-R")]))


def test_target_and_a_file_fit_each_task_on_its_own_sentences_and_the_files(
        data, tiny_encoder, tmp_path, corpus_file):
    """`--fit-on target FILE`: every task is fit on its own sentences followed by the file's;
    the file alone is fit once; the rows say which; a second 'target' is refused."""
    tasks, missing = load_tasks(data, ["STS-B", "SICK-R"])
    extra = read_sentences(corpus_file)
    fit_on, also, label = fit_sources(["target", corpus_file])
    assert (fit_on, also, label) == ("target", extra, "target + corpus.txt")
    assert fit_sources(corpus_file) == (extra, [], "corpus.txt")
    assert fit_sources("target") == ("target", [], "target")
    with pytest.raises(BertflowError, match="'target' at most once"):
        fit_sources(["target", "target"])
    fitted = []

    def embed(sentences):
        return tiny_encoder.encode(list(sentences), "mean")

    make = recording("standardize", fitted)
    rows = evaluate(tasks, missing, embed, make, fit_on, {"fit_on": label}, also)
    assert len(fitted) == 2 and {r["fit_on"] for r in rows} == {"target + corpus.txt"}
    for x, name in zip(fitted, ("STS-B", "SICK-R"), strict=True):
        own = embed(tasks[name].unlabeled)
        np.testing.assert_array_equal(x, np.concatenate([own, embed(extra)]))


def test_a_head_without_a_recorded_pooling_is_scored_on_the_pooling_given(
        data, tiny_encoder, tmp_path):
    """`eval --head H --pooling last2`, H recording no pooling: last2 embeddings, so labelled."""
    from bertflow import FlowHead
    from bertflow.embeddings.cache import EmbeddingCache
    from bertflow.evaluation.sts import evaluate_method

    tasks, missing = load_tasks(data, ["STS-B"])
    x = tiny_encoder.encode(tasks["STS-B"].unlabeled, "last2")
    head = FlowHead.fit_linear(x, "abtt", encoder=tiny_encoder.id)
    cache = EmbeddingCache(tmp_path / "cache")
    rows = evaluate_method(tasks, missing, head, tiny_encoder, cache, name="h", pooling="last2")
    head.pooling = "last2"
    recorded = evaluate_method(tasks, missing, head, tiny_encoder, cache, name="h")
    assert {r["pooling"] for r in rows} == {"last2"}
    assert [r["spearman"] for r in rows] == [r["spearman"] for r in recorded]


def test_pair_measures_take_the_pairs_with_gold_of_at_least_four():
    sentences = ["a", "b", "c", "d", "e"]
    vectors = np.array([[1.0, 0], [2, 0], [0, 1], [0, -3], [-1, 0]])
    pairs = Pairs("toy", ["a", "c", "a", "c"], ["b", "c", "e", "d"],
                  np.array([4.0, 5, 3.9, 0]))
    measures = pair_measures([pairs], sentences, vectors)
    assert measures["alignment"] == 0  # a ~ b and c ~ c; a, e and c, d are left out
    assert measures["uniformity"] == pytest.approx(uniformity(vectors))
    assert pair_measures([Pairs("none", ["a"], ["e"], np.array([1.0]))], sentences,
                         vectors)["alignment"] is None


def test_eval_command_end_to_end(data, tmp_path, capsys, tiny_encoder_dir, corpus_file):
    out = tmp_path / "rows.json"
    code = main(["eval", "sts", str(data), "--method", "abtt", "--d", "2", "--pooling",
                 "cls", "--fit-on", str(corpus_file), "--encoder", str(tiny_encoder_dir),
                 "--out", str(out), "--cache", str(tmp_path / "cache"), "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0
    rows = json.loads(out.read_text())
    assert {r["fit_on"] for r in rows} == {"corpus.txt"}
    assert {r["method"] for r in rows} == {"abtt"} and {r["d"] for r in rows} == {2}
    assert KEYS <= set(next(r for r in rows if r["task"] == "STS-B"))
    assert "missing from" in printed and "STS12" in printed
    assert main(["eval", "sts", str(data), "--method", "standardize", "--fit-on", "target",
                 str(corpus_file), "--encoder", str(tiny_encoder_dir), "--out", str(out),
                 "--cache", str(tmp_path / "cache"), "--quiet", "--tasks", "STS-B"]) == 0
    assert {r["fit_on"] for r in json.loads(out.read_text())} == {"target + corpus.txt"}
    assert "recipe was chosen" not in capsys.readouterr().out  # not a flow: no note
    assert main(["eval", "sts", str(data), "--pooling", "cls", "--levels", "1", "--depth",
                 "2", "--encoder", str(tiny_encoder_dir), "--cache", str(tmp_path / "cache"),
                 "--quiet", "--tasks", "STS-B"]) == 0
    assert "note: the cls recipe was chosen fit on general text" in capsys.readouterr().out

    head = tmp_path / "head"
    assert main(["fit", str(corpus_file), "--out", str(head), "--encoder", str(tiny_encoder_dir),
                 "--pooling", "last2", "--cache", str(tmp_path / "cache"), "--quiet"]) == 0
    code = main(["eval", "sts", str(data), "--head", str(head), "--encoder",
                 str(tiny_encoder_dir), "--out", str(out), "--cache", str(tmp_path / "cache"),
                 "--quiet", "--tasks", "STS-B", "SICK-R"])
    assert code == 0
    rows = json.loads(out.read_text())
    assert {r["pooling"] for r in rows} == {"last2"} and {r["fit_on"] for r in rows} == {
        "corpus.txt"}
    assert {r["task"] for r in rows} == {"STS-B", "SICK-R", "avg"}


def test_eval_refusals(data, tmp_path, capsys, tiny_encoder_dir, other_encoder_dir, corpus_file):
    out = tmp_path / "rows.json"
    head = tmp_path / "head"
    main(["fit", str(corpus_file), "--out", str(head), "--encoder", str(tiny_encoder_dir),
          "--cache", str(tmp_path / "cache"), "--quiet"])
    capsys.readouterr()
    for args, message in [
        (["sts", str(tmp_path / "empty-dir")], "no data folder"),
        (["sts", str(data), "--tasks", "STS12"], "none of STS12 is in"),
        (["sts", str(data), "--head", str(head), "--encoder", str(other_encoder_dir)],
         "but these come from encoder"),
        (["sts", str(data), "--head", str(head), "--fit-on", "target"], "does not apply"),
        (["sts", str(data), "--method", "whitening-k", "--dims", "99", "--encoder",
          str(tiny_encoder_dir)], "must be between 1 and the dimension 16"),
    ]:
        code = main(["eval", *args, "--out", str(out), "--quiet",
                     "--cache", str(tmp_path / "cache")])
        err = capsys.readouterr().err
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()
    with pytest.raises(BertflowError):
        load_tasks(tmp_path / "nowhere")


def _flatten_gold(path, score="2.5"):
    """Give every pair of an STS-B split the same gold score."""
    lines = [line.split("\t") for line in path.read_text().splitlines()]
    path.write_text("\n".join("\t".join([*f[:4], score, *f[5:]]) for f in lines) + "\n")


def test_undefined_spearman_rows_are_null_with_a_reason_and_shown_as_na(data, tiny_encoder):
    _flatten_gold(data / "STSBenchmark" / "sts-test.csv")
    tasks, missing = load_tasks(data)
    labels = {"encoder": "tiny", "pooling": "mean", "method": "raw", "fit_on": "target"}

    def embed(sentences):
        return tiny_encoder.encode(list(sentences), "mean")

    rows = evaluate(tasks, missing, embed, lambda: make_method("raw"), "target", labels)
    json.dumps(rows, allow_nan=False)
    by = {(r["task"], r["aggregation"]): r for r in rows}
    for aggregation in ("all", "wmean"):
        row = by["STS-B", aggregation]
        assert row["spearman"] is None and "constant gold scores" in row["undefined"]
        assert by["avg", aggregation]["tasks"] == ["STS14", "SICK-R"]
    assert "| tiny | mean | raw | target | missing | missing | " in format_table(rows)
    assert "| n/a |" in format_table(rows) and "| n/a |" in format_table(rows, "wmean")

    def constant(sentences):
        return np.ones((len(sentences), 4), dtype=np.float32)

    rows = evaluate(tasks, missing, constant, lambda: make_method("raw"), "target", labels)
    json.dumps(rows, allow_nan=False)
    for row in rows:
        if row["task"] in ("STS14", "SICK-R"):  # STS-B's gold is constant too, said first
            assert row["spearman"] is None and "constant predicted" in row["undefined"], row
    assert not any(r["task"] == "avg" for r in rows)


def test_eval_command_with_constant_or_non_finite_gold(data, tmp_path, capsys, tiny_encoder_dir):
    out = tmp_path / "rows.json"
    args = ["eval", "sts", str(data), "--method", "raw", "--pooling", "mean", "--encoder",
            str(tiny_encoder_dir), "--out", str(out), "--cache", str(tmp_path / "cache"),
            "--quiet", "--tasks", "STS-B", "SICK-R"]
    _flatten_gold(data / "STSBenchmark" / "sts-test.csv")
    assert main(args) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c}"))
    stsb = [r for r in rows if r["task"] == "STS-B"]
    assert [r["spearman"] for r in stsb] == [None, None]
    assert "n/a" in printed and "constant gold scores" in printed

    out.unlink()
    for bad in ("nan", "inf"):
        _flatten_gold(data / "STSBenchmark" / "sts-dev.csv", bad)
        assert main(args) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert f"sts-dev.csv line 1: gold score '{bad}' is not a finite number" in err
        assert not out.exists()
