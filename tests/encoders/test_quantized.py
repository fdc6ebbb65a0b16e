import warnings

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from bertflow import BertflowError, load_encoder
from bertflow.encoders import quantized
from bertflow.encoders.quantized import CALIBRATION, Int8Linear, input_ranges
from bertflow.errors import BertflowWarning
from bertflow.runtime.devices import resolve_dtype

from ..conftest import make_tiny_kind


def outlier_inputs(rows: int = 64, width: int = 48, seed: int = 0) -> torch.Tensor:
    """Activations like a BERT's hidden states: most channels near 1, two of them 60 times
    larger."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g)
    x[:, [3, 17]] *= 60
    return x


def linear(width: int = 48, out: int = 40, seed: int = 1) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(width, out).requires_grad_(False)


def error(layer: torch.nn.Module, exact: torch.nn.Linear, x: torch.Tensor) -> float:
    with torch.no_grad():
        want = exact(x)
        return float((layer(x) - want).norm() / want.norm())


def test_int8_linear_is_the_linear_within_rounding():
    x, exact = outlier_inputs(), linear()
    layer = Int8Linear(exact, x.abs().amax(0))
    assert layer.weight.dtype == torch.int8 and layer.weight.shape == (48, 40)
    assert error(layer, exact, x) < 0.01


def test_moving_the_outlier_channels_into_the_weights_cuts_the_error():
    x, exact = outlier_inputs(), linear()
    plain = Int8Linear(exact, x.abs().amax(0), alpha=0)  # the activations' ranges as they are
    moved = Int8Linear(exact, x.abs().amax(0))
    assert error(moved, exact, x) < error(plain, exact, x) / 3


def test_the_compiled_kernel_is_the_same_computation():
    x, exact = outlier_inputs(rows=5), linear()
    layer = Int8Linear(exact, x.abs().amax(0))
    with torch.no_grad():
        eager = layer(x)
        fast = quantized.compiled(layer.forward)(x)
    torch.testing.assert_close(fast, eager, atol=1e-4, rtol=1e-4)


def test_an_activation_read_by_a_rounding_is_computed_once():
    """The activation's output feeds both the next input's row range and its rounding:
    compiled, GELU's erf runs once per value, not once for each."""
    from torch._inductor.utils import fresh_cache, run_and_get_code

    x = outlier_inputs(rows=8)
    up = linear(48, 64)
    up.activation = torch.nn.functional.gelu
    up, down = Int8Linear(up, x.abs().amax(0)), Int8Linear(linear(64, 40), torch.ones(64))
    with torch.no_grad(), fresh_cache():
        _, code = run_and_get_code(quantized.compiled(lambda x: down(up(x))), x)
    assert "".join(code).count(".erf()") == 1


def test_a_compiler_that_fails_is_said_once_and_the_layer_runs_uncompiled(monkeypatch):
    def broken(fn, **kwargs):
        def call(*args):
            raise RuntimeError("no C++ compiler\nmore")
        return call

    monkeypatch.setattr(quantized, "_SAID", False)
    monkeypatch.setattr(torch, "compile", broken)
    x, exact = outlier_inputs(rows=3), linear()
    layer = Int8Linear(exact, x.abs().amax(0))
    first, second = quantized.compiled(layer.forward), quantized.compiled(layer.forward)
    with pytest.warns(BertflowWarning, match="torch.compile failed .RuntimeError: no C.. "
                                             "compiler.; the int8 layers run uncompiled"):
        a = first(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not once per layer or call
        b, c = first(x), second(x)
    assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, layer(x))


def test_rows_are_rounded_from_their_least_to_their_largest_value():
    """Inputs all positive, as after GELU: levels spread over [least, largest] of each row,
    not over [-largest, largest], cut the rounding error of a symmetric scheme by more than
    half (both against the same rounded weights)."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(64, 48, generator=g) * 3 + 0.5
    layer = Int8Linear(linear(), x.abs().amax(0))
    scaled = x * layer.inverse
    weights = layer.weight.float() * layer.step  # (in, out), rounded, rescaled
    want = scaled @ weights + layer.bias
    rows = scaled.abs().amax(1, keepdim=True) / 127
    symmetric = (scaled / rows).round() * rows @ weights + layer.bias
    with torch.no_grad():
        ours = float((layer(x) - want).norm())
    assert ours < 0.5 * float((symmetric - want).norm())


def test_input_ranges_are_each_channels_largest_magnitude_over_every_batch():
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for part in quantized.PARTS:
                setattr(self, part, torch.nn.Identity())

        def forward(self, x):
            return self.down(self.up(self.out(self.qkv(x))))

    layer = Layer()
    batches = [torch.tensor([[1.0, -5.0], [2.0, 0.0]]), torch.tensor([[-3.0, 4.0]])]
    ranges = input_ranges([layer], lambda: [layer(b) for b in batches])
    for part in quantized.PARTS:
        assert ranges[0][part].tolist() == [3.0, 5.0]
    layer.qkv(batches[0])  # the hooks are gone
    assert input_ranges([layer], lambda: None) == [{}]


def test_int8_encoder_is_close_to_float32_deterministic_and_named(tiny_encoder_dir):
    exact = load_encoder(tiny_encoder_dir, "cpu")
    low = load_encoder(tiny_encoder_dir, "cpu", "int8")
    assert low.precision == "int8" and low.id == exact.id
    assert isinstance(low.fused.layers[0].qkv, Int8Linear)
    assert not isinstance(exact.fused.layers[0].qkv, Int8Linear)
    sentences = ["the cat sat on the mat", "a dog runs", "the bird sings in the tree today"]
    a = exact.encode(sentences, "mean", 32, progress=False)
    b = low.encode(sentences, "mean", 32, progress=False)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.99 and not np.array_equal(a, b)
    again = load_encoder(tiny_encoder_dir, "cpu", "int8").encode(sentences, "mean", 32,
                                                                progress=False)
    assert np.array_equal(b, again)


def test_calibration_is_the_fixed_text_a_sentence_a_batch(tiny_encoder):
    batches = tiny_encoder._calibration()
    assert len(batches) == len(CALIBRATION)
    assert all(b["input_ids"].shape[0] == 1 and bool(b["attention_mask"].all()) for b in batches)


def test_int8_is_refused_where_it_cannot_run(tmp_path):
    folder = make_tiny_kind(tmp_path / "distil", "distilbert")
    with pytest.raises(BertflowError, match="dtype int8 runs only in bertflow's fused forward"):
        load_encoder(folder, "cpu", "int8")
    with pytest.raises(BertflowError, match="dtype int8 runs on the CPU only"):
        resolve_dtype("int8", torch.device("cuda"))


@pytest.mark.parametrize("bfloat16", [True, False])
def test_int8_attention_is_bfloat16_where_the_cpu_has_its_dot_products(bfloat16, monkeypatch):
    from bertflow.encoders import fused

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bfloat16)
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64)).eval()
    ids = torch.randint(5, 40, (2, 7))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        own = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    inputs = {"input_ids": ids, "attention_mask": mask}
    low = fused.fused_encoder(model, torch.int8, inputs, own, "tiny", lambda: [inputs])
    exact = fused.fused_encoder(model, torch.float32, inputs, own, "tiny")
    want = fused.bfloat16_attention if bfloat16 else fused.flash_attention
    assert all(layer.attention is want for layer in low.layers)
    assert all(layer.attention is fused.flash_attention for layer in exact.layers)
    with torch.inference_mode():
        got = low(**inputs)[-1]
    assert float((got - own[-1]).norm() / own[-1].norm()) < 0.05


def test_int8_leaves_the_model_itself_in_float32():
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    from bertflow.encoders.fused import fused_encoder

    ids = torch.randint(5, 40, (2, 7))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        own = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    fused = fused_encoder(model, torch.int8, {"input_ids": ids, "attention_mask": mask}, own,
                          "tiny", lambda: [{"input_ids": ids, "attention_mask": mask}])
    assert isinstance(fused.layers[1].down, Int8Linear)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
