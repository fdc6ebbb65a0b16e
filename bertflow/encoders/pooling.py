"""Sentence pooling, once for every path (`Encoder.encode`, the sentence-transformers
pipeline): which hidden states each pooling reads, and how it reads them."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..constants import POOLINGS
from ..errors import BertflowError

__all__ = ["LAYERS", "check_pooling", "pool"]

# the hidden states each pooling reads (1: the first Transformer layer, -1: the last)
LAYERS = {"cls": {-1}, "mean": {-1}, "first_last": {1, -1}, "last2": {-2, -1}, "static": set()}


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise BertflowError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    return pooling


def pool(hidden_states: Sequence[torch.Tensor] | None, word_embeddings: torch.Tensor | None,
         attention_mask: torch.Tensor, special_tokens_mask: torch.Tensor,
         pooling: str) -> torch.Tensor:
    r"""Sentence vectors from one batch, $m$ the attention mask, $h^{(l)}$ layer $l$'s output:
    ``cls`` $h^{(L)}_0$; ``mean`` $\sum_t m_t h^{(L)}_t / \sum_t m_t$; ``first_last`` and
    ``last2`` the masked mean of $(h^{(1)} + h^{(L)}) / 2$ and of $(h^{(L-1)} + h^{(L)}) / 2$;
    ``static`` that of the input word embeddings alone (no position embedding, no LayerNorm),
    special tokens excluded."""
    check_pooling(pooling)
    mask = attention_mask.bool()
    if pooling == "static":
        if word_embeddings is None:
            raise ValueError("pooling 'static' needs the input word embeddings")
        tokens = word_embeddings
        mask = mask & ~special_tokens_mask.bool()
    else:
        if hidden_states is None:
            raise ValueError(f"pooling {pooling!r} needs the encoder's hidden states")
        if pooling == "cls":
            return hidden_states[-1][:, 0]
        first, *other = (hidden_states[layer] for layer in sorted(LAYERS[pooling]))
        tokens = (first + other[0]) / 2 if other else first
    weights = mask.unsqueeze(-1).to(tokens.dtype)
    return (tokens * weights).sum(1) / weights.sum(1).clamp(min=1)
