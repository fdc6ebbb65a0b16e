import numpy as np
import pytest
from scipy.stats import spearmanr

from bertflow import BertflowError
from bertflow.data.sts import (
    STS_SUBSETS,
    TASKS,
    Pairs,
    load_task,
    load_tasks,
    positive_pairs,
    read_sick,
    read_sts_subset,
    read_stsb,
    read_stsb_splits,
    score,
    sentences_of,
    undefined,
)


def write_stsb(folder, rows_per_split=4):
    folder.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        lines = [
            f"main-captions\tMSRvid\t2012test\t{i:04d}\t{i * 1.1:.3f}\t{split} a {i}\t{split} b {i}"
            for i in range(rows_per_split)
        ]
        lines[1] += "\tsource\textra"  # some SentEval lines carry extra columns
        (folder / f"sts-{split}.csv").write_text("\n".join(lines) + "\n")


def write_sick(folder):
    folder.mkdir(parents=True)
    header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"
    for name in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"):
        rows = [f"{i}\t{name} a {i}\t{name} b {i}\t{1 + i * 0.5}\tNEUTRAL" for i in range(5)]
        (folder / name).write_text("\n".join([header, *rows]) + "\n")


def write_sts_year(folder, year, empty_gold=(1,)):
    folder.mkdir(parents=True)
    (folder / "readme.txt").write_text("not data")
    for subset in STS_SUBSETS[year]:
        inputs = [f"{subset} one {i}\t{subset} two {i}" for i in range(6)]
        golds = ["" if i in empty_gold else f"{(i * 0.7) % 5:.2f}" for i in range(6)]
        (folder / f"STS.input.{subset}.txt").write_text("\n".join(inputs) + "\n")
        (folder / f"STS.gs.{subset}.txt").write_text("\n".join(golds) + "\n")


def test_read_stsb(tmp_path):
    write_stsb(tmp_path / "STSBenchmark")
    pairs = read_stsb(tmp_path / "STSBenchmark", "dev")
    assert len(pairs) == 4
    assert pairs.first[1] == "dev a 1" and pairs.second[1] == "dev b 1"
    np.testing.assert_allclose(pairs.gold, [0, 1.1, 2.2, 3.3])


def test_read_sick_by_header(tmp_path):
    write_sick(tmp_path / "SICK")
    pairs = read_sick(tmp_path / "SICK", "test")
    assert pairs.first[0] == "SICK_test_annotated.txt a 0"
    np.testing.assert_allclose(pairs.gold, [1, 1.5, 2, 2.5, 3])


def test_sts_subset_skips_empty_gold_lines(tmp_path):
    folder = tmp_path / "STS16-en-test"
    write_sts_year(folder, "STS16", empty_gold=(1, 4))
    pairs = read_sts_subset(folder, "headlines")
    assert len(pairs) == 4
    assert pairs.first == [f"headlines one {i}" for i in (0, 2, 3, 5)]


@pytest.mark.parametrize(
    "inputs,golds,message",
    [
        ("a\tb\nc d\n", "1\n2\n", "STS.input.headlines.txt line 2 is malformed"),
        ("a\tb\nc\td\te\n", "1\n2\n", "STS.input.headlines.txt line 2 is malformed"),
        ("a\tb\nc\td\n", "1\nfive\n",
         "STS.gs.headlines.txt line 2 is malformed: 'five' is not a score"),
        ("a\tb\nc\td\n", "1\n", "has 1 lines but"),
    ],
)
def test_malformed_sts_subsets_name_file_and_line(tmp_path, inputs, golds, message):
    (tmp_path / "STS.input.headlines.txt").write_text(inputs)
    (tmp_path / "STS.gs.headlines.txt").write_text(golds)
    with pytest.raises(BertflowError, match=message):
        read_sts_subset(tmp_path, "headlines")


def test_sts_files_may_start_with_a_byte_order_mark(tmp_path):
    """As `files.iter_sentences` reads a sentence file: a leading BOM is not text."""
    (tmp_path / "STS.input.headlines.txt").write_text("\ufeffa\tb\nc\td\n", encoding="utf-8")
    (tmp_path / "STS.gs.headlines.txt").write_text("\ufeff1\n2\n", encoding="utf-8")
    pairs = read_sts_subset(tmp_path, "headlines")
    assert pairs.first == ["a", "c"] and pairs.gold.tolist() == [1, 2]


def test_score_asks_once_per_subset_whether_spearman_is_defined(monkeypatch):
    import bertflow.data.sts as sts

    asked = []
    monkeypatch.setattr(sts, "undefined", lambda *a: asked.append(1) or undefined(*a))
    x = np.random.default_rng(0).normal(size=(8, 3))
    sentences = [str(i) for i in range(8)]
    subsets = [Pairs(n, sentences[i:i + 2], sentences[i + 2:i + 4], np.array([1.0, 2.0]))
               for n, i in (("a", 0), ("b", 4))]
    assert score(subsets, sentences, x)["wmean"] is not None
    assert len(asked) == 3  # each subset, and the pooled pairs


def test_malformed_stsb_and_sick_name_file_and_line(tmp_path):
    write_stsb(tmp_path / "STSBenchmark")
    path = tmp_path / "STSBenchmark" / "sts-test.csv"
    path.write_text(path.read_text() + "genre\tfile\tyear\tid\tnot-a-score\ta\tb\n")
    with pytest.raises(BertflowError, match="sts-test.csv line 5 is malformed"):
        read_stsb(tmp_path / "STSBenchmark", "test")
    write_sick(tmp_path / "SICK")
    path = tmp_path / "SICK" / "SICK_trial.txt"
    path.write_text(path.read_text() + "99\tonly one sentence\n")
    with pytest.raises(BertflowError, match="SICK_trial.txt line 7 is malformed"):
        read_sick(tmp_path / "SICK", "trial")
    (tmp_path / "SICK" / "SICK_train.txt").write_text("no header here\n")
    with pytest.raises(BertflowError, match="SICK_train.txt line 1 is not a SICK header"):
        read_sick(tmp_path / "SICK", "train")


def test_tasks_and_their_target_sentences(tmp_path):
    write_stsb(tmp_path / "STSBenchmark")
    write_sick(tmp_path / "SICK")
    write_sts_year(tmp_path / "STS13-en-test", "STS13")
    tasks, missing = load_tasks(tmp_path)
    assert sorted(tasks) == ["SICK-R", "STS-B", "STS13"]
    assert missing == ["STS12", "STS14", "STS15", "STS16"]
    stsb = tasks["STS-B"]
    assert [p.name for p in stsb.test] == ["STS-B test"]
    assert len(stsb.unlabeled) == 24  # train+dev+test, two sentences a pair, all distinct
    assert {s.split()[0] for s in stsb.unlabeled} == {"train", "dev", "test"}
    assert len(tasks["SICK-R"].unlabeled) == 30
    sts13 = tasks["STS13"]
    assert len(sts13.test) == 3 and len(sts13.unlabeled) == 3 * 5 * 2  # scored pairs only
    assert load_task(tmp_path, "STS15") is None
    with pytest.raises(BertflowError, match="no data folder"):
        load_tasks(tmp_path / "nope")


def test_all_sentences_of_stsb_are_its_unlabeled_corpus(tmp_path):
    write_stsb(tmp_path / "STSBenchmark")
    splits = read_stsb_splits(tmp_path / "STSBenchmark")
    assert list(splits) == ["train", "dev", "test"] and splits["dev"].name == "STS-B dev"
    sentences = sentences_of(splits.values())
    assert tuple(sentences) == load_task(tmp_path, "STS-B").unlabeled
    assert sentences[:2] == ["train a 0", "train a 1"] and len(sentences) == 24
    two = read_stsb_splits(tmp_path / "STSBenchmark", ("train", "dev"))
    assert sentences_of(two.values()) == sentences[:16]
    pairs = Pairs("p", ["a", "b", "a"], ["b", "c", "a"], np.zeros(3))
    assert sentences_of([pairs, pairs]) == ["a", "b", "c"]


def test_both_aggregations_against_scipy():
    rng = np.random.default_rng(0)
    sentences = [f"s{i}" for i in range(40)]
    vectors = rng.normal(size=(40, 5))
    subsets, cos_parts, gold_parts = [], [], []
    for k, size in enumerate((5, 8, 7)):
        first = [f"s{(k * 13 + j) % 40}" for j in range(size)]
        second = [f"s{(k * 7 + 3 * j + 1) % 40}" for j in range(size)]
        gold = rng.uniform(0, 5, size)
        subsets.append(Pairs(f"sub{k}", first, second, gold))
        a = vectors[[int(s[1:]) for s in first]]
        b = vectors[[int(s[1:]) for s in second]]
        cos_parts.append((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))
        gold_parts.append(gold)
    got = score(subsets, sentences, vectors)
    pooled = spearmanr(np.concatenate(cos_parts), np.concatenate(gold_parts)).statistic * 100
    per = [spearmanr(c, g).statistic * 100 for c, g in zip(cos_parts, gold_parts, strict=True)]
    assert got["all"] == pytest.approx(pooled)
    assert got["wmean"] == pytest.approx((5 * per[0] + 8 * per[1] + 7 * per[2]) / 20)
    assert got["all"] != pytest.approx(got["wmean"])


def test_hand_case_spearman():
    pairs = Pairs("hand", ["a", "a", "a"], ["b", "c", "d"], np.array([3.0, 1.0, 2.0]))
    vectors = np.array([[1, 0], [1, 0.1], [0, 1], [1, 1]], dtype=float)  # cos: ~1, 0, .71
    assert score([pairs], ["a", "b", "c", "d"], vectors)["all"] == pytest.approx(100.0)


def test_task_names():
    assert TASKS == ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R")


def test_cr_only_and_crlf_files_read_as_lf(tmp_path):
    for ending in ("\r", "\r\n"):
        lf, other = tmp_path / "lf" / ending.encode().hex(), tmp_path / ending.encode().hex()
        for folder in (lf, other):
            write_stsb(folder / "STSBenchmark")
            write_sick(folder / "SICK")
            write_sts_year(folder / "STS16-en-test", "STS16", empty_gold=(1, 4))
        for path in other.rglob("*.*"):
            path.write_bytes(path.read_bytes().replace(b"\n", ending.encode()))
        want, got = load_tasks(lf)[0], load_tasks(other)[0]
        assert sorted(got) == ["SICK-R", "STS-B", "STS16"]
        for name, task in want.items():
            assert got[name].unlabeled == task.unlabeled
            for a, b in zip(got[name].test, task.test, strict=True):
                assert (a.first, a.second) == (b.first, b.second)
                np.testing.assert_array_equal(a.gold, b.gold)
    (tmp_path / "STS.input.x.txt").write_bytes(b"a\tb\rc\td\r")
    (tmp_path / "STS.gs.x.txt").write_bytes(b"1\r\xff\r")
    with pytest.raises(BertflowError, match="bad byte on line 2"):
        read_sts_subset(tmp_path, "x")


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-Infinity"])
def test_non_finite_gold_scores_are_refused_naming_file_and_line(tmp_path, bad):
    write_stsb(tmp_path / "STSBenchmark")
    path = tmp_path / "STSBenchmark" / "sts-dev.csv"
    lines = path.read_text().splitlines()
    lines[2] = "\t".join([*lines[2].split("\t")[:4], bad, "x", "y"])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BertflowError, match=f"sts-dev.csv line 3: gold score '{bad}' is not a "
                                            "finite number"):
        read_stsb(tmp_path / "STSBenchmark", "dev")
    write_sick(tmp_path / "SICK")
    path = tmp_path / "SICK" / "SICK_trial.txt"
    path.write_text(path.read_text().replace("\t2.0\t", f"\t{bad}\t"))
    with pytest.raises(BertflowError, match=f"SICK_trial.txt line 4: gold score '{bad}'"):
        read_sick(tmp_path / "SICK", "trial")
    (tmp_path / "STS.input.headlines.txt").write_text("a\tb\nc\td\n")
    (tmp_path / "STS.gs.headlines.txt").write_text(f"1\n{bad}\n")
    with pytest.raises(BertflowError, match=f"STS.gs.headlines.txt line 2: gold score '{bad}'"):
        read_sts_subset(tmp_path, "headlines")


def test_undefined_spearman_is_none_with_a_reason():
    import json

    sentences = ["a", "b", "c", "d"]
    vectors = np.array([[1, 0], [1, 0.1], [0, 1], [1, 1]], dtype=float)
    varied = Pairs("varied", ["a", "a", "a"], ["b", "c", "d"], np.array([3.0, 1.0, 2.0]))
    constant = Pairs("flat", ["a", "b", "c"], ["b", "c", "d"], np.array([2.0, 2.0, 2.0]))
    got = score([constant], sentences, vectors)
    assert got["all"] is None and got["wmean"] is None
    assert got["undefined"] == {"all": "constant gold scores",
                                "wmean": "constant gold scores in flat"}
    got = score([varied, constant], sentences, vectors)
    assert got["all"] is not None and np.isfinite(got["all"])
    assert got["wmean"] is None and got["undefined"] == {"wmean": "constant gold scores in flat"}
    same = np.ones((4, 2))
    got = score([varied], sentences, same)
    assert got["all"] is None and got["undefined"]["all"] == "constant predicted similarities"
    json.dumps(got, allow_nan=False)


def test_positive_pairs_pool_the_subsets_with_gold_of_at_least_four(tmp_path):
    write_sick(tmp_path / "SICK")  # relatedness 1 to 3 (of 1-5): no positive
    write_stsb(tmp_path / "STSBenchmark", rows_per_split=6)  # gold 0, 1.1, ..., 5.5
    sick = read_sick(tmp_path / "SICK", "test")
    dev, test = (read_stsb(tmp_path / "STSBenchmark", s) for s in ("dev", "test"))
    positives = positive_pairs([dev, sick, test])
    assert positives.first == ["dev a 4", "dev a 5", "test a 4", "test a 5"]
    assert positives.second == ["dev b 4", "dev b 5", "test b 4", "test b 5"]
    np.testing.assert_allclose(positives.gold, [4.4, 5.5, 4.4, 5.5])
    assert len(positive_pairs([sick])) == 0 and len(positive_pairs([sick], 3)) == 1
