"""Pseudo-relevance feedback on an index: every kind that stores its vectors whole searches as
the exact maths says, β = 0 is the plain search, the recorded default is repeated after a
reload and by `bertflow search`, and what cannot be is refused in one line."""

import json

import numpy as np
import pytest

from bertflow import BertflowError
from bertflow.cli.main import main
from bertflow.search.index import Index
from bertflow.training.feedback import Feedback

from .test_retrieval import edit_config

pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def vectors():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 16)).astype(np.float32)
    return x, [f"v{i}" for i in range(len(x))], rng.normal(size=(30, 16)).astype(np.float32)


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact(x, queries, k, beta, top=10):
    """The feedback search by hand: q' = normalise(q̂ + β · mean of the top k's unit vectors)."""
    d, q = unit(x.astype(np.float64)), unit(queries.astype(np.float64))
    first = np.argsort(-(q @ d.T), axis=1)[:, :k]
    moved = unit(q + beta * d[first].mean(1))
    s = moved @ d.T
    rows = np.argsort(-s, axis=1)[:, :top]
    return np.take_along_axis(s, rows, 1), rows


def built(x, items, kind, **options):
    index = Index.from_embeddings(x, items, pooling="mean", kind=kind, **options)
    if index.nprobe is not None:
        index.nprobe = int(kind.split("IVF")[1].split(",")[0])  # every list: exhaustive
    if index.ef_search is not None:
        index.ef_search = 400  # the whole graph
    return index


@pytest.mark.parametrize("kind", ["flat", "hnsw", "IVF8,Flat", "HNSW16"])
def test_every_kind_that_stores_vectors_whole_searches_as_the_maths_says(vectors, kind):
    x, items, queries = vectors
    index = built(x, items, kind, feedback=Feedback(3, 0.5))
    scores, rows = index.search_embeddings(queries, 10)
    want_scores, want_rows = exact(x, queries, 3, 0.5)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)
    assert (rows != built(x, items, kind).search_embeddings(queries, 10)[1]).any()


@pytest.mark.parametrize("kind,options", [("flat", {}), ("hnsw", {}), ("IVF8,Flat", {}),
                                          ("flat", {"dims": 8}), ("PCA8,Flat", {}),
                                          ("PCA8,IVF4,Flat", {}), ("NSG16,Flat", {})])
def test_beta_zero_is_the_plain_search(vectors, kind, options):
    x, items, queries = vectors
    index = built(x, items, kind, **options)
    plain = index.search_embeddings(queries, 10)
    index.feedback = Feedback(5, 0)
    scores, rows = index.search_embeddings(queries, 10)
    np.testing.assert_array_equal(rows, plain[1])
    np.testing.assert_allclose(scores, plain[0], atol=1e-5)
    index.feedback = Feedback(5, 1, weighted=True)  # and feedback moves them, in any space
    assert (index.search_embeddings(queries, 10)[1] != plain[1]).any()


@pytest.mark.parametrize("kind", ["hnsw", "IVF8,Flat"])  # IVF: with the map it reads back by
def test_the_recorded_feedback_is_saved_and_repeated(tmp_path, vectors, kind):
    x, items, queries = vectors
    index = built(x, items, kind, feedback=Feedback(2, 0.25, weighted=True))
    assert index.config["feedback"] == {"k": 2, "beta": 0.25, "weighted": True}
    folder = index.save(tmp_path / "idx")
    loaded = Index.load(folder)
    assert loaded.feedback == Feedback(2, 0.25, True) and loaded.config == index.config
    for got, want in zip(loaded.search_embeddings(queries), index.search_embeddings(queries),
                         strict=True):
        np.testing.assert_array_equal(got, want)
    loaded.feedback = None
    assert "feedback" not in loaded.config
    np.testing.assert_array_equal(loaded.search_embeddings(queries)[1],
                                  built(x, items, kind).search_embeddings(queries)[1])
    for bad in ({"k": 0, "beta": 0.5, "weighted": False}, {"k": 2}, "k=2"):
        edit_config(folder, feedback=bad)
        with pytest.raises(BertflowError, match="config.json is malformed"):
            Index.load(folder)


@pytest.mark.parametrize("kind", ["IVF4,PQ4x2np", "SQ8", "PQ4x1np"])
def test_feedback_on_an_index_whose_vectors_are_not_unit_length_is_refused(vectors, kind):
    x, items, _ = vectors
    with pytest.raises(BertflowError, match=f"--feedback-k.*unit length; kind '{kind}' gives "
                                            "them back at lengths"):
        Index.from_embeddings(x, items, pooling="mean", kind=kind, feedback=Feedback(2))
    index = Index.from_embeddings(x, items, pooling="mean", kind=kind)
    with pytest.raises(BertflowError, match="unit length"):
        index.feedback = Feedback(2)
    assert index.feedback is None


def test_k_above_the_items_is_refused(vectors, tiny_encoder, monkeypatch):
    x, items, _ = vectors
    with pytest.raises(BertflowError, match=r"--feedback-k 401\) is more than the 400"):
        Index.from_embeddings(x, items, pooling="mean", feedback=Feedback(401))
    index = Index.from_embeddings(x, items, pooling="mean")
    with pytest.raises(BertflowError, match="more than the 400"):
        index.feedback = Feedback(401)
    index.feedback = Feedback(400)  # every item: the same move for every query
    monkeypatch.setattr(tiny_encoder, "encode", lambda *a, **k: pytest.fail("encoded"))
    with pytest.raises(BertflowError, match="more than the 3 documents"):  # before encoding
        Index.build(["a", "b", "c"], tiny_encoder, feedback=Feedback(4))


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_index_records_feedback_and_search_repeats_it_unless_told(tmp_path, capsys,
                                                                  tiny_encoder, tiny_encoder_dir):
    from ..conftest import WORDS

    items = [f"{a} {b} {c}" for a in WORDS[:6] for b in WORDS[6:12] for c in WORDS[12:15]]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(items) + "\n")
    common = ["--encoder", tiny_encoder_dir, "--pooling", "mean", "--quiet"]
    code, out, err = run(capsys, "index", corpus, "--out", tmp_path / "idx", *common,
                         "--feedback-k", "3", "--feedback-beta", "0.5")
    assert code == 0, err
    assert "feedback (k 3, beta 0.5, weighted False)" in out
    index = Index.load(tmp_path / "idx")
    assert index.feedback == Feedback(3, 0.5)
    queries = ["a man plays", "the dog runs in the park", "music with a red car"]
    asked = [a for q in queries for a in ("--query", q)]
    search = ["search", "--index", tmp_path / "idx", *asked, "--json", "--top", "5",
              "--encoder", tiny_encoder_dir]

    def lines(*options):
        code, out, err = run(capsys, *search, *options)
        assert code == 0, err
        return [[h["line"] for h in json.loads(row)["hits"]] for row in out.splitlines()]

    x = tiny_encoder.encode(queries, "mean")
    recorded = [(r + 1).tolist() for r in index.search_embeddings(x, 5)[1]]
    assert lines() == recorded
    index.feedback = None
    plain = [(r + 1).tolist() for r in index.search_embeddings(x, 5)[1]]
    assert recorded != plain
    assert lines("--no-feedback") == lines("--feedback-beta", "0") == plain
    index.feedback = Feedback(3, 1.0, True)
    assert lines("--feedback-beta", "1", "--feedback-weighted") == [
        (r + 1).tolist() for r in index.search_embeddings(x, 5)[1]]
    assert Index.load(tmp_path / "idx").feedback == Feedback(3, 0.5)  # searches write nothing

    code, _, err = run(capsys, "index", corpus, "--out", tmp_path / "plain", *common)
    assert code == 0, err
    for args, message in (
        (["search", "--index", tmp_path / "plain", "--query", "a", "--feedback-beta", "1"],
         "--feedback-beta apply with --feedback-k (this index records no feedback)"),
        (["search", "--index", tmp_path / "idx", "--query", "a", "--feedback-k",
          str(len(items) + 1)], f"is more than the {len(items)} documents"),
        (["index", corpus, "--out", tmp_path / "big", *common, "--feedback-k",
          str(len(items) + 1)], f"is more than the {len(items)} documents"),
        (["index", corpus, "--out", tmp_path / "sq", *common, "--kind", "SQ4",
          "--feedback-k", "2"], "needs the index's vectors at unit length; kind 'SQ4'"),
    ):
        code, _, err = run(capsys, *args, "--encoder", tiny_encoder_dir)
        assert code == 1 and err.count("\n") == 1 and message in err, (args, err)
    assert not (tmp_path / "big").exists() and not (tmp_path / "sq").exists()
