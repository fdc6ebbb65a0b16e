"""Pseudo-relevance feedback's maths on hand-made vectors, its blocks and its refusals."""

import math

import numpy as np
import pytest

from bertflow import BertflowError
from bertflow.training.feedback import Feedback

E = np.eye(3, dtype=np.float32)


def unit(v):
    v = np.asarray(v, np.float64)
    return v / np.linalg.norm(v)


def test_the_query_moves_towards_the_mean_of_its_hits_as_defined():
    q, hits = E[:1], np.stack([E[1:]])  # q̂ = e1, its hits e2 and e3
    scores = np.array([[0.6, 0.2]])
    moved = Feedback(2, 0.5).expand(q, hits, scores)
    np.testing.assert_allclose(moved[0], unit([1, 0.25, 0.25]), atol=1e-7)  # q̂ + β · mean
    weighted = Feedback(2, 0.5, weighted=True).expand(q, hits, scores)
    np.testing.assert_allclose(weighted[0], unit([1, 0.375, 0.125]), atol=1e-7)  # 3:1
    negative = Feedback(2, 0.5, weighted=True).expand(q, hits, np.array([[0.5, -0.3]]))
    np.testing.assert_allclose(negative[0], unit([1, 0.5, 0]), atol=1e-7)  # counts 0
    for f in (Feedback(2, 0.5, weighted=True).expand(q, hits, -scores),  # nothing to weigh
              Feedback(2, 0).expand(q, hits, scores)):
        np.testing.assert_allclose(f[0], E[0], atol=1e-7)
    found = Feedback(2, 1).expand(q, hits, scores, np.array([[False, True]]))
    np.testing.assert_allclose(found[0], unit([1, 0, 1]), atol=1e-7)  # the hit found alone
    assert moved.dtype == np.float32


def test_refine_searches_each_block_and_moves_each_query():
    rng = np.random.default_rng(0)
    docs = rng.normal(size=(40, 5))
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = rng.normal(size=(9, 5))
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    asked = []

    def search(q, k):
        asked.append((len(q), k))
        s = q @ docs.T
        rows = np.argsort(-s, axis=1)[:, :k]
        return np.take_along_axis(s, rows, 1), rows

    feedback = Feedback(3, 0.7)
    moved = feedback.refine(queries, search, docs.__getitem__, block=4)
    assert asked == [(4, 3), (4, 3), (1, 3)]
    for q, m in zip(queries, moved, strict=True):
        top = np.argsort(-(docs @ q))[:3]
        np.testing.assert_allclose(m, unit(q + 0.7 * docs[top].mean(0)), atol=1e-6)
    np.testing.assert_array_equal(feedback.refine(queries, search, docs.__getitem__), moved)
    own = np.array([np.argmax(docs @ q) for q in queries[:-1]] + [-1])  # each one's best, left out
    left_out = feedback.refine(queries, search, docs.__getitem__, block=4, own=own)
    assert asked[-1] == (1, 4)  # one more hit, for the one left out
    for q, m, mine in zip(queries, left_out, own, strict=True):
        top = [r for r in np.argsort(-(docs @ q)) if r != mine][:3]
        np.testing.assert_allclose(m, unit(q + 0.7 * docs[top].mean(0)), atol=1e-6)


@pytest.mark.parametrize("k,beta,message", [
    (0, 0.5, "feedback's k (--feedback-k) must be an integer of at least 1, got 0"),
    (-2, 0.5, "got -2"), (1.5, 0.5, "got 1.5"), (True, 0.5, "got True"),
    (3, -0.1, "feedback's beta (--feedback-beta) must be a finite number of at least 0, got -0.1"),
    (3, math.nan, "got nan"), (3, math.inf, "got inf"), (3, "0.5", "got '0.5'"),
])
def test_bad_settings_are_refused(k, beta, message):
    with pytest.raises(BertflowError) as e:
        Feedback(k, beta)
    assert message in str(e.value)


def test_k_above_the_documents_and_a_malformed_record_are_refused():
    Feedback(5).check_count(5)
    with pytest.raises(BertflowError, match=r"k \(--feedback-k 6\) is more than the 5 documents"):
        Feedback(6).check_count(5)
    assert Feedback.from_dict(Feedback(3, 1, True).to_dict()) == Feedback(3, 1.0, True)
    for bad in ({"k": 3}, {"k": 3, "beta": 0.5, "weighted": "no"}, [3, 0.5, False],
                {"k": 0, "beta": 0.5, "weighted": False}):
        with pytest.raises(BertflowError):
            Feedback.from_dict(bad)
