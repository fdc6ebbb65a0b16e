"""The encoder's forward pass for BERT-architecture models, fused and in mixed precision."""

from __future__ import annotations

from collections.abc import Collection
from operator import attrgetter
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FusedBert", "supports_fused"]


def supports_fused(model: nn.Module) -> bool:
    """Whether `FusedBert` computes `model` exactly: post-LN layers with separate query, key and
    value, absolute positions, fed the embedding output as it is (not ELECTRA's, nor ALBERT's)."""
    config = getattr(model, "config", None)
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if config is None or layers is None or not hasattr(model, "embeddings"):
        return False
    words = getattr(model.get_input_embeddings(), "embedding_dim", None)
    if (hasattr(model, "embeddings_project") or words is None
            or words != getattr(config, "hidden_size", None)
            or getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False)
            or getattr(config, "position_embedding_type", "absolute") != "absolute"
            or not isinstance(getattr(config, "hidden_act", None), str)):
        return False
    needed = attrgetter("attention.self.query", "attention.self.key", "attention.self.value",
                        "attention.output.dense", "attention.output.LayerNorm",
                        "intermediate.dense", "output.dense", "output.LayerNorm")
    try:
        return all(None not in needed(layer) for layer in layers)
    except AttributeError:
        return False


class FusedBert(nn.Module):
    """A BERT-style encoder's forward pass with one query-key-value projection per layer and
    fused attention. In bfloat16 or float16 only the projections run in that precision: the
    residual stream, LayerNorms, embeddings and (on the CPU) attention stay float32."""

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.float32):
        super().__init__()
        if not supports_fused(model):
            raise ValueError(f"{type(model).__name__} is not a BERT-architecture encoder")
        from transformers.activations import ACT2FN

        self.embeddings, self.dtype = model.embeddings, dtype
        heads, activation = int(model.config.num_attention_heads), ACT2FN[model.config.hidden_act]
        self.layers = nn.ModuleList(_FusedLayer(layer, heads, activation, dtype)
                                    for layer in model.encoder.layer)

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor | None = None,
                keep: Collection[int] | None = None) -> tuple[Tensor | None, ...]:
        """Float32 hidden states like the model's; None for a layer not in `keep` (default all)."""
        h = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids).float()
        count = len(self.layers) + 1
        keep = range(count) if keep is None else {k % count for k in keep}
        mask = attention_mask.bool()[:, None, None, :]
        states: list[Tensor | None] = [h if 0 in keep else None]
        for index, layer in enumerate(self.layers, start=1):
            h = layer(h, mask)
            states.append(h if index in keep else None)
        return tuple(states)


class _FusedLayer(nn.Module):
    def __init__(self, layer: nn.Module, heads: int, activation: Any, dtype: torch.dtype):
        super().__init__()
        self.heads, self.activation, self.dtype = heads, activation, dtype
        attention = layer.attention
        self.qkv = _linear(dtype, attention.self.query, attention.self.key, attention.self.value)
        self.out = _linear(dtype, attention.output.dense)
        self.norm1 = attention.output.LayerNorm
        self.up = _linear(dtype, layer.intermediate.dense)
        self.down = _linear(dtype, layer.output.dense)
        self.norm2 = layer.output.LayerNorm

    def forward(self, h: Tensor, mask: Tensor) -> Tensor:
        batch, length, dim = h.shape
        qkv = self.qkv(h.to(self.dtype)).view(batch, length, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        if h.device.type == "cpu":
            q, k, v = q.float(), k.float(), v.float()
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        a = a.transpose(1, 2).reshape(batch, length, dim).to(self.dtype)
        h = self.norm1(h + self.out(a).float())
        y = self.down(self.activation(self.up(h.to(self.dtype))))
        return self.norm2(h + y.float())


def _linear(dtype: torch.dtype, *parts: nn.Linear) -> nn.Linear:
    """One frozen linear layer in `dtype` whose output is those of `parts`, concatenated."""
    weight = torch.cat([part.weight for part in parts])
    linear = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(torch.cat([part.bias for part in parts]))
    return linear.requires_grad_(False)
