"""sentence-transformers' calling convention for `Encoder.encode` and `Head.encode`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import BertflowError

__all__ = ["SIMILARITY_FN_NAME", "as_sentences", "check_options", "convert", "similarity",
           "similarity_pairwise"]

SIMILARITY_FN_NAME = "cosine"
# options of SentenceTransformer.encode that would change the embeddings, with the value under
# which they do not; other keywords (as MTEB passes them) are ignored
_NEUTRAL = {"prompt": None, "prompt_name": None, "output_value": "sentence_embedding",
            "precision": "float32", "truncate_dim": None, "pool": None}


def as_sentences(sentences: str | Sequence[str] | Any) -> tuple[Sequence[str], bool]:
    """The sentences as a sequence, and whether one string was given (one vector is returned)."""
    if isinstance(sentences, str):
        return [sentences], True
    if not isinstance(sentences, Sequence):
        try:
            sentences = list(sentences)
        except TypeError:
            raise BertflowError(f"expected a string or a list of strings, got "
                                f"{type(sentences).__name__}") from None
    if not len(sentences):
        raise BertflowError("expected a non-empty list of sentences")
    if not isinstance(sentences[0], str):
        raise BertflowError(f"expected a string or a list of strings, got a list of "
                            f"{type(sentences[0]).__name__}")
    return sentences, False


def check_options(options: dict[str, Any], device: Any = None) -> None:
    """Refuse the sentence-transformers options bertflow lacks where they change the result."""
    for name, neutral in _NEUTRAL.items():
        if options.get(name, neutral) != neutral:
            raise BertflowError(f"encode option {name}={options[name]!r} is not supported by "
                                f"bertflow (only {name}={neutral!r})")
    if isinstance(device, (list, tuple)):
        raise BertflowError("encode on several devices is not supported; give one device")


def convert(x: np.ndarray, single: bool, convert_to_numpy: bool = True,
            convert_to_tensor: bool = False,
            normalize_embeddings: bool = False) -> np.ndarray | Tensor | list[Tensor]:
    """Embeddings (rows, dim) in the form sentence-transformers' `encode` returns them."""
    if normalize_embeddings:
        x = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12).astype(x.dtype)
    out = torch.from_numpy(x) if convert_to_tensor else x if convert_to_numpy \
        else list(torch.from_numpy(x))
    return out[0] if single else out


def similarity(embeddings1: Any, embeddings2: Any) -> Tensor:
    r"""The cosine similarity of every row of `embeddings1` with every row of `embeddings2`,
    $S_{ij} = a_i \cdot b_j / (\lVert a_i \rVert \lVert b_j \rVert)$, a (n1, n2) tensor."""
    a, b = _unit_pair(embeddings1, embeddings2, rows=True)
    return a @ b.T


def similarity_pairwise(embeddings1: Any, embeddings2: Any) -> Tensor:
    """The cosine similarity of each row of `embeddings1` with the same row of `embeddings2`."""
    a, b = _unit_pair(embeddings1, embeddings2)
    if a.shape != b.shape:
        raise BertflowError(f"pairwise similarity needs embeddings of one shape, got "
                            f"{tuple(a.shape)} and {tuple(b.shape)}")
    return (a * b).sum(-1)


def _tensor(x: Any) -> Tensor:
    if isinstance(x, (list, tuple)) and x and all(isinstance(v, Tensor) for v in x):
        x = torch.stack(list(x))
    t = x if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))
    return t if t.is_floating_point() and torch.finfo(t.dtype).bits >= 32 else t.float()


def _unit_pair(x: Any, y: Any, rows: bool = False) -> tuple[Tensor, Tensor]:
    """Both as unit-length rows in their common dtype; a 1-D input is one row if `rows`."""
    a, b = (t.unsqueeze(0) if rows and t.dim() == 1 else t for t in (_tensor(x), _tensor(y)))
    dtype = torch.promote_types(a.dtype, b.dtype)
    return tuple(torch.nn.functional.normalize(t.to(dtype), dim=-1) for t in (a, b))
