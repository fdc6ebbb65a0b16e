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

from bertflow.forward import FusedEncoder, supports_fused

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
