"""The Lee corpus (Lee, Pincombe & Welsh, 2005) from gensim's wheel: 50 news documents with every
pair's mean human similarity rating (0-1), and 300 unlabeled background documents."""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

import numpy as np

from ..errors import BertflowError
from .sts import spearman

__all__ = ["background_sentences", "document_vectors", "documents", "judgement_spearman",
           "rated_sentences", "sentences", "similarities"]

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"']?\s+(?=[\"'(]?[A-Z0-9])")


def _file(name: str) -> Path:
    try:
        root = importlib.resources.files("gensim")
    except ModuleNotFoundError:
        raise BertflowError("the Lee corpus ships with gensim: pip install 'bertflow[demo]'") \
            from None
    path = Path(str(root)) / "test" / "test_data" / name
    if not path.is_file():
        raise BertflowError(f"gensim has no {name} at {path}")
    return path


def sentences(text: str) -> list[str]:
    """Split running text into sentences at '.', '!' or '?' followed by a capital or digit."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def documents() -> list[str]:
    """The 50 rated documents (`lee.cor`, one per line; Latin-1 for its one '£')."""
    text = _file("lee.cor").read_bytes().decode("latin-1")
    return [line.strip() for line in text.splitlines() if line.strip()]


def rated_sentences() -> list[str]:
    """The sentences of the 50 rated documents, document after document."""
    return [s for document in documents() for s in sentences(document)]


def document_vectors(sentence_vectors: np.ndarray) -> np.ndarray:
    """Each rated document's vector: the mean of its sentences' rows of `sentence_vectors`."""
    owner = np.repeat(np.arange(50), [len(sentences(d)) for d in documents()])
    if len(sentence_vectors) != len(owner):
        raise BertflowError(f"expected {len(owner)} sentence vectors, got "
                            f"{len(sentence_vectors)}")
    return np.stack([sentence_vectors[owner == i].mean(0) for i in range(50)])


def background_sentences() -> list[str]:
    """The 300 background documents (`lee_background.cor`) split into sentences."""
    text = _file("lee_background.cor").read_text(encoding="utf-8")
    return [s for line in text.splitlines() for s in sentences(line)]


def similarities() -> np.ndarray:
    """The 50 × 50 matrix of mean human similarity ratings between the documents."""
    matrix = np.loadtxt(_file("similarities0-1.txt"))
    if matrix.shape != (50, 50):
        raise BertflowError(f"expected a 50 × 50 similarity matrix, got {matrix.shape}")
    return matrix


def judgement_spearman(document_vectors: np.ndarray) -> float:
    """Spearman × 100 of the document vectors' cosines against the ratings of the 1,225 pairs."""
    if document_vectors.shape[0] != 50:
        raise BertflowError(f"expected 50 document vectors, got {document_vectors.shape[0]}")
    upper = np.triu_indices(50, 1)
    unit = document_vectors / np.linalg.norm(document_vectors, axis=1, keepdims=True)
    return spearman((unit @ unit.T)[upper], similarities()[upper])
