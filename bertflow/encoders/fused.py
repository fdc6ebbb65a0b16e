"""The encoder's forward pass for BERT-architecture models (and MPNet's), fused and in mixed
precision, for the kinds it is verified to compute exactly."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Collection, Sequence
from operator import attrgetter
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import BertflowWarning
from .batches import padded_width
from .quantized import input_ranges, quantize_layers

__all__ = ["FUSED_KINDS", "FusedEncoder", "POST_OPS", "PROBE_TOLERANCE", "bfloat16_attention",
           "flash_attention", "fused_encoder", "state_gap", "supports_fused"]

# where each kind keeps a layer's query, key, value, attention output, its LayerNorm, the
# feed-forward's two linears and their LayerNorm: BERT's names (RoBERTa's too), then MPNet's
_BERT = ("attention.self.query", "attention.self.key", "attention.self.value",
         "attention.output.dense", "attention.output.LayerNorm",
         "intermediate.dense", "output.dense", "output.LayerNorm")
_MPNET = ("attention.attn.q", "attention.attn.k", "attention.attn.v",
          "attention.attn.o", "attention.LayerNorm",
          "intermediate.dense", "output.dense", "output.LayerNorm")


# the kinds (config.json's model_type) whose forward `FusedEncoder` computes exactly, each
# measured against the model's own from a tiny config (tests/test_forward.py), with where their
# layers keep their parts. Other kinds with the same attribute names compute something else
# (RoFormer's rotary positions, Longformer's, BigBird's, YOSO's or MRA's sparse or approximate
# attention, X-MOD's adapters, ...): they run through the model's own forward.
FUSED_KINDS = {**dict.fromkeys(("bert", "roberta", "xlm-roberta", "camembert", "data2vec-text",
                                "electra", "ernie", "roc_bert"), _BERT), "mpnet": _MPNET}
# how far the fused hidden states may be from the model's own on the probe batch, as a fraction
# of the largest of them (at least 1): float32 rounding is about 1e-6
PROBE_TOLERANCE = 1e-4


def _layout(model: nn.Module) -> tuple[str, ...] | None:
    """The names of `model`'s layer parts that `FusedEncoder` reads, else None: a kind of
    `FUSED_KINDS` in its usual form (post-LN layers with separate query, key and value, fed the
    embedding output as it is, not through ELECTRA's projection, with absolute positions or
    MPNet's relative position bias)."""
    config = getattr(model, "config", None)
    encoder = getattr(model, "encoder", None)
    layers = getattr(encoder, "layer", None)
    layout = FUSED_KINDS.get(getattr(config, "model_type", None))
    if layout is None or layers is None or not hasattr(model, "embeddings"):
        return None
    words = getattr(model.get_input_embeddings(), "embedding_dim", None)
    if (hasattr(model, "embeddings_project") or words is None
            or words != getattr(config, "hidden_size", None)
            or getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False)
            or getattr(config, "position_embedding_type", "absolute") != "absolute"
            or not isinstance(getattr(config, "hidden_act", None), str)):
        return None
    if (layout is _MPNET) != hasattr(encoder, "compute_position_bias"):
        return None
    try:
        return layout if all(None not in attrgetter(*layout)(layer) for layer in layers) else None
    except AttributeError:
        return None


def supports_fused(model: nn.Module) -> bool:
    """Whether `model` is of a kind `FusedEncoder` computes exactly (see `_layout`)."""
    return _layout(model) is not None


def fused_encoder(model: nn.Module, dtype: torch.dtype, inputs: dict[str, Tensor],
                  own: Sequence[Tensor], name: str,
                  calibration: Callable[[], Sequence[dict[str, Tensor]]] | None = None
                  ) -> FusedEncoder | None:
    """A `FusedEncoder` for `model` in `dtype`, or None: where the kind is not one it computes
    exactly, or where, in float32 on the probe batch `inputs`, its hidden states differ from
    `own` (the model's own, float32) by more than `PROBE_TOLERANCE` at a real token; the
    latter is said once, in a `BertflowWarning`. In int8 the projections' input ranges are
    read off the float32 forward on each batch `calibration` gives (`quantized`)."""
    if not supports_fused(model):
        return None
    fused = FusedEncoder(model)
    with torch.inference_mode():
        states = fused(**inputs)
    worst = state_gap(states, own, inputs["attention_mask"])
    if not worst <= PROBE_TOLERANCE:
        warnings.warn(f"encoder {name} ({model.config.model_type}): the fused forward differs "
                      f"from the model's own on a probe batch ({worst:.1e} of the hidden states' "
                      "scale); using the model's own forward", BertflowWarning, stacklevel=3)
        return None
    if dtype == torch.int8:
        if calibration is None:
            raise ValueError("int8 needs calibration batches")
        batches = calibration()
        with torch.inference_mode():
            ranges = input_ranges(fused.layers, lambda: [fused(**b) for b in batches])
        if getattr(torch.cpu, "_is_avx512_bf16_supported", bool)():
            for layer in fused.layers:
                layer.attention = bfloat16_attention
        quantize_layers(fused.layers, ranges)
        fused.dtype = torch.int8
        return fused
    return fused if dtype == torch.float32 else FusedEncoder(model, dtype)


def state_gap(states: Sequence[Tensor], reference: Sequence[Tensor], mask: Tensor) -> float:
    """The largest difference between two runs' hidden states at the tokens `mask` marks, as
    a fraction of the largest reference value (at least 1); NaN where they are not finite."""
    real = mask.bool()
    return max(float((a[real] - b[real]).abs().max() / b[real].abs().max().clamp(min=1))
               for a, b in zip(states, reference, strict=True))


class FusedEncoder(nn.Module):
    """A BERT-style encoder's forward pass with one query-key-value projection per layer and
    fused attention; MPNet's relative position bias joins the attention mask. In bfloat16 or
    float16 only the projections run in that precision: the residual stream, LayerNorms,
    embeddings and (on the CPU) attention stay float32. int8 is built here in float32, its
    projections replaced by `fused_encoder` once their input ranges are known, and its
    attention `bfloat16_attention` where the CPU has bfloat16 dot products. Below float32,
    on the CPU, the attention runs over whole blocks of keys (`key_width`); float32's keys are
    as wide as the batch, so its vectors stay bit for bit those the ready heads were fit on."""

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.float32):
        super().__init__()
        layout = _layout(model)
        if layout is None:
            raise ValueError(f"{type(model).__name__} is not a BERT-architecture encoder")
        from transformers.activations import ACT2FN

        self.embeddings, self.dtype = model.embeddings, dtype
        # MPNet's bias, (1, heads, length, length) from a batch of one; a method of the model's
        # own encoder, not a module of this one, so its weights are not registered twice
        self.position_bias: Callable[[Tensor], Tensor] | None = getattr(
            model.encoder, "compute_position_bias", None)
        heads, act = int(model.config.num_attention_heads), model.config.hidden_act
        self.layers = nn.ModuleList(
            _FusedLayer(attrgetter(*layout)(layer), heads, ACT2FN[act], POST_OPS.get(act), dtype)
            for layer in model.encoder.layer)

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor | None = None,
                keep: Collection[int] | None = None) -> tuple[Tensor | None, ...]:
        """Float32 hidden states like the model's at every real token (padding holds no
        meaningful values); None for a layer not in `keep` (default all). Between the attentions
        the layers run on the real tokens alone, packed, so no projection is spent on padding."""
        inputs = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        h = self.embeddings(input_ids=input_ids, **inputs).float()
        count = len(self.layers) + 1
        keep = range(count) if keep is None else {k % count for k in keep}
        tokens = _Tokens(attention_mask, whole_blocks=self.dtype != torch.float32)
        keys = F.pad(attention_mask, (0, tokens.keys - attention_mask.shape[1]))
        mask = keys.bool()[:, None, None, :]
        if self.position_bias is not None:
            blocked = torch.zeros(mask.shape, device=h.device).masked_fill_(~mask, -torch.inf)
            bias = self.position_bias(h[:1]).float()
            mask = F.pad(bias, (0, tokens.keys - bias.shape[-1])) + blocked
        states: list[Tensor | None] = [h if 0 in keep else None]
        x = tokens.pack(h)
        for index, layer in enumerate(self.layers, start=1):
            x = layer(x, mask, tokens)
            states.append(tokens.unpack(x) if index in keep else None)
        return tuple(states)


class _Tokens:
    """Where a padded batch's real tokens are: `pack` keeps their rows, `unpack` puts rows back
    in the padded shape (or `keys` positions wide), zero where no row was kept. The rows kept are
    the real tokens and, to round their count up as `padded_width` does, the first padded
    positions: a few dozen row counts instead of one per batch keep the CPU allocator from
    fragmenting. With `whole_blocks`, on the CPU, the attention's keys are `key_width`
    positions."""

    def __init__(self, attention_mask: Tensor, whole_blocks: bool = False):
        self.shape = attention_mask.shape
        width = self.shape[1]
        cpu = attention_mask.device.type == "cpu"
        self.keys = key_width(width) if whole_blocks and cpu else width
        real = attention_mask.flatten().bool()
        count = int(real.sum())
        extra = min(padded_width(count, 16), real.numel()) - count
        self.index = torch.cat([real.nonzero(), (~real).nonzero()[:extra]]).squeeze(1)
        self.wide = self.index if self.keys == width else (
            self.index + self.index.div(width, rounding_mode="floor") * (self.keys - width))

    def pack(self, padded: Tensor) -> Tensor:
        return padded.reshape(self.shape.numel(), -1).index_select(0, self.index)

    def unpack(self, rows: Tensor, keys: bool = False) -> Tensor:
        """`rows` in the padded shape, or `keys` positions wide."""
        width, index = (self.keys, self.wide) if keys else (self.shape[1], self.index)
        padded = rows.new_zeros(self.shape[0] * width, rows.shape[-1])
        return padded.index_copy_(0, index, rows).view(self.shape[0], width, rows.shape[-1])


def key_width(length: int) -> int:
    """How many key positions the attention runs over on the CPU for a batch `length` wide:
    rounded up to a multiple of 16, the rest masked, except up to 4 past one. torch's CPU flash
    attention runs a part-block of keys far slower per key than a whole block (on an EPYC, 15
    keys took longer than 16, 25 longer than 32), and a few keys past a block cost less than the
    padding would. `FusedEncoder` computes the same (within float32 rounding) either way."""
    over = length % 16
    return length if over <= 4 else length + 16 - over


class _FusedLayer(nn.Module):
    def __init__(self, parts: tuple[nn.Module, ...], heads: int, activation: Any,
                 post: tuple[str, str] | None, dtype: torch.dtype):
        super().__init__()
        # int8 projections take and give float32 (`quantized.Int8Linear`)
        self.heads, self.attention = heads, flash_attention
        self.dtype = torch.float32 if dtype == torch.int8 else dtype
        query, key, value, out, self.norm1, up, down, self.norm2 = parts
        self.qkv = _linear(self.dtype, query, key, value)
        self.out, self.down = _linear(self.dtype, out), _linear(self.dtype, down)
        self.up = _linear(self.dtype, up, activation=activation, post=post)

    def forward(self, x: Tensor, mask: Tensor, tokens: _Tokens) -> Tensor:
        """One layer on the packed rows `x` of `tokens`; `mask` is boolean (True: attend) or a
        float bias added to the scores."""
        dim = x.shape[-1]
        qkv = tokens.unpack(self.qkv(x.to(self.dtype)), keys=True)
        q, k, v = qkv.view(*qkv.shape[:2], 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q = q[:, :, : tokens.shape[1]]
        if x.device.type == "cpu":
            q, k, v = q.float(), k.float(), v.float()
        a = self.attention(q, k, v, mask)
        a = tokens.pack(a.transpose(1, 2)).to(self.dtype)
        x = self.norm1(x + self.out(a).float())
        y = self.down(self.up(x.to(self.dtype)))
        return self.norm2(x + y.float())


def flash_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """torch's fused attention; `mask` is boolean (True: attend) or a float bias."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask if mask.dtype == torch.bool
                                          else mask.to(q.dtype))


def bfloat16_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """The attention with its two products in bfloat16 (float32 sums, each one batched
    product over every sentence and head) and its scaling, mask and softmax in float32: int8's
    on a CPU with bfloat16 dot products. torch's CPU flash attention runs one sentence's head
    at a time, and over short sentences those small products were 18% of MPNet's int8 encode;
    these are faster, at a rounding that int8's own hides (docs/performance.md)."""
    scores = torch.matmul(q.bfloat16(), k.bfloat16().transpose(-1, -2)).float()
    scores = scores * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, -torch.inf) if mask.dtype == torch.bool else scores + mask
    return torch.matmul(scores.softmax(-1).bfloat16(), v.bfloat16()).float()


# oneDNN's linear, what inductor calls on the CPU, where this torch has it
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# oneDNN's post-ops (name, algorithm) for the activations (config.json's hidden_act) it
# computes as transformers does, within float32 rounding: applied to the product before it is
# rounded to the layer's precision, and without another pass over its output
POST_OPS = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"),
            "gelu_pytorch_tanh": ("gelu", "tanh"), "relu": ("relu", "")}


class _Linear(nn.Linear):
    """A linear layer, then its `activation` if it has one. On the CPU its weight is kept in
    oneDNN's own blocked layout where oneDNN runs that (`_packs`: packed once, not reordered on
    every call), and the product is oneDNN's rather than the BLAS that `F.linear` calls in
    float32 (MKL, which on AMD CPUs runs at half oneDNN's speed: float32 GEMMs of the
    projections' shapes at 200 against 400-440 GFLOP/s on 2 cores of an EPYC; the same sums in
    another order, within float32 rounding). Packed, a product of the projections' shapes
    timed alone is 5-40% faster, with the same bits out (within a whole encode the profiled
    products moved by 1-5%), and the activation is oneDNN's `post` op where it has one
    (`POST_OPS`). Moved or cast, the weight is unpacked first and packed again where it lands
    on the CPU."""

    def __init__(self, inputs: int, outputs: int, dtype: torch.dtype,
                 device: torch.device | None = None, activation: Any = None,
                 post: tuple[str, str] | None = None):
        super().__init__(inputs, outputs, device=device, dtype=dtype)
        self.activation, self.post = activation, post

    def forward(self, x: Tensor) -> Tensor:
        if self.weight.is_mkldnn:
            name, algorithm = self.post or ("none", "")
            y = torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, name, [],
                                                   algorithm)
            if self.post is not None:
                return y
        else:
            y = super().forward(x)
        return y if self.activation is None else self.activation(y)

    def _apply(self, fn: Callable, recurse: bool = True) -> _Linear:
        self.weight = nn.Parameter(self.weight.to_dense(), requires_grad=False)
        super()._apply(fn, recurse)
        self.pack()
        return self

    def pack(self) -> None:
        """Keep the weight in oneDNN's layout, where it is on the CPU in a dtype whose packed
        product runs here (`_packs`)."""
        weight = self.weight
        if weight.device.type == "cpu" and not weight.is_mkldnn and _packs(weight.dtype):
            self.weight = nn.Parameter(torch.ops.mkldnn._reorder_linear_weight(weight.detach()),
                                       requires_grad=False)


@functools.cache
def _packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN's linear runs on a packed weight in `dtype` on this CPU (float32 or
    bfloat16, tried once on a tiny product): a CPU without bfloat16 instructions, or another
    build of oneDNN, may refuse it, and then the weight stays as it is."""
    if not _ONEDNN or dtype not in (torch.float32, torch.bfloat16):
        return False
    name, algorithm = POST_OPS["gelu"]
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.ones(16, 16, dtype=dtype))
        torch.ops.mkldnn._linear_pointwise(torch.ones(2, 16, dtype=dtype), weight, None, name,
                                           [], algorithm)
    except RuntimeError:
        return False
    return True


def _linear(dtype: torch.dtype, *parts: nn.Linear, activation: Any = None,
            post: tuple[str, str] | None = None) -> _Linear:
    """One frozen linear layer in `dtype` whose output is those of `parts`, concatenated, then
    `activation` (oneDNN's `post` op for it, where packed)."""
    weight = torch.cat([part.weight for part in parts])
    linear = _Linear(weight.shape[1], weight.shape[0], dtype, weight.device, activation, post)
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(torch.cat([part.bias for part in parts]))
    linear.requires_grad_(False).pack()
    return linear
