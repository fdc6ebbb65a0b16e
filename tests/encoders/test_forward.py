import numpy as np
import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    DistilBertConfig,
    DistilBertModel,
    MPNetConfig,
    MPNetModel,
    RobertaConfig,
    RobertaModel,
)

from bertflow import POOLINGS, BertflowError, load_encoder, pool
from bertflow.encoders import fused as forward
from bertflow.encoders.fused import FUSED_KINDS, FusedEncoder, supports_fused

from ..conftest import WORDS, make_tiny_kind

SIZES = dict(vocab_size=40, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=40)


def padded_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (5, 11), generator=g)
    mask = torch.ones_like(ids)
    for row, length in enumerate((11, 9, 4, 2, 7)):
        mask[row, length:] = 0
        ids[row, length:] = 1
    return ids, mask


def models() -> list[torch.nn.Module]:
    torch.manual_seed(0)
    bert = BertModel(BertConfig(**SIZES, hidden_act="gelu")).eval()
    roberta = RobertaModel(RobertaConfig(**SIZES, pad_token_id=1, hidden_act="gelu_new")).eval()
    mpnet = MPNetModel(MPNetConfig(**SIZES), add_pooling_layer=False).eval()  # relative bias
    return [bert, roberta, mpnet]


@pytest.mark.parametrize("model", models(), ids=["bert", "roberta", "mpnet"])
def test_float32_forward_is_the_models_own(model):
    ids, mask = padded_batch()
    fused = FusedEncoder(model)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        got = fused(ids, mask)
    assert len(got) == len(expected.hidden_states) == 4
    for layer, (a, b) in enumerate(zip(got, expected.hidden_states, strict=True)):
        real = mask.bool()  # padded positions are not compared
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5, msg=f"layer {layer}")
        assert a.dtype == torch.float32


@pytest.mark.parametrize("width", [5, 16, 18, 21, 33])
def test_the_attention_runs_over_whole_blocks_of_keys_and_gives_the_models_own(width,
                                                                              monkeypatch):
    """Below float32, on the CPU, the keys are padded (masked) to a multiple of 16, except just
    past one, with the same result; float32's are as wide as the batch (its bits unchanged)."""
    keys = forward.key_width(width)
    assert keys == (width if width % 16 <= 4 else -(-width // 16) * 16)
    g = torch.Generator().manual_seed(width)
    ids = torch.randint(5, 40, (4, width), generator=g)
    mask = (torch.arange(width) < torch.tensor([width, width - 1, width // 2, 1])[:, None]).long()
    attention, seen = forward.F.scaled_dot_product_attention, []
    for model in models()[::2]:  # BERT's boolean mask, MPNet's bias
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            with monkeypatch.context() as m:
                m.setattr(forward.F, "scaled_dot_product_attention",
                          lambda q, k, v, **kw: seen.append(k.shape[2]) or attention(q, k, v, **kw))
                fused = FusedEncoder(model)
                fused(ids, mask)
                fused.dtype = torch.bfloat16  # its projections stay float32: compared exactly
                got = fused(ids, mask)
        for a, b in zip(got, expected.hidden_states, strict=True):
            torch.testing.assert_close(a[mask.bool()], b[mask.bool()], atol=1e-5, rtol=1e-5)
    layers = SIZES["num_hidden_layers"]
    assert seen == ([width] * layers + [keys] * layers) * 2


@pytest.mark.parametrize("bias", [False, True], ids=["boolean", "bias"])
def test_bfloat16_attention_is_flash_attention_within_bfloat16_rounding(bias):
    """int8's attention where the CPU has bfloat16 dot products: close to torch's, and what a
    masked key holds reaches nothing."""
    g = torch.Generator().manual_seed(0)
    q = 2 * torch.randn(3, 4, 21, 16, generator=g)  # peaked scores: the mask matters
    k, v = (torch.randn(3, 4, 32, 16, generator=g) for _ in range(2))
    lengths = torch.tensor([21, 9, 1])[:, None]
    mask = (torch.arange(32) < lengths)[:, None, None, :]
    if bias:
        mask = torch.randn(1, 4, 21, 32, generator=g).masked_fill(~mask, -torch.inf)
    got = forward.bfloat16_attention(q, k, v, mask)
    assert 0 < float((got - forward.flash_attention(q, k, v, mask)).abs().max()) < 0.05
    masked = (torch.arange(32) >= lengths)[:, None, :, None]
    k, v = k.masked_fill(masked, 1e4), v.masked_fill(masked, -1e4)
    assert torch.equal(forward.bfloat16_attention(q, k, v, mask), got)


def test_bfloat16_attention_in_the_forward_is_the_models_own_within_its_rounding():
    """BERT's boolean mask and MPNet's bias, with the keys padded to whole blocks."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 40, (4, 21), generator=g)
    mask = (torch.arange(21) < torch.tensor([21, 20, 10, 1])[:, None]).long()
    real = mask.bool()
    for model in models()[::2]:
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            fused = FusedEncoder(model)
            exact = fused(ids, mask)
            for layer in fused.layers:
                layer.attention = forward.bfloat16_attention
            fused.dtype = torch.bfloat16  # the keys in whole blocks; the projections float32
            got = fused(ids, mask)
        for a, b, e in zip(got[1:], expected.hidden_states[1:], exact[1:], strict=True):
            assert float((a[real] - b[real]).abs().max() / b[real].abs().max()) < 1e-3
            assert not torch.equal(a[real], e[real])  # not the float32 attention


@pytest.mark.parametrize("act", [*forward.POST_OPS, "silu"])
def test_each_activation_fused_into_its_projection_or_not_is_the_models_own(act):
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SIZES, hidden_act=act)).eval()
    ids, mask = padded_batch(3)
    fused = FusedEncoder(model)
    up = fused.layers[0].up
    assert (up.weight.is_mkldnn and up.post is not None) == (forward._ONEDNN and act != "silu")
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        got = fused(ids, mask)
    real = mask.bool()
    for a, b in zip(got, expected.hidden_states, strict=True):
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not forward._ONEDNN, reason="this torch has no oneDNN linear")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_projection_gives_the_bits_of_an_unpacked_one_and_survives_a_cast(dtype):
    torch.manual_seed(0)
    parts = [torch.nn.Linear(32, 48) for _ in range(2)]
    linear = forward._linear(dtype, *parts, activation=torch.nn.GELU(),
                             post=forward.POST_OPS["gelu"])
    assert linear.weight.is_mkldnn and linear.post is not None
    x = torch.randn(13, 32).to(dtype)
    plain = torch.cat([part.weight for part in parts]).to(dtype)
    bias = torch.cat([part.bias for part in parts]).to(dtype)
    with torch.no_grad():
        expected = torch.ops.mkldnn._linear_pointwise(x, plain, bias, "gelu", [], "none")
        assert torch.equal(linear(x), expected)
        linear.double()  # unpacked to be cast; float64 is not packed: torch's own product
        assert not linear.weight.is_mkldnn  # so not oneDNN's post op, torch's GELU
        assert torch.equal(linear.weight, plain.double())
        torch.testing.assert_close(linear(x.double()), torch.nn.functional.gelu(
            x.double() @ plain.double().T + bias.double()))
        linear.to(dtype)  # and packed again
        assert linear.weight.is_mkldnn and torch.equal(linear(x), expected)


def test_where_oneDNN_refuses_a_packed_weight_the_layer_applies_its_own_activation(monkeypatch):
    torch.manual_seed(0)
    model = BertModel(BertConfig(**SIZES, hidden_act="gelu")).eval()
    ids, mask = padded_batch(4)
    with torch.no_grad():
        packed = FusedEncoder(model)(ids, mask)
        monkeypatch.setattr(forward, "_packs", lambda dtype: False)
        fused = FusedEncoder(model)
        plain = fused(ids, mask)
    assert not fused.layers[0].up.weight.is_mkldnn  # so not oneDNN's post op
    real = mask.bool()
    for a, b in zip(plain, packed, strict=True):
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)


def test_keep_returns_only_the_layers_asked_for():
    model = models()[0]
    ids, mask = padded_batch()
    with torch.no_grad():
        every = FusedEncoder(model)(ids, mask)
        some = FusedEncoder(model)(ids, mask, keep={1, -1})
    assert [s is not None for s in some] == [False, True, False, True]
    assert torch.equal(some[1], every[1]) and torch.equal(some[-1], every[-1])


@pytest.mark.parametrize("which", [0, 2], ids=["bert", "mpnet"])
def test_bfloat16_computes_projections_low_and_returns_float32_close_to_float32(which):
    model = models()[which]
    ids, mask = padded_batch(1)
    with torch.no_grad():
        exact = FusedEncoder(model)(ids, mask)[-1]
        fused = FusedEncoder(model, torch.bfloat16)
        low = fused(ids, mask)[-1]
    assert fused.layers[0].qkv.weight.dtype == torch.bfloat16
    assert low.dtype == torch.float32
    assert next(model.encoder.layer[0].parameters()).dtype == torch.float32  # untouched
    real = mask.bool()
    cos = torch.nn.functional.cosine_similarity(low[real], exact[real], dim=-1)
    assert cos.min() > 0.999
    assert not torch.equal(low, exact)


def test_other_architectures_are_not_claimed():
    torch.manual_seed(0)
    distil = DistilBertModel(DistilBertConfig(vocab_size=40, dim=32, n_layers=2, n_heads=4,
                                              hidden_dim=64, max_position_embeddings=40))
    assert not supports_fused(distil)
    with pytest.raises(ValueError, match="not a BERT-architecture"):
        FusedEncoder(distil)
    decoder = BertModel(BertConfig(**SIZES, is_decoder=True))
    assert not supports_fused(decoder)


def test_projections_see_the_real_tokens_and_few_padded_rows():
    model = models()[2]
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 40, (6, 30), generator=g)
    mask = (torch.arange(30) < torch.tensor([30, 25, 20, 13, 7, 2])[:, None]).long()
    fused = FusedEncoder(model)
    rows = []
    for layer in fused.layers:
        for part in (layer.qkv, layer.out, layer.up, layer.down):
            part.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    with torch.no_grad():
        fused(ids, mask)
    # 97 real tokens of 180 positions: rounded up to a sixteenth of 64, 100 rows
    assert int(mask.sum()) == 97 and rows == [100] * 4 * len(fused.layers)


# each kind transformers pairs with a masked-LM head whose layers carry BERT's attribute names,
# with what its tiny config needs (a window or block small enough to matter at 40 tokens)
OTHER_KINDS = {"roformer": {"initializer_range": 0.2}, "longformer": {"attention_window": 8},
               "big_bird": {"attention_type": "original_full"}, "yoso": {}, "mra": {},
               "xmod": {"languages": ["en_XX"], "default_language": "en_XX"}, "convbert": {},
               "mobilebert": {"embedding_size": 16}, "luke": {}, "layoutlm": {},
               "rembert": {"input_embedding_size": 16}, "albert": {"embedding_size": 16},
               "deberta-v2": {}, "distilbert": {}}
FUSED_CONFIG = {"electra": {"embedding_size": 32}}
# rows of about 40, 25 and 5 tokens, and the roformer case: the same words in another order
LONG = " ".join(WORDS) + " a man plays the guitar in the park"
ROWS = [LONG, " ".join(WORDS[:23]), "a big red car", "the man plays the guitar in the park",
        "the park plays the man in the guitar"]


@pytest.fixture(scope="module")
def kind_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds")
    return {kind: make_tiny_kind(root / kind, kind, **{**FUSED_CONFIG, **OTHER_KINDS}.get(kind, {}))
            for kind in [*FUSED_KINDS, *OTHER_KINDS]}


def own_pooled(folder, pooling):
    """Each row pooled from the model's own forward, one row at a time (no padding)."""
    import transformers

    model = transformers.AutoModel.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    rows = []
    for text in ROWS:
        batch = tokenizer([text], return_tensors="pt", return_special_tokens_mask=True)
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")
                  if k in batch}
        with torch.no_grad():
            states = model(**inputs, output_hidden_states=True).hidden_states
            words = model.get_input_embeddings()(batch["input_ids"])
        states = [h[:, : batch["input_ids"].shape[1]] for h in states]
        rows.append(pool(states, words, batch["attention_mask"], batch["special_tokens_mask"],
                         pooling)[0])
    return torch.stack(rows).numpy()


@pytest.mark.parametrize("kind", sorted(FUSED_KINDS))
def test_each_fused_kind_is_exact(kind, kind_folders):
    encoder = load_encoder(kind_folders[kind], device="cpu")
    assert encoder.fused is not None
    batch = encoder.tokenize(ROWS, 64, padding=True, return_tensors="pt")
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")
              if k in batch}
    with torch.no_grad():
        fused = encoder.fused(**inputs)
        own = encoder.model(**inputs, output_hidden_states=True).hidden_states
    real = inputs["attention_mask"].bool()
    assert real.sum(1).max() >= 40
    for a, b in zip(fused, own, strict=True):
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(OTHER_KINDS))
def test_other_kinds_run_through_their_own_forward(kind, kind_folders):
    """Kinds the fused forward does not compute (rotary positions, sparse or approximate
    attention, adapters, other layer layouts) give, through bertflow, each pooling of the
    model's own forward; RoFormer is no bag of words."""
    encoder = load_encoder(kind_folders[kind], device="cpu")
    assert encoder.fused is None
    assert encoder.unpadded == (kind in ("convbert", "yoso"))  # their states change with padding
    for pooling in POOLINGS:
        got = encoder.encode(ROWS, pooling, max_length=64, batch_size=3)
        np.testing.assert_allclose(got, own_pooled(kind_folders[kind], pooling), atol=2e-5,
                                   err_msg=f"{kind} {pooling}")
    if kind == "roformer":  # word order counts
        mean = encoder.encode(ROWS[-2:], "mean", max_length=64)
        assert np.abs(mean[0] - mean[1]).max() > 1e-2


def test_a_fused_kind_that_differs_falls_back_and_says_so_once(kind_folders, monkeypatch,
                                                               tmp_path, capsys):
    """Where the fused forward differs from the model's own on the load-time probe (here a
    kind put on the list by hand), the encoder uses the model's own forward and says so in one
    line."""
    from bertflow.cli.main import main
    from bertflow.errors import BertflowWarning

    monkeypatch.setitem(forward.FUSED_KINDS, "longformer", forward.FUSED_KINDS["bert"])
    folder = kind_folders["longformer"]
    with pytest.warns(BertflowWarning, match=r"longformer\): the fused forward differs") as seen:
        encoder = load_encoder(folder, device="cpu")
    assert len(seen) == 1 and encoder.fused is None
    np.testing.assert_allclose(encoder.encode(ROWS, "mean", max_length=64, batch_size=3),
                               own_pooled(folder, "mean"), atol=2e-5)
    sentences = tmp_path / "s.txt"
    sentences.write_text("\n".join(ROWS) + "\n")
    assert main(["encode", str(sentences), "--encoder", str(folder), "--out",
                 str(tmp_path / "e.npy"), "--quiet", "--no-cache", "--max-length", "64"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertflow: note: encoder ") and "own forward" \
        in err[0], err


@pytest.mark.parametrize("kind, config, says", [
    ("perceiver", {}, "cannot embed text alone: TypeError"),
    ("tapas", {}, "cannot embed text alone: IndexError"),  # a table model
    ("nystromformer", {"num_landmarks": 4, "segment_means_seq_len": 128},  # 128 tokens or none
     "cannot embed text alone: RuntimeError"),
    ("big_bird", {"block_size": 4, "num_random_blocks": 2},
     'its forward changes the model itself .*"attention_type": "original_full"'),
])
def test_a_kind_that_cannot_embed_text_is_one_line(kind, config, says, tmp_path, capsys):
    """A kind that cannot run on a padded batch of text, or whose forward changes the model
    (BigBird in block-sparse mode), is refused by one line naming it."""
    import re

    from bertflow.cli.main import main

    folder = make_tiny_kind(tmp_path / kind, kind, **config)
    sentences = tmp_path / "s.txt"
    sentences.write_text("a man plays the guitar\n")
    assert main(["encode", str(sentences), "--encoder", str(folder), "--out",
                 str(tmp_path / "e.npy"), "--no-cache"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(rf"\({kind}\):? {says}", err[0]), err
    assert not (tmp_path / "e.npy").exists()


def test_a_pipeline_refuses_an_encoder_whose_states_change_with_padding(kind_folders):
    from bertflow import FlowHead
    from bertflow.export.pipeline import build_pipeline

    encoder = load_encoder(kind_folders["convbert"], device="cpu")
    x = encoder.encode([" ".join(WORDS[i : i + 5]) for i in range(40)], "mean", max_length=64)
    head = FlowHead.fit_linear(x, "whitening", encoder=encoder.id, pooling="mean",
                               max_length=64)
    with pytest.raises(BertflowError, match="change with the padding a sentence-transformers"):
        build_pipeline(head, encoder)
