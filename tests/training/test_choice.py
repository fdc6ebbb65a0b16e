"""The label-free choice: the proxy built from a corpus, the bootstrap rule that keeps the
baseline unless beaten beyond its interval, `bertflow fit --for`, and the query log's refusal."""

import json

import numpy as np
import pytest

from bertflow import Head, MethodSpec
from bertflow.errors import BertflowError
from bertflow.training.choice import (
    candidates,
    choose_head,
    feedback_candidates,
    format_choice,
    proxy_feedback,
    recorded_feedback,
)
from bertflow.training.feedback import Feedback
from bertflow.training.proxy import (
    MIN_PAIRS,
    Proxy,
    build_proxy,
    proxy_agreement,
    proxy_ndcg,
    proxy_text,
)

from ..cli.test_cli import assert_refused, run
from ..conftest import WORDS
from ..evaluation.test_retrieval_eval import write_beir


def test_a_document_splits_at_its_first_sentence_else_gives_its_title():
    docs = [[("", f"The first sentence, {i}, is long enough. The rest of it, {i}, is long too."),
             ("A title", f"One sentence only, no split here {i}"),
             ("", f"Short. But the rest of this one, {i}, is long enough to keep."),
             ("", "untitled and one sentence")] for i in range(50)]
    proxy = build_proxy("retrieval", [d for four in docs for d in four])
    assert proxy.groups["first sentence → rest"][0][0] == "The first sentence, 0, is long enough."
    assert proxy.groups["first sentence → rest"][1][0] == "The rest of it, 0, is long too."
    assert proxy.groups["title → text"][0][0] == "A title"
    assert (proxy.items, proxy.skipped, len(proxy)) == (200, 100, 100)
    assert "50 first sentence → rest, 50 title → text pairs (100 of 200" in \
        proxy_text(proxy.describe())


def test_a_sentence_is_cropped_into_overlapping_three_fifths():
    proxy = build_proxy("sts", [("", f"one two three four five six {i}")
                                for i in range(MIN_PAIRS)])
    queries, items = proxy.groups["two crops"]
    assert queries[0] == "one two three four five" and items[0] == "three four five six 0"


def test_a_corpus_too_small_for_a_proxy_is_refused_saying_what_applies():
    sentences = [("", f"a man plays the guitar in park {i}") for i in range(500)]
    with pytest.raises(BertflowError, match=r"too small for a retrieval proxy: 0 of its 500 .*"
                                            r"--for sts crops sentences"):
        build_proxy("retrieval", sentences, name="lines.txt")
    with pytest.raises(BertflowError, match=f"99 of its 99 items .* it needs {MIN_PAIRS}"):
        build_proxy("sts", sentences[:99])


def test_a_large_corpus_gives_a_seeded_sample_in_corpus_order():
    docs = [("", f"sentence {i} " + "x" * 30 + ". And the rest of document " + str(i))
            for i in range(500)]
    a, b = build_proxy("retrieval", docs, limit=150), build_proxy("retrieval", docs, limit=150)
    rests = a.groups["first sentence → rest"][1]
    assert len(a) == 150 and rests == b.groups["first sentence → rest"][1]
    numbers = [int(r.rsplit(" ", 1)[1]) for r in rests]
    assert numbers == sorted(numbers) and numbers != list(range(150))
    assert build_proxy("retrieval", docs, limit=150, seed=1).groups != a.groups


def test_proxy_ndcg_by_hand():
    items = np.eye(12)
    queries = items.copy()
    queries[1] = items[1] + 2 * items[0]  # item 0 ranks first: its own is second
    queries[2] = -items[2]  # its own ranks last, of twelve
    scores = proxy_ndcg(queries, items)
    assert scores[0] == 1 and scores[1] == pytest.approx(1 / np.log2(3)) and scores[2] == 0


def test_vectors_that_tell_nothing_apart_score_nothing():
    """Ties rank above the relevant item: one vector for every text, or zeros, score 0."""
    same = np.ones((20, 4))
    assert proxy_ndcg(same, same).max() == 0 and proxy_ndcg(np.zeros((20, 4)), same).max() == 0
    items = np.eye(12)
    items[3] = items[2]  # item 3 ties with item 2 for query 2: its own ranks second
    assert proxy_ndcg(np.eye(12), items)[2] == pytest.approx(1 / np.log2(3))


def test_a_repeated_document_gives_one_pair():
    doc = ("", "The first sentence is long enough. The rest of it is long enough too.")
    others = [("", f"Sentence number {i} is long enough. And its rest, {i}, is long too.")
              for i in range(120)]
    proxy = build_proxy("retrieval", [doc, *others, doc])
    assert (len(proxy), proxy.skipped) == (121, 1)


def _anisotropic(seed=0, n=400, dim=12):
    """Pairs that share a signal, all sitting on one large common direction (a cone): removing
    it helps cosine find each query's pair."""
    rng = np.random.default_rng(seed)
    signal = rng.normal(size=(n, dim))
    common = 8 * np.eye(dim)[0] * rng.normal(1, 0.5, size=(n, 1))
    items = signal + common
    queries = signal + rng.normal(scale=0.8, size=(n, dim)) + 8 * np.eye(dim)[0] * \
        rng.normal(1, 0.5, size=(n, 1))
    return queries.astype(np.float32), items.astype(np.float32)


def _choose(queries, items, specs):
    proxy = build_proxy("retrieval", [("", f"q{i} " + "x" * 21 + f". i{i} " + "y" * 21)
                                      for i in range(len(queries))])
    vectors = {t: v for t, v in zip(proxy.groups["first sentence → rest"][0], queries,
                                    strict=True)}
    vectors.update(zip(proxy.groups["first sentence → rest"][1], items, strict=True))
    corpus = np.concatenate([items, queries])
    return choose_head(specs, lambda spec: Head.fit_linear(
        corpus, spec.name, k=spec.k, d=spec.d, gamma=spec.gamma),
        proxy, lambda texts: np.stack([vectors[t] for t in texts]))


def test_a_candidate_that_beats_the_identity_beyond_its_interval_is_chosen():
    queries, items = _anisotropic()
    specs = [("identity (raw)", MethodSpec("identity")), ("abtt d=1", MethodSpec("abtt", d=1))]
    choice = _choose(queries, items, specs)
    assert choice.label == "abtt d=1" and choice.head.method == "abtt"
    low, high = choice.rows[1]["interval"]
    assert 0 < low <= choice.rows[1]["difference"] <= high
    assert "| abtt d=1 * | 12 |" in format_choice(choice.rows)
    assert set(choice.heads) == {"identity (raw)", "abtt d=1"}


def test_a_candidate_with_non_finite_vectors_is_never_chosen():
    queries, items = _anisotropic()
    specs = [("identity (raw)", MethodSpec("identity")), ("abtt d=1", MethodSpec("abtt", d=1))]
    proxy = build_proxy("retrieval", [("", f"q{i} " + "x" * 21 + f". i{i} " + "y" * 21)
                                      for i in range(len(queries))])
    [(texts, _)] = proxy.groups.values()
    corpus = np.concatenate([items, queries])

    def fit(spec):
        head = Head.fit_linear(corpus, spec.name, d=spec.d)
        if spec.name == "abtt":
            head.linear.weight.data[0, 0] = float("nan")
        return head

    choice = choose_head(specs, fit, proxy, lambda t: queries if t is texts else items)
    assert choice.label == "identity (raw)"
    assert "to NaN or inf" in choice.rows[1]["not_fit"] and not choice.rows[1]["chosen"]


def test_the_identity_is_kept_unless_beaten_beyond_the_interval():
    rng = np.random.default_rng(1)
    items = rng.normal(size=(300, 12)).astype(np.float32)  # isotropic already
    queries = (items + rng.normal(scale=1.0, size=items.shape)).astype(np.float32)
    specs = [("identity (raw)", MethodSpec("identity")), ("center", MethodSpec("center")),
             ("whitening", MethodSpec("whitening"))]
    choice = _choose(queries, items, specs)
    assert choice.label == "identity (raw)" and choice.head.method == "identity"
    assert all(r["interval"][0] <= 0 for r in choice.rows[1:])
    assert [r["chosen"] for r in choice.rows] == [True, False, False]


def test_proxy_agreement_is_one_for_twins_none_for_strangers_and_zero_when_all_tie():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 8)).astype(np.float32)
    assert np.allclose(proxy_agreement(x, x.copy()), 1.0)
    assert proxy_agreement(x, 3 * x).min() > 0.99  # float32 rounding may swap a near tie
    strangers = proxy_agreement(x, rng.normal(size=x.shape).astype(np.float32))
    assert abs(strangers.mean()) < 0.03 and strangers.min() < 0 < strangers.max()
    same = np.ones_like(x)  # every other text ties: the ranking says nothing
    assert np.array_equal(proxy_agreement(x, same), np.zeros(len(x)))
    assert np.array_equal(proxy_agreement(x, x, seed=1), proxy_agreement(x, x, seed=1))
    with pytest.raises(BertflowError, match="give no 100 partners"):
        proxy_agreement(x[:100], x[:100])


def _crops(seed=0, n=400, dim=12):
    """Two crops of each of `n` sentences: what they share is mostly a topic on two large
    directions, which ranks the other sentences, plus a little on ten small ones, under as
    much noise of each crop's own. Whitening finds each crop's twin better by the small
    directions, and ranks the others by their noise."""
    rng = np.random.default_rng(seed)
    scale = np.r_[5.0, 5.0, [0.3] * (dim - 2)]
    shared = rng.normal(size=(n, dim)) * scale

    def crop():
        return shared + rng.normal(size=(n, dim)) * np.r_[2.0, 2.0, [0.3] * (dim - 2)]

    return crop().astype(np.float32), crop().astype(np.float32)


def _choose_sts(queries, items, specs):
    proxy = build_proxy("sts", [("", f"first{i} two three four five last{i}")
                                for i in range(len(queries))])
    [(first, last)] = proxy.groups.values()
    vectors = dict(zip(first, queries, strict=True)) | dict(zip(last, items, strict=True))
    corpus = np.concatenate([items, queries])
    return choose_head(specs, lambda spec: Head.fit_linear(corpus, spec.name, d=spec.d),
                       proxy, lambda texts: np.stack([vectors[t] for t in texts]))


def test_on_an_sts_proxy_a_candidate_that_ranks_the_others_less_alike_is_not_chosen():
    queries, items = _crops()
    specs = [("identity (raw)", MethodSpec("identity")), ("whitening", MethodSpec("whitening"))]
    choice = _choose_sts(queries, items, specs)
    base, whitening = choice.rows
    assert whitening["interval"][0] > 0  # it finds the twins better beyond its interval
    assert whitening["agreement"] < base["agreement"]
    assert whitening["agreement_interval"][1] < 0  # and ranks the others less alike
    assert choice.label == "identity (raw)"
    low, high = whitening["agreement_interval"]
    assert choice.reason() == (
        f"kept identity (raw): whitening beat it on the proxy ({whitening['difference']:+.2f})"
        " but did not rank the other sentences more alike from either crop (neighbour "
        f"agreement {whitening['agreement_difference']:+.2f}, joint 95% interval "
        f"[{low:+.2f}, {high:+.2f}])")
    assert "so does that of its neighbour agreement's" in choice.evidence()["rule"]
    assert f"| {base['agreement']:.2f} (+0.00 [+0.00, +0.00]) |" in format_choice(choice.rows)


def test_on_an_sts_proxy_a_candidate_that_keeps_the_ranking_is_chosen():
    queries, items = _anisotropic()  # the cone's length, each view's own, ranks the others
    specs = [("identity (raw)", MethodSpec("identity")), ("abtt d=1", MethodSpec("abtt", d=1))]
    choice = _choose_sts(queries, items, specs)
    assert choice.rows[1]["agreement_interval"][0] > 0 < choice.rows[1]["interval"][0]
    assert choice.label == "abtt d=1" and choice.reason().startswith("chose abtt d=1: proxy")


def test_the_candidates_at_fewer_dimensions_put_pca_first():
    assert candidates(384)[0][1].name == "identity" and candidates(384)[-1][1].name == "flow"
    assert [s.k for _, s in candidates(384, 128)] == [128] * 6
    assert candidates(384)[-2][0] == "fractional γ=spectrum"
    assert candidates(384, 128)[0][0] == "pca k=128"
    with pytest.raises(BertflowError, match="--dims 384 is not between 1 and 383"):
        candidates(384, 384)


def _write_documents(path, count=160, seed=0):
    rng = np.random.default_rng(seed)

    def salad():
        return " ".join(rng.choice(WORDS, size=rng.integers(6, 10)))

    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            title = salad() if i % 4 == 0 else ""
            f.write(json.dumps({"_id": f"d{i}", "title": title,
                                "text": f"{salad()}. {salad()}."}) + "\n")
    return path


@pytest.fixture
def documents(tmp_path):
    return _write_documents(tmp_path / "corpus.jsonl")


FAST = ["--epochs", "1", "--levels", "2", "--depth", "2", "--quiet"]


def test_fit_for_retrieval_writes_the_chosen_head_with_its_evidence(
        tmp_path, capsys, documents, tiny_encoder_dir):
    head = tmp_path / "head"
    common = ["--encoder", tiny_encoder_dir, "--pooling", "mean", "--cache", tmp_path / "c"]
    code, out, err = run(capsys, "fit", documents, "--for", "retrieval", "--out", head,
                         *common, *FAST)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith("| candidate | dims | proxy nDCG@10 |")
    # and a flow after the best map, and the feedback settings on the baseline
    assert len(lines) == 2 + len(candidates(16)) + 1 + len(feedback_candidates()) + 1
    assert [line for line in lines if line.startswith("| flow after ")]
    assert lines[-1].startswith(f"wrote {head}: ") and "first sentence → rest" in lines[-1]
    config = json.loads((head / "config.json").read_text())
    choice = config["training"]["choice"]
    chosen = [r for r in choice["candidates"] if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["candidate"] == choice["chosen"]
    assert choice["proxy"]["pairs"]["first sentence → rest"] >= MIN_PAIRS
    assert Head.load(head).pooling == "mean" and Head.load(head).dim == 16
    code, out, err = run(capsys, "info", head)
    assert code == 0 and f"chosen      {choice['chosen']} of {len(choice['candidates'])} " \
        "candidates on a retrieval proxy" in out, out

    again = tmp_path / "again"  # seeded: the same head, bit for bit
    assert run(capsys, "fit", documents, "--for", "retrieval", "--out", again, *common,
               *FAST)[0] == 0
    assert (head / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()

    reduced = tmp_path / "reduced"
    code, out, err = run(capsys, "fit", documents, "--for", "retrieval", "--dims", "4",
                         "--out", reduced, *common, "--quiet")
    assert code == 0, err
    assert "| pca k=4" in out and Head.load(reduced).out_dim == 4


def test_fit_for_sts_scores_and_records_each_candidates_neighbour_agreement(
        tmp_path, capsys, tiny_encoder_dir):
    rng = np.random.default_rng(0)
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(" ".join(rng.choice(WORDS, size=rng.integers(6, 12))) + "\n"
                             for _ in range(160)), encoding="utf-8")
    head = tmp_path / "head"
    code, out, err = run(capsys, "fit", lines, "--for", "sts", "--out", head, "--encoder",
                         tiny_encoder_dir, "--pooling", "mean", "--cache", tmp_path / "c", *FAST)
    assert code == 0, err
    table = out.strip().splitlines()
    assert table[0].endswith("| joint 95% interval | neighbour agreement |")
    assert len(table) == 2 + len(candidates(16)) + 1 + 1  # no feedback rows for sts
    assert table[-1].startswith(f"wrote {head}: ") and "two crops" in table[-1]
    choice = json.loads((head / "config.json").read_text())["training"]["choice"]
    assert "neighbour agreement's" in choice["rule"]
    fitted = [r for r in choice["candidates"] if "not_fit" not in r]
    assert all(len(r["agreement_interval"]) == 2 for r in fitted)
    assert fitted[0]["agreement_difference"] == 0


def test_fit_for_refuses_what_cannot_apply(tmp_path, capsys, documents, tiny_encoder_dir):
    out = tmp_path / "head"
    lines = tmp_path / "lines.txt"
    lines.write_text("a man plays the guitar in the park\n" * 300, encoding="utf-8")
    np.save(tmp_path / "emb.npy", np.ones((200, 16), np.float32))
    common = ["--encoder", tiny_encoder_dir, "--cache", tmp_path / "c", "--out", out]
    for args, message in (
            ([lines, "--for", "retrieval"], "too small for a retrieval proxy: 0 of its 300"),
            ([documents, "--for", "retrieval", "--method", "pca"],
             "--for retrieval chooses the method: --method cannot apply"),
            ([documents, "--for", "sts", "--gamma", "0.5"], "--gamma cannot apply"),
            ([tmp_path / "emb.npy", "--for", "sts"], "give the corpus, not the embeddings"),
            ([documents, "--queries", lines], "--queries applies with --for"),
            ([documents, "--for", "retrieval", "--dims", "4", "--epochs", "2"],
             "--dims chooses among linear heads: --epochs cannot apply"),
            ([documents, "--for", "retrieval", "--dims", "4", "--no-isotropic"],
             "--dims chooses among linear heads: --no-isotropic cannot apply"),
            ([documents, "--for", "sts", "--queries", lines],
             "a query log applies to --for retrieval"),
            ([documents, "--for", "retrieval", "--dims", "16"],
             "--dims 16 is not between 1 and 15")):
        assert_refused(capsys, ["fit", *args, *common], message, out)


def test_a_head_fit_with_a_query_log_is_not_scored_on_its_queries(
        tmp_path, capsys, tiny_encoder_dir):
    pytest.importorskip("pytrec_eval")
    beir = write_beir(tmp_path / "tiny", documents=24)
    _write_documents(beir / "corpus.jsonl")  # documents a proxy can split
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td1\t1\n"
                                             "q2\td3\t1\n", encoding="utf-8")
    queries = [json.loads(line) for line in (beir / "queries.jsonl").open(encoding="utf-8")]
    log = tmp_path / "log.txt"
    log.write_text(f"{queries[5]['text']}\n  {'  '.join(queries[2]['text'].split())} \n",
                   encoding="utf-8")
    head = tmp_path / "head"
    common = ["--encoder", tiny_encoder_dir, "--pooling", "mean", "--cache", tmp_path / "c"]
    code, out, err = run(capsys, "fit", beir / "corpus.jsonl", "--for", "retrieval", "--queries",
                         log, "--out", head, *common, *FAST)
    assert code == 0, err
    recorded = Head.load(head).training_info["query_log"]
    assert (recorded["file"], recorded["count"], len(recorded["digests"])) == ("log.txt", 2, 2)
    assert "query log   log.txt: 2 queries" in run(capsys, "info", head)[1]
    code, out, err = run(capsys, "eval", "retrieval", beir, "--head", head, *common)
    assert code != 0 and "holds 1 of tiny's test queries it would score (first: query 'q2')" \
        in err, err
    log.write_text(f"{queries[5]['text']}\n", encoding="utf-8")  # a train query only
    assert run(capsys, "fit", beir / "corpus.jsonl", "--for", "retrieval", "--queries", log,
               "--out", head, *common, *FAST)[0] == 0
    code, out, err = run(capsys, "eval", "retrieval", beir, "--head", head, *common)
    assert code == 0, err


def test_a_candidate_that_cannot_be_fit_gets_a_row_saying_why_and_is_never_chosen():
    queries, items = _anisotropic(n=200, dim=12)
    corpus = items[:10]  # fewer rows than dimensions: no full whitening
    proxy = build_proxy("retrieval", [("", f"q{i} " + "x" * 21 + f". i{i} " + "y" * 21)
                                      for i in range(len(queries))])
    [(texts, _)] = proxy.groups.values()
    specs = [("identity (raw)", MethodSpec("identity")), ("whitening", MethodSpec("whitening")),
             ("center", MethodSpec("center"))]
    choice = choose_head(specs, lambda spec: Head.fit_linear(corpus, spec.name), proxy,
                         lambda t: queries if t is texts else items)
    [row] = [r for r in choice.rows if r["candidate"] == "whitening"]
    assert "needs at least 13 rows, got 10" in row["not_fit"] and not row["chosen"]
    assert "| whitening | | | | not fit: whitening" in format_choice(choice.rows)
    assert set(choice.heads) == {"identity (raw)", "center"}
    with pytest.raises(BertflowError, match="needs at least 13 rows"):  # the baseline must fit
        choose_head(specs[1:], lambda spec: Head.fit_linear(corpus, spec.name), proxy,
                    lambda t: queries if t is texts else items)


def test_fit_for_refuses_torchrun_and_a_library_job_what_cannot_apply(tmp_path, documents):
    from bertflow.cli.parser import build_parser
    from bertflow.training.job import FitJob, run_fit

    args = build_parser().parse_args(["fit", str(documents), "--for", "retrieval", "--out",
                                      str(tmp_path / "h")])
    with pytest.raises(BertflowError, match="runs in one process, not under torchrun"):
        args.check(args, True)
    for job, message in (
            (FitJob(documents, tmp_path / "h", "whitening", choose_for="retrieval"),
             "takes no method"),
            (FitJob(documents, tmp_path / "h", dims=4), "apply to a head chosen on a proxy"),
            (FitJob(tmp_path / "e.npy", tmp_path / "h", choose_for="sts"), "not the embeddings")):
        with pytest.raises(BertflowError, match=message):
            run_fit(job)
    assert not (tmp_path / "h").exists()


def test_a_proxy_query_feeds_back_its_first_hits_less_its_own_item():
    """Its own item is ranked, but never pulls it: q' = normalise(q̂ + β · its first hit that
    is not its own)."""
    items = np.eye(6, dtype=np.float32)
    queries = items + np.array([0, 0.5, 0.2, 0, 0, 0], np.float32)  # item 1 then 2: first
    moved = proxy_feedback(Feedback(1, 1.0), queries, items)
    unit = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    np.testing.assert_allclose(moved[0], _unit(unit[0] + items[1]), atol=1e-6)
    np.testing.assert_allclose(moved[1], _unit(unit[1] + items[2]), atol=1e-6)  # not item 1
    np.testing.assert_allclose(moved[2], _unit(unit[2] + items[1]), atol=1e-6)  # not item 2


def _unit(v):
    return v / np.linalg.norm(v)


def _scenes(count=10):
    """Per plane of two dimensions, items at 40° (A), 30° (H) and ten from −35° to −39.5°,
    each item's query at its own angle but A's, at 0°: A ranks 12th, below the ten, until
    its query feeds back H, its first hit that is not its own, and passes them."""
    angles = np.radians([40, 30, *np.linspace(-35, -39.5, 10)])
    items = np.zeros((count * len(angles), 2 * count), np.float32)
    for scene in range(count):
        rows = slice(scene * len(angles), (scene + 1) * len(angles))
        items[rows, 2 * scene], items[rows, 2 * scene + 1] = np.cos(angles), np.sin(angles)
    queries = items.copy()
    queries[::len(angles)] = np.eye(2 * count, dtype=np.float32)[::2]  # A's, at 0°
    return queries, items


def _choose_feedback(queries, items):
    texts = [f"q{i}" for i in range(len(queries))], [f"i{i}" for i in range(len(items))]
    proxy = Proxy("retrieval", {"first sentence → rest": texts}, items=len(queries))
    vectors = dict(zip(texts[0], queries, strict=True)) | dict(zip(texts[1], items, strict=True))
    return choose_head([("identity (raw)", MethodSpec("identity"))],
                       lambda spec: Head.fit_linear(np.concatenate([items, queries]), spec.name),
                       proxy, lambda t: np.stack([vectors[x] for x in t]),
                       feedback=feedback_candidates())


def test_feedback_that_beats_the_plain_search_beyond_its_interval_is_chosen_and_recorded():
    choice = _choose_feedback(*_scenes())
    assert [r["candidate"] for r in choice.rows] == ["identity (raw)", *(
        label for label, _ in feedback_candidates())]
    assert choice.rows[0]["proxy_ndcg_at_10"] == pytest.approx(100 * 11 / 12, abs=1e-3)
    assert choice.label == "feedback k=1 β=0.25" and choice.rows[1]["interval"][0] > 0
    assert recorded_feedback(choice.head) == Feedback(1, 0.25)
    assert choice.rows[1]["feedback"] == {"k": 1, "beta": 0.25, "weighted": False}
    assert recorded_feedback(choice.heads["identity (raw)"]) is None  # a copy records it
    assert choice.reason().startswith("chose feedback k=1 β=0.25: proxy nDCG@10 +5.26 over "
                                      "identity (raw), joint 95% interval [+")
    assert "own item left out" in choice.evidence()["feedback"]
    assert choice.evidence()["reason"] == choice.reason()  # the one line, in the head's config


def test_feedback_on_isotropic_pairs_is_not_chosen():
    """One relevant item a query and nothing that its neighbours know better: feedback only
    pulls the query towards items that are not its own."""
    rng = np.random.default_rng(1)
    items = rng.normal(size=(300, 12)).astype(np.float32)
    queries = (items + rng.normal(scale=0.8, size=items.shape)).astype(np.float32)
    choice = _choose_feedback(queries, items)
    assert choice.label == "identity (raw)" and recorded_feedback(choice.head) is None
    assert choice.reason() == ("kept identity (raw): no candidate beat it beyond its joint 95% "
                               "interval")
    assert all(r["difference"] < 0 for r in choice.rows[1:])


def test_a_head_chosen_with_feedback_has_index_and_eval_retrieval_apply_it(
        tmp_path, capsys, documents, tiny_encoder_dir):
    pytest.importorskip("faiss")
    pytest.importorskip("pytrec_eval")
    common = ["--encoder", tiny_encoder_dir, "--cache", tmp_path / "c"]
    plain = tmp_path / "plain"
    assert run(capsys, "fit", documents, "--method", "identity", "--pooling", "mean",
               "--out", plain, *common)[0] == 0
    head = Head.load(plain)
    head.training_info["feedback"] = Feedback(3, 0.5).to_dict()
    head.save(tmp_path / "head")
    assert "feedback    k 3, beta 0.5, weighted False (searches)" in \
        run(capsys, "info", tmp_path / "head")[1]
    code, out, err = run(capsys, "index", documents, "--head", tmp_path / "head", "--out",
                         tmp_path / "index", *common, "--quiet")
    assert code == 0 and "feedback (k 3, beta 0.5, weighted False)" in out, (out, err)
    config = json.loads((tmp_path / "index" / "config.json").read_text())
    assert config["feedback"] == {"k": 3, "beta": 0.5, "weighted": False}
    code, out, err = run(capsys, "index", documents, "--head", tmp_path / "head", "--out",
                         tmp_path / "plain-index", "--no-feedback", *common, "--quiet")
    assert code == 0 and "feedback" not in json.loads(
        (tmp_path / "plain-index" / "config.json").read_text())
    beir = write_beir(tmp_path / "tiny", documents=24)
    code, out, err = run(capsys, "eval", "retrieval", beir, "--head", tmp_path / "head",
                         "--feedback-beta", "0.25", "--json", *common, "--quiet")
    assert code == 0, err
    assert json.loads(out)[0]["feedback"] == {"k": 3, "beta": 0.25, "weighted": False}
    code, out, err = run(capsys, "eval", "retrieval", beir, "--head", plain,
                         "--feedback-beta", "0.25", *common, "--quiet")
    assert code != 0 and "--feedback-beta apply with --feedback-k (the head records no " \
        "feedback)" in err, err
