import numpy as np
import pytest

from bertflow import BertflowError

lee = pytest.importorskip("bertflow.data.lee")
pytest.importorskip("gensim")


def test_rated_sentences_and_their_documents():
    documents = [lee.sentences(d) for d in lee.documents()]
    rated = lee.rated_sentences()
    assert len(documents) == 50 and rated == [s for d in documents for s in d]
    vectors = np.random.default_rng(0).normal(size=(len(rated), 4))
    by_document = lee.document_vectors(vectors)
    assert by_document.shape == (50, 4)
    np.testing.assert_allclose(by_document[1], vectors[len(documents[0]):][
        :len(documents[1])].mean(0))
    with pytest.raises(BertflowError, match="sentence vectors"):
        lee.document_vectors(vectors[:-1])
    assert -100 <= lee.judgement_spearman(by_document) <= 100
