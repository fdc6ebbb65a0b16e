"""Rows at unit length and exact cosine search, the one search the proxy, feedback and the
retrieval harness share."""

import numpy as np
import pytest

from bertflow import BertflowError
from bertflow import cosine as cosine_module
from bertflow.cosine import PAIR_BYTES, SCORE_BUDGET, top_hits, unit_rows


def test_unit_rows_scales_each_row_and_keeps_a_zero_row():
    x = np.array([[3.0, 4.0], [0.0, 0.0], [-2.0, 0.0]])
    np.testing.assert_allclose(unit_rows(x), [[0.6, 0.8], [0, 0], [-1, 0]])
    assert unit_rows(x, np.float32).dtype == np.float32


def test_top_hits_is_exact_cosine_search_ties_by_row(monkeypatch):
    rng = np.random.default_rng(0)
    docs, queries = rng.normal(size=(50, 8)), rng.normal(size=(7, 8))
    docs[10] = docs[3] * 2  # the same direction: a tie, broken by row
    blocks = []
    select = cosine_module._first_top
    monkeypatch.setattr(cosine_module, "_first_top", lambda s, top: blocks.append(s.shape) or
                        select(s, top))
    scores, rows = top_hits(queries, docs, top=20, budget=3 * 50 * PAIR_BYTES)
    assert blocks == [(3, 50), (3, 50), (1, 50)]
    unit = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    cosine = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ unit.T
    for q in range(7):
        order = sorted(range(50), key=lambda j: (-round(cosine[q, j], 5), j))[:20]
        assert rows[q].tolist() == order
        np.testing.assert_allclose(scores[q], cosine[q, order], atol=1e-5)
    all_scores, all_rows = top_hits(queries, docs, top=1000)
    assert all_rows.shape == (7, 50) and (all_rows[:, :20] == rows).all()
    for budget in (1, SCORE_BUDGET):  # a query a block, all of them in one: the same top
        other_scores, other_rows = top_hits(queries, docs, top=20, budget=budget)
        assert (other_rows == rows).all()
        np.testing.assert_allclose(other_scores, scores, rtol=0, atol=1e-6)
    with pytest.raises(BertflowError, match="width"):
        top_hits(queries, docs[:, :4])


def test_ties_at_the_cut_keep_the_lowest_rows():
    """Many documents tied at the last place kept: the first rows of them, as the docstring
    says, in every block and at every cut."""
    docs = np.tile(np.eye(4, dtype=np.float32)[0], (60, 1))
    docs[[7, 30]] = np.eye(4)[1]  # better for the query below
    query = np.array([[1.0, 2.0, 0, 0]], np.float32)
    for top in (1, 2, 3, 5, 40):
        scores, rows = top_hits(np.repeat(query, 3, 0), docs, top=top,
                                budget=2 * 60 * PAIR_BYTES)
        rest = [r for r in range(60) if r not in (7, 30)][: max(0, top - 2)]
        assert (rows == [[7, 30, *rest][:top]] * 3).all(), (top, rows)
