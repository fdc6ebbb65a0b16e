"""The fused forward's projections in int8, on the CPU: weights per output channel
(symmetric) and activations per row (from the row's least to its largest value), multiplied in
int8 with int32 sums (`torch._int_mm`), the rest of the layer in float32. Before rounding, each
input channel's range is moved from the activations into the weights (SmoothQuant's migration,
strength `ALPHA`): a few channels of a BERT's hidden states are far larger than the rest, and
per-row rounding would spend its 256 levels on them. The ranges come from `CALIBRATION`, a
fixed text run once through the float32 forward, so a sentence's vector depends on neither the
corpus nor the order it is encoded in. Each layer is compiled by `torch.compile` (inductor),
which fuses quantisation and dequantisation into the operations around them; where it cannot
compile (no C++ compiler), the same code runs as it is, slower, which is said once."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from ..errors import BertflowWarning

__all__ = ["ALPHA", "CALIBRATION", "PARTS", "Int8Linear", "compiled", "input_ranges",
           "quantize_layers"]

# the projections of a fused layer that run in int8 (every one)
PARTS = ("qkv", "out", "up", "down")
# SmoothQuant's migration strength: 0 leaves the activations' ranges as they are, 1 moves them
# all into the weights
ALPHA = 0.5
# the calibration text: sentences of several registers, lengths and scripts of numbers, each run
# alone (so no padding enters the ranges)
CALIBRATION = (
    "The committee approved the budget on Tuesday after a three-hour debate.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Where did you leave the keys to the blue car?",
    "Stir the flour into the melted butter and cook for two minutes, stirring constantly.",
    "In 1969, Apollo 11 landed on the Moon, and Neil Armstrong became the first person to walk "
    "on its surface.",
    "The patient presented with fever, a persistent cough and shortness of breath.",
    "Shares fell 4.2% in early trading after the company cut its annual forecast.",
    "A dog runs across the beach chasing a red ball.",
    "The theorem holds for every continuous function on a closed and bounded interval.",
    "Thanks so much, see you tomorrow!",
    "Protein folding is determined largely by the sequence of amino acids.",
    "The river flooded the lower town twice in the nineteenth century.",
    "Please restart the server and check the logs for errors.",
    "She won the gold medal in the 400 metres at the national championships.",
    "Two women are sitting at a table drinking coffee and talking.",
    "The novel follows a young sailor who returns home after years at sea, only to find his "
    "village changed beyond recognition and his family gone.",
    "Mitochondria are the site of oxidative phosphorylation in eukaryotic cells.",
    "Is it going to rain this afternoon?",
    "The court ruled that the contract was void because it had never been signed.",
    "Add 3 to 7, then multiply the result by 12.",
    "The band released its debut album in March and toured Europe in the autumn.",
    "Vaccination reduced the incidence of measles by more than ninety percent.",
    "A man is slicing an onion on a wooden board.",
    "The cathedral, begun in 1248, was not completed until 1880.",
)


class Int8Linear(nn.Module):
    """`linear` in int8, its input channels rescaled by the calibration's `ranges` (each
    channel's largest magnitude): y ≈ bias + q(x/s) @ q(W·s)ᵀ, then `linear`'s `activation`
    where it has one (`fused._Linear`). Takes and returns float32."""

    def __init__(self, linear: nn.Linear, ranges: Tensor, alpha: float = ALPHA):
        super().__init__()
        self.activation = getattr(linear, "activation", None)
        # unpacked where it is in oneDNN's layout (`fused._Linear`)
        weight = linear.weight.detach().to_dense().float()
        smooth = (ranges.float().clamp(min=1e-5) ** alpha
                  / weight.abs().amax(0).clamp(min=1e-5) ** (1 - alpha))
        weight = weight * smooth
        step = weight.abs().amax(1).clamp(min=1e-12) / 127
        rounded = (weight / step[:, None]).round()
        self.register_buffer("weight", rounded.to(torch.int8).t().contiguous())
        self.register_buffer("sums", rounded.sum(1))
        self.register_buffer("inverse", (1 / smooth).contiguous())
        self.register_buffer("step", step)
        bias = linear.bias if linear.bias is not None else torch.zeros(weight.shape[0])
        self.register_buffer("bias", bias.detach().float().clone())

    def forward(self, x: Tensor) -> Tensor:
        y = _int8_linear(x.float(), self.inverse, self.weight, self.sums, self.step, self.bias)
        return y if self.activation is None else self.activation(y)


def _int8_linear(x: Tensor, inverse: Tensor, weight: Tensor, sums: Tensor, step: Tensor,
                 bias: Tensor) -> Tensor:
    """x·Wᵀ + b with x rescaled, then rounded per row onto 256 levels from its least to its
    largest value (x ≈ width·(q + 128) + low), and W's columns' `sums` carrying the offset."""
    x = x * inverse
    low = x.amin(1, keepdim=True)
    width = (x.amax(1, keepdim=True) - low).clamp(min=1e-12) / 255
    q = ((x - low) / width).round().sub(128).to(torch.int8)
    products = torch._int_mm(q, weight).float()
    return bias + step * (width * products + (width * 128 + low) * sums)


# inductor's: every value read by more than one kernel is realized, and where its readers
# fuse into one loop over a row, kept in that loop's buffer. Otherwise the activation's output,
# read by both the row's range and its rounding (`_int8_linear`), is computed twice, GELU's erf
# the costliest part of that loop (the same bits out either way)
_OPTIONS = {"realize_reads_threshold": 1}


def compiled(function: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`function` compiled by `torch.compile` for every shape (dynamic), or, where compiling
    fails on the first call (no C++ compiler), `function` as it is, which is said once."""
    fast = torch.compile(function, dynamic=True, options=_OPTIONS)
    chosen: list[Callable[..., Tensor]] = []

    def call(*args: Tensor, **kwargs: Tensor) -> Tensor:
        if chosen:
            return chosen[0](*args, **kwargs)
        try:
            out = fast(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any compiler failure: run uncompiled
            global _SAID
            if not _SAID:
                why = (str(e).strip().splitlines() or [""])[0]
                warnings.warn(f"int8: torch.compile failed ({type(e).__name__}: {why}); the "
                              "int8 layers run uncompiled, slower", BertflowWarning,
                              stacklevel=2)
                _SAID = True
            chosen.append(function)
            return function(*args, **kwargs)
        chosen.append(fast)
        return out

    return call


_SAID = False  # whether a compiler failure has been said


def input_ranges(layers: Iterable[nn.Module], run: Callable[[], object]) -> list[dict]:
    """Each layer's `PARTS` inputs' largest magnitude per channel over what `run` (a float32
    forward through `layers`) feeds them."""
    layers = list(layers)
    ranges: list[dict] = [{} for _ in layers]
    hooks = []
    for found, layer in zip(ranges, layers, strict=True):
        for part in PARTS:
            def record(module: nn.Module, args: tuple, found: dict = found,
                       part: str = part) -> None:
                top = args[0].detach().float().abs().amax(0)
                found[part] = top if part not in found else torch.maximum(found[part], top)
            hooks.append(getattr(layer, part).register_forward_pre_hook(record))
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return ranges


def quantize_layers(layers: Iterable[nn.Module], ranges: list[dict]) -> None:
    """Replace each layer's `PARTS` by their `Int8Linear`s, rescaled by `ranges`, and compile
    its forward (`compiled`)."""
    for layer, found in zip(layers, ranges, strict=True):
        for part in PARTS:
            setattr(layer, part, Int8Linear(getattr(layer, part), found[part]))
        layer.forward = compiled(layer.forward)
