"""The retrieval harness on tiny BEIR folders and a tiny encoder: exact cosine search, pytrec_eval's
measures as MTEB computes them, methods fit on the documents, the queries or a text file (never
the qrels), a fitted head, and `bertflow eval --retrieval`."""

import json

import numpy as np
import pytest

from bertflow import BertflowError
from bertflow.cli.main import main
from bertflow.cli.parser import upgrade
from bertflow.embeddings.cache import EmbeddingCache
from bertflow.evaluation.retrieval import (
    MEASURES,
    MTEB_K,
    evaluate_retrieval,
    format_retrieval_table,
    ignores_identical_ids,
    mteb_name,
    mteb_scores,
    ranking,
    score_run,
    without_identical_ids,
)
from bertflow.training.feedback import Feedback
from bertflow.training.spec import MethodSpec

from ..conftest import WORDS, fit_tiny_head

pytest.importorskip("pytrec_eval")


def write_beir(folder, documents=24, queries=8, seed=0):
    """A BEIR folder of word salads the tiny model knows: titled and untitled documents, queries
    and qrels/test.tsv, qrels/train.tsv (two documents judged per query, one of them 2)."""
    rng = np.random.default_rng(seed)

    def salad(low=3, high=9):
        return " ".join(rng.choice(WORDS, size=rng.integers(low, high)))

    (folder / "qrels").mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i in range(documents):
            title = salad(1, 3) if i % 3 else ""
            f.write(json.dumps({"_id": f"d{i}", "title": title, "text": salad()}) + "\n")
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as f:
        for i in range(queries + 2):  # two queries no split judges
            f.write(json.dumps({"_id": f"q{i}", "text": salad(2, 6), "metadata": {}}) + "\n")
    for split, judged in (("test", range(0, queries, 2)), ("train", range(1, queries, 2))):
        rows = [f"q{q}\td{d}\t{r}" for q in judged
                for d, r in zip(rng.choice(documents, 2, replace=False), (1, 2), strict=True)]
        (folder / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return folder


@pytest.fixture
def beir(tmp_path):
    return write_beir(tmp_path / "tiny")


@pytest.fixture
def task(beir):
    from bertflow.data.beir import load_task

    return load_task(beir, "test")


def test_score_run_by_hand():
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1, "d3": 1}}
    run = {"q1": {"d0": 0.9, "d1": 0.8, "d2": 0.1},
           "q2": {"d2": 0.9, "d0": 0.8, "d3": 0.7},
           "q9": {"d1": 1.0}}  # judged by no qrels: not scored
    s = score_run(qrels, run)
    ndcg2 = (1 + 1 / np.log2(4)) / (1 + 1 / np.log2(3))
    assert s["ndcg_at_10"] == pytest.approx((1 / np.log2(3) + ndcg2) / 2)
    assert s["map_at_100"] == pytest.approx((0.5 + (1 + 2 / 3) / 2) / 2)
    assert s["mrr_at_10"] == pytest.approx((0.5 + 1) / 2)
    assert s["recall_at_100"] == pytest.approx(1.0)
    assert set(s) == set(MEASURES)


def test_mrr_at_10_counts_only_the_first_ten_and_breaks_ties_by_id_descending():
    qrels = {"q": {"d11": 1}}
    eleven = {"q": {f"d{i:02d}": 1 - i / 100 for i in range(12)}}  # the relevant one 12th
    assert score_run({"q": {"d11": 1}}, eleven)["mrr_at_10"] == 0
    tied = {"q": {"a": 0.5, "d11": 0.5, "z": 0.5}}  # by id descending: z, d11, a
    assert score_run(qrels, tied)["mrr_at_10"] == pytest.approx(0.5)


def test_score_run_equals_mtebs_own_scores():
    """Random runs with ties and graded qrels: pytrec_eval here, MTEB's evaluator there (where
    MTEB is installed; a moved module fails, not skips)."""
    pytest.importorskip("mteb")
    import mteb._evaluators.retrieval_metrics as metrics
    rng = np.random.default_rng(1)
    docs = [f"d{i}" for i in range(40)]
    qrels = {f"q{q}": {d: int(rng.integers(1, 3)) for d in rng.choice(docs, 3, replace=False)}
             for q in range(20)}
    run = {q: {d: float(rng.integers(0, 8)) / 8 for d in docs} for q in qrels}
    mine = score_run(qrels, run)
    theirs = metrics.calculate_retrieval_scores(run, qrels, [10, 100])
    assert mine["ndcg_at_10"] == pytest.approx(theirs.ndcg["NDCG@10"], abs=1e-5)
    assert mine["map_at_100"] == pytest.approx(theirs.map["MAP@100"], abs=1e-5)
    assert mine["recall_at_100"] == pytest.approx(theirs.recall["Recall@100"], abs=1e-5)
    assert mine["mrr_at_10"] == pytest.approx(theirs.mrr["MRR@10"], abs=1e-12)
    every = mteb_scores(qrels, run)  # every measure of MTEB's result files, at its cuts
    theirs = metrics.calculate_retrieval_scores(run, qrels, list(MTEB_K))
    expected = metrics.make_score_dict(
        ndcg=theirs.ndcg, _map=theirs.map, recall=theirs.recall, precision=theirs.precision,
        mrr=theirs.mrr, naucs={}, naucs_mrr={}, hit_rate=theirs.hit_rate, task_scores={})
    expected.pop("accuracy")
    assert every.keys() == expected.keys() and len(every) == 6 * len(MTEB_K)
    for name, value in expected.items():
        assert every[name] == pytest.approx(value, abs=1e-5), name


def test_identical_ids_are_left_out_as_mteb_leaves_them_out():
    """MTEB's own evaluator, with and without `ignore_identical_ids`, on the hand case and on
    random runs where some query ids are document ids; bertflow's default follows MTEB's per
    task, by BEIR's folder names."""
    import copy

    pytest.importorskip("mteb")
    from mteb._evaluators.retrieval_evaluator import RetrievalEvaluator

    def theirs(qrels, run, ignore):
        result = RetrievalEvaluator.evaluate(None, qrels, copy.deepcopy(run), [10, 100],
                                             ignore_identical_ids=ignore)
        return {"ndcg_at_10": result.ndcg["NDCG@10"], "map_at_100": result.map["MAP@100"],
                "mrr_at_10": result.mrr["MRR@10"], "recall_at_100": result.recall["Recall@100"]}

    hand = ({"a1": {"a2": 1}}, {"a1": {"a1": 0.99, "a2": 0.80, "a3": 0.5}})
    rng = np.random.default_rng(3)
    docs = [f"d{i}" for i in range(30)]
    qrels = {d: {e: 1 for e in rng.choice(docs, 2, replace=False) if e != d} for d in docs[:12]}
    random = (qrels, {q: {d: float(rng.random()) for d in docs} for q in qrels})
    for qrels, run in (hand, random):
        for ignore in (True, False):
            mine = score_run(qrels, without_identical_ids(run) if ignore else run)
            for name, value in theirs(qrels, run, ignore).items():
                assert mine[name] == pytest.approx(value, abs=1e-5), (name, ignore)
    assert score_run(*hand)["ndcg_at_10"] == pytest.approx(0.63093, abs=1e-5)
    assert score_run(hand[0], without_identical_ids(hand[1]))["ndcg_at_10"] == 1.0
    assert [n for n in ("arguana", "ArguAna", "quora", "fiqa", "FiQA2018", "msmarco", "fever",
                        "scifact", "nfcorpus", "hotpotqa") if ignores_identical_ids(n)] == [
        "arguana", "ArguAna", "quora", "fiqa", "FiQA2018", "msmarco", "fever"]


def test_eval_leaves_out_identical_ids_by_the_tasks_name_or_the_option(tmp_path, capsys,
                                                                       tiny_encoder_dir):
    """A task whose queries are documents (as ArguAna's): the query's own document ranks first
    and counts against it where kept; left out for a task named arguana, or when asked. The
    judged document has the query's text too (a tie, broken by id descending: second)."""
    (tmp_path / "qrels").mkdir()
    texts = ["a man plays the guitar", "a man plays the guitar", "the dog runs in the park",
             "a big red car", "the small cat eats food"]
    with open(tmp_path / "corpus.jsonl", "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"_id": f"a{i}" if i else "b0", "text": text}) + "\n")
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "b0", "text": texts[0]}) + "\n")
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nb0\ta1\t1\n")
    for name in ("scifact", "arguana"):
        (tmp_path / name).symlink_to(tmp_path, target_is_directory=True)
    base = ["eval", "retrieval", "--method", "raw", "--pooling", "mean", "--encoder",
            str(tiny_encoder_dir), "--quiet"]
    mrr = {}
    for name, flag in (("scifact", None), ("arguana", None), ("scifact", "--ignore-identical-ids"),
                       ("arguana", "--no-ignore-identical-ids")):
        assert main([*base[:2], str(tmp_path / name), *base[2:], *([flag] if flag else [])]) == 0
        out = capsys.readouterr().out
        row = [c.strip() for c in out.strip().splitlines()[-1].split("|")]
        mrr[name, flag] = float(row[9])
        assert ("left out" in out) == (mrr[name, flag] == 100), out
    assert mrr["scifact", None] == mrr["arguana", "--no-ignore-identical-ids"] == 50
    with pytest.raises(SystemExit):
        main(["eval", "sts", str(tmp_path), "--ignore-identical-ids"])
    assert "unrecognized arguments: --ignore-identical-ids" in capsys.readouterr().err


def test_ranking_keeps_ids_and_the_top():
    x = np.eye(3, dtype=np.float32)
    run = ranking(x[:2], x, ["a", "b"], ["x", "y", "z"], top=2)
    assert list(run) == ["a", "b"]
    assert list(run["a"]) == ["x", "y"] and run["a"]["x"] == pytest.approx(1)
    with pytest.raises(BertflowError, match="ids"):
        ranking(x[:2], x, ["a"], ["x", "y", "z"])


def test_raw_retrieval_embeds_through_the_cache_once(task, tiny_encoder, tmp_path):
    cache = EmbeddingCache(tmp_path / "cache")
    [row] = evaluate_retrieval(task, "raw", tiny_encoder, cache, pooling="mean", max_length=32)
    assert row["method"] == "raw" and row["fit_on"] == "corpus"
    assert (row["task"], row["split"], row["queries"], row["documents"]) == ("tiny", "test", 4, 24)
    assert all(0 <= row[m] <= 1 for m in MEASURES)
    entries = sorted(cache.root.glob("*.npy"))
    assert len(entries) == 2  # the documents and the queries
    again = evaluate_retrieval(task, "whitening", tiny_encoder, cache, pooling="mean",
                               max_length=32, fit_on=["corpus", "queries"])
    assert sorted(cache.root.glob("*.npy")) == entries
    assert again[0]["fit_on"] == "corpus + queries"
    # the same documents as a list, keyed as the harness keyed them
    docs = np.asarray(cache.encode(list(task.corpus), tiny_encoder, "mean", 32))
    assert docs.shape == (24, 16)
    assert sorted(cache.root.glob("*.npy")) == entries
    table = format_retrieval_table([row, *again])
    assert table.count("\n") == 3 and f"{100 * row['ndcg_at_10']:.2f}" in table


def test_methods_fit_on_the_documents_the_queries_or_a_file_never_the_qrels(
        beir, task, tiny_encoder, tmp_path, monkeypatch):
    from bertflow.evaluation import methods

    fitted = []
    fit = methods.Method.fit
    monkeypatch.setattr(methods.Method, "fit", lambda self, x: fitted.append(len(x)) or
                        fit(self, x))
    text = tmp_path / "more.txt"
    text.write_text("\n".join(" ".join(WORDS[i:i + 4]) for i in range(30)) + "\n")
    cache = EmbeddingCache(tmp_path / "cache")
    rows = {}
    for fit_on in ("corpus", "queries", text, ["corpus", "queries", text]):
        [rows[str(fit_on)]] = evaluate_retrieval(task, MethodSpec("whitening", k=3), tiny_encoder,
                                                 cache, pooling="mean", max_length=32,
                                                 fit_on=fit_on)
    assert fitted == [24, 4, 30, 58]
    assert rows[str(text)]["fit_on"] == "more.txt"
    assert rows["corpus"]["ndcg_at_10"] != rows["queries"]["ndcg_at_10"]
    for bad in (["corpus", "corpus"], []):
        with pytest.raises(BertflowError, match="at most once"):
            evaluate_retrieval(task, "raw", tiny_encoder, cache, pooling="mean", fit_on=bad)
    for split in ("test", "train"):  # refused before anything is encoded
        qrels = beir / "qrels" / f"{split}.tsv"
        with pytest.raises(BertflowError, match=f"{qrels} holds qrels"):
            evaluate_retrieval(task, "whitening", tiny_encoder, EmbeddingCache(tmp_path / "new"),
                               pooling="cls", fit_on=["corpus", qrels])
    assert len(fitted) == 4 and not (tmp_path / "new").exists()


@pytest.mark.parametrize("method", ["standardize", "whitening", "whitening-k", "abtt", "flow"])
def test_each_method_scores(task, tiny_encoder, tmp_path, method):
    options = {"whitening": {"shrinkage": 0.9}, "whitening-k": {"k": 4, "shrinkage": 0.5},
               "abtt": {"d": 1}}.get(method, {})
    recipe = {"flow": {"levels": 2, "depth": 2}, "train": {"epochs": 1}}
    spec = MethodSpec(method, **options, recipe=recipe if method == "flow" else None)
    [row] = evaluate_retrieval(task, spec, tiny_encoder, EmbeddingCache(tmp_path / "c"),
                               pooling="mean", max_length=32, progress=False)
    assert row["method"] == method and all(0 <= row[m] <= 1 for m in MEASURES)
    assert all(row.get(o) == options.get(o) for o in ("k", "d", "shrinkage"))
    again = evaluate_retrieval(task, spec, tiny_encoder, EmbeddingCache(tmp_path / "c"),
                               pooling="mean", max_length=32, progress=False)
    assert again == [row]  # seeded


def test_a_fitted_head_is_scored_with_its_pooling(task, tiny_encoder, tmp_path):
    head = fit_tiny_head(tiny_encoder, "cls")
    [row] = evaluate_retrieval(task, head, tiny_encoder, EmbeddingCache(tmp_path / "c"),
                               name="my-head")
    assert (row["method"], row["head"], row["pooling"], row["max_length"]) == (
        "flow", "my-head", "cls", 32)


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_eval_retrieval(beir, tiny_encoder_dir, tmp_path, capsys):
    common = ["--encoder", tiny_encoder_dir, "--pooling", "mean", "--max-length", "32",
              "--cache", tmp_path / "cache", "--quiet"]
    rows_file = tmp_path / "rows.json"
    code, out, err = run(capsys, "eval", "retrieval", beir, "--method", "raw", *common,
                         "--out", rows_file)
    assert code == 0, err
    assert "tiny (test: 4 queries, 24 documents)" in out and "| nDCG@10 |" in out
    [row] = json.loads(rows_file.read_text())
    assert (row["split"], row["method"], row["fit_on"]) == ("test", "raw", "corpus")
    code, out, err = run(capsys, "eval", "retrieval", beir, "--split", "train", "--method",
                         "whitening", "--dims", "3", "--fit-on", "queries", *common, "--out",
                         rows_file)
    assert code == 0, err
    [row] = json.loads(rows_file.read_text())
    assert (row["split"], row["method"], row["k"], row["fit_on"]) == (
        "train", "whitening-k", 3, "queries")
    head = tmp_path / "head"
    fit_tiny_head(__import__("bertflow").load_encoder(tiny_encoder_dir), "mean").save(head)
    code, out, err = run(capsys, "eval", "retrieval", beir, "--head", head, "--encoder",
                         tiny_encoder_dir, "--cache", tmp_path / "cache")
    assert code == 0, err
    assert "| flow |" in out


def test_a_head_fit_on_the_documents_is_labelled_as_a_method_fit_on_them(
        beir, tiny_encoder_dir, tmp_path, capsys):
    """"fit on" is `corpus` for the task's documents, whether a method or a head was fit on
    them; a head fit on other text keeps its file's name."""
    common = ["--encoder", tiny_encoder_dir, "--pooling", "mean", "--max-length", "32",
              "--cache", tmp_path / "cache", "--quiet"]
    other = tmp_path / "other.txt"
    other.write_text("\n".join(" ".join(WORDS[i:i + 4]) for i in range(30)) + "\n")
    rows = tmp_path / "rows.json"
    labels = {}
    for source in (beir / "corpus.jsonl", other, None):
        head = ["--head", tmp_path / source.stem] if source else ["--method", "whitening"]
        if source is not None:
            assert run(capsys, "fit", source, "--out", head[1], "--method", "whitening",
                       *common)[0] == 0
        code, _, err = run(capsys, "eval", "retrieval", beir, *head, *common, "--out", rows)
        assert code == 0, err
        labels[source and source.name] = json.loads(rows.read_text())[0]["fit_on"]
    assert labels == {"corpus.jsonl": "corpus", "other.txt": "other.txt", None: "corpus"}


def test_cli_eval_retrieval_refusals(beir, tiny_encoder_dir, tmp_path, capsys):
    missing = tmp_path / "missing"
    cases = [
        (["retrieval", beir, "--fit-on", "corpus", beir / "qrels" / "test.tsv", "--encoder",
          tiny_encoder_dir], f"{beir / 'qrels' / 'test.tsv'} holds qrels"),
        (["retrieval", beir, "--split", "dev"],
         f"no qrels/dev.tsv in the BEIR folder {beir} (splits: test, train)"),
        (["retrieval", missing], f"no BEIR folder at {missing}"),
        (["retrieval", beir, "--fit-on", "target"], "--fit-on target applies to eval sts"),
        (["retrieval", beir, "--fit-on", "corpus", missing], f"no such file: {missing}"),
        (["retrieval", beir, "--head", missing, "--fit-on", "corpus"],
         "--fit-on does not apply to --head"),
        (["retrieval", beir, "--method", "raw", "--fit-on", "queries"],
         "--fit-on applies to a method that is fit, not to --method raw"),
        (["retrieval", beir, "--out", beir / "rows.json"], "rows.json"),
    ]
    for args, message in cases:
        code, _, err = run(capsys, "eval", *args)
        assert code == 1 and message in err and err.count("\n") == 1, (args, err)
    for args in (["retrieval", beir, "--tasks", "STS-B"], ["sts", tmp_path, "--split", "train"],
                 ["sts", tmp_path, "--mteb", tmp_path], ["retrieval", beir, "--data", tmp_path]):
        with pytest.raises(SystemExit) as e:  # each kind of eval has only its own options
            main(["eval", *map(str, args)])
        assert e.value.code == 2
        assert "unrecognized arguments" in capsys.readouterr().err


def test_cli_eval_retrieval_writes_mtebs_result_file_and_json(beir, tiny_encoder_dir, tmp_path,
                                                              capsys):
    common = ["--method", "raw", "--encoder", tiny_encoder_dir, "--pooling", "mean",
              "--cache", tmp_path / "cache", "--quiet"]
    results = tmp_path / "results" / "tiny-model"
    code, out, err = run(capsys, "eval", "retrieval", beir, *common, "--mteb", results, "--json")
    assert code == 0, err
    [row] = json.loads(out)  # --json: the rows, and nothing else, on stdout
    written = json.loads((results / "tiny.json").read_text())
    assert f"wrote {results / 'tiny.json'}" in err
    assert written["task_name"] == "tiny" and list(written["scores"]) == ["test"]
    [test] = written["scores"]["test"]
    assert test["ndcg_at_10"] == test["main_score"] == pytest.approx(row["ndcg_at_10"])
    assert test["recall_at_100"] == pytest.approx(row["recall_at_100"])
    assert {f"{m}_at_{k}" for m in ("ndcg", "map", "recall", "precision", "mrr", "hit_rate")
            for k in MTEB_K} <= test.keys() and "mteb" not in row
    code, _, err = run(capsys, "eval", "retrieval", beir, "--split", "train", *common,
                       "--mteb", results)
    assert code == 0, err  # another split joins the same file
    assert list(json.loads((results / "tiny.json").read_text())["scores"]) == ["test", "train"]
    (results / "tiny.json").write_text('{"task_name": "SciFact", "scores": {}}')
    code, _, err = run(capsys, "eval", "retrieval", beir, *common, "--mteb", results)
    assert code == 1 and err.count("\n") == 1
    assert "is not MTEB's result file of tiny; not replacing it" in err
    assert json.loads((results / "tiny.json").read_text())["task_name"] == "SciFact"
    assert mteb_name("scifact") == "SciFact" and mteb_name("fiqa") == "FiQA2018"


def test_the_last_releases_eval_forms_still_run_and_say_what_to_use(beir, tiny_encoder_dir,
                                                                     tmp_path, capsys):
    common = ["--method", "raw", "--encoder", tiny_encoder_dir, "--pooling", "mean",
              "--cache", tmp_path / "cache", "--quiet"]
    code, out, err = run(capsys, "eval", "--retrieval", beir, *common, "--json",
                         tmp_path / "rows.json")
    assert code == 0, err
    assert json.loads((tmp_path / "rows.json").read_text())[0]["task"] == "tiny"
    assert "| nDCG@10 |" in out
    assert err.splitlines() == [
        f"bertflow: note: `eval --retrieval {beir}` is now `eval retrieval {beir}`; the old "
        "form goes in the next release",
        f"bertflow: note: eval's `--json {tmp_path / 'rows.json'}` is now `--out "
        f"{tmp_path / 'rows.json'}` (`--json` alone prints the rows as JSON); the old form goes "
        "in the next release"]
    assert upgrade(["--debug", "eval", "--data=d", "--tasks", "STS-B"]) == (
        ["--debug", "eval", "sts", "d", "--tasks", "STS-B"],
        ["`eval --data d` is now `eval sts d`"])
    assert upgrade(["eval", "sts", "d", "--json"]) == (["eval", "sts", "d", "--json"], [])
    for today in (["eval", "sts", "--json", "d"], ["eval", "retrieval", "--json", "d"]):
        assert upgrade(today) == (today, [])  # --json before the folder stays a flag
    assert upgrade(["fit", "--json", "x"]) == (["fit", "--json", "x"], [])
    note = "`--k` is now `--dims` (the components whitening-k keeps, as an index's --dims)"
    assert upgrade(["fit", "c.txt", "--k=3"]) == (["fit", "c.txt", "--dims=3"], [note])
    assert upgrade(["eval", "sts", "d", "--k", "3"]) == (["eval", "sts", "d", "--dims", "3"],
                                                         [note])
    assert upgrade(["search", "--k", "3"]) == (["search", "--k", "3"], [])


def test_feedback_moves_each_query_towards_its_first_exact_hits(task, tiny_encoder, tmp_path):
    """Each query q̂ is ranked as normalise(q̂ + β · the mean unit vector of its first exact
    search's top k), by hand here; β = 0 scores as the plain search."""
    cache = EmbeddingCache(tmp_path / "cache")
    options = {"pooling": "mean", "max_length": 32}
    [raw] = evaluate_retrieval(task, "raw", tiny_encoder, cache, **options)
    [zero] = evaluate_retrieval(task, "raw", tiny_encoder, cache, **options,
                                feedback=Feedback(2, 0))
    assert {m: zero[m] for m in MEASURES} == {m: raw[m] for m in MEASURES}
    [row] = evaluate_retrieval(task, "raw", tiny_encoder, cache, **options,
                               feedback=Feedback(2, 0.5))
    assert row["feedback"] == {"k": 2, "beta": 0.5, "weighted": False} and "feedback" not in raw
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    docs = unit(np.asarray(cache.encode(list(task.corpus), tiny_encoder, "mean", 32), float))
    queries = unit(np.asarray(cache.encode(list(task.queries.values()), tiny_encoder, "mean",
                                           32), float))
    first = np.argsort(-(queries @ docs.T), axis=1)[:, :2]
    moved = unit(queries + 0.5 * docs[first].mean(1))
    run = ranking(moved, docs, list(task.queries), task.corpus.ids)
    assert run != ranking(queries, docs, list(task.queries), task.corpus.ids)
    for name, value in score_run(task.qrels, run).items():
        assert row[name] == pytest.approx(value, abs=1e-6), name
    assert "| raw + feedback (k=2, beta=0.5) |" in format_retrieval_table([row])
    empty = EmbeddingCache(tmp_path / "empty")
    with pytest.raises(BertflowError, match=r"--feedback-k 25\) is more than the 24 documents"):
        evaluate_retrieval(task, "raw", tiny_encoder, empty, **options, feedback=Feedback(25))
    assert not list(empty.root.glob("*.npy"))  # refused before anything is embedded


def test_cli_eval_retrieval_with_feedback(beir, tiny_encoder_dir, tmp_path, capsys):
    common = ["eval", "retrieval", beir, "--method", "raw", "--encoder", tiny_encoder_dir,
              "--pooling", "mean", "--max-length", "32", "--cache", tmp_path / "cache", "--quiet"]
    code, out, err = run(capsys, *common, "--feedback-k", "3", "--feedback-weighted",
                         "--out", tmp_path / "rows.json")
    assert code == 0, err
    assert "| raw + feedback (k=3, beta=0.5, weighted=True) |" in out
    [row] = json.loads((tmp_path / "rows.json").read_text())
    assert row["feedback"] == {"k": 3, "beta": 0.5, "weighted": True}
    for options, message in ((["--feedback-k", "25"], "is more than the 24 documents"),
                             (["--feedback-beta", "1"], "--feedback-beta apply with --feedback-k")):
        code, _, err = run(capsys, *common, *options, "--out", tmp_path / "no.json")
        assert code == 1 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "no.json").exists()


def test_feedback_leaves_the_querys_own_document_out_where_the_ranking_does(task, tiny_encoder,
                                                                           tmp_path):
    """A query that is a document (as ArguAna's): where its own document is left out of its
    ranking, it is left out of the documents fed back too."""
    import dataclasses

    texts = list(task.corpus)
    asked = dataclasses.replace(task, queries={"d5": texts[5], "d9": texts[9], "q0": texts[2]},
                                qrels={"d5": {"d7": 1}, "d9": {"d1": 1}, "q0": {"d3": 1}})
    cache = EmbeddingCache(tmp_path / "cache")
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    docs = unit(np.asarray(cache.encode(texts, tiny_encoder, "mean", 32), float))
    queries = docs[[5, 9, 2]]
    for ignore in (True, False):
        [row] = evaluate_retrieval(asked, "raw", tiny_encoder, cache, pooling="mean",
                                   max_length=32, ignore_identical_ids=ignore,
                                   feedback=Feedback(2, 1.0))
        cosines = queries @ docs.T
        if ignore:
            cosines[[0, 1], [5, 9]] = -np.inf  # d5 and d9 left out; q0 is no document's id
        first = np.argsort(-cosines, axis=1)[:, :2]
        run = ranking(unit(queries + docs[first].mean(1)), docs, list(asked.queries),
                      task.corpus.ids)
        run = without_identical_ids(run) if ignore else run
        for name, value in score_run(asked.qrels, run).items():
            assert row[name] == pytest.approx(value, abs=1e-6), (ignore, name)
        assert (5 in first[0]) != ignore
