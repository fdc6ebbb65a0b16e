"""sentence-transformers' calling convention on `Encoder.encode` and `FlowHead.encode`: one
string, output conversions, normalisation, device, MTEB's extra keywords, similarity and the
embedding dimension, checked against sentence-transformers itself where it is installed."""

import numpy as np
import pytest
import torch

from bertflow import BertflowError
from bertflow.constants import DEFAULT_POOLING

from ..conftest import SENTENCES, fit_tiny_head

# what MTEB (1.x: task_name; 2.x: task_metadata, hf_split, hf_subset) passes to encode
MTEB_KEYWORDS = {"task_name": "STSBenchmark", "prompt_type": None, "task_metadata": object(),
                 "hf_split": "test", "hf_subset": "default", "request_qid": None}


@pytest.fixture(scope="module")
def head(tiny_encoder):
    return fit_tiny_head(tiny_encoder, "mean")


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_positional_calls_keep_their_meaning(tiny_encoder, head):
    x = tiny_encoder.encode(SENTENCES, "mean", 128, 4, False)
    assert isinstance(x, np.ndarray) and x.shape == (len(SENTENCES), 16) and x.dtype == np.float32
    both = tiny_encoder.encode(SENTENCES, ["cls", "mean"], 128, 4, False)
    np.testing.assert_array_equal(both["mean"], x)
    z = head.encode(SENTENCES, tiny_encoder, 4, False)
    assert isinstance(z, np.ndarray) and z.shape == x.shape
    np.testing.assert_allclose(z, head.transform(x), atol=1e-6)


def test_one_string_gives_one_vector(tiny_encoder, head):
    x = tiny_encoder.encode(SENTENCES, "mean")
    one = tiny_encoder.encode(SENTENCES[0], "mean")
    assert one.shape == (16,)
    np.testing.assert_allclose(one, x[0], atol=1e-6)
    assert {p: v.shape for p, v in tiny_encoder.encode(SENTENCES[0], ["cls", "mean"]).items()} \
        == {"cls": (16,), "mean": (16,)}
    z = head.encode(SENTENCES[0], tiny_encoder)
    assert z.shape == (16,)
    np.testing.assert_allclose(z, head.encode(SENTENCES, tiny_encoder)[0], atol=1e-5)
    # any iterable of strings is read into a list, as sentence-transformers does
    np.testing.assert_allclose(tiny_encoder.encode(np.array(SENTENCES), "mean"), x, atol=1e-6)
    np.testing.assert_allclose(tiny_encoder.encode(iter(SENTENCES), "mean"), x, atol=1e-6)


@pytest.mark.parametrize("which", ["encoder", "head"])
def test_outputs_convert_as_sentence_transformers_does(tiny_encoder, head, which):
    def encode(sentences, **options):
        if which == "encoder":
            return tiny_encoder.encode(sentences, "mean", **options)
        return head.encode(sentences, tiny_encoder, **options)

    x = encode(SENTENCES)
    tensor = encode(SENTENCES, convert_to_tensor=True)
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
    assert tensor.device.type == "cpu" and tensor.shape == x.shape
    np.testing.assert_allclose(tensor.numpy(), x, atol=1e-6)
    wins = encode(SENTENCES, convert_to_tensor=True, convert_to_numpy=True)
    assert isinstance(wins, torch.Tensor)  # convert_to_tensor wins, as in sentence-transformers
    listed = encode(SENTENCES, convert_to_numpy=False)
    assert isinstance(listed, list) and len(listed) == len(SENTENCES)
    assert all(isinstance(v, torch.Tensor) and v.shape == (x.shape[1],) for v in listed)
    np.testing.assert_allclose(torch.stack(listed).numpy(), x, atol=1e-6)
    single = encode(SENTENCES[0], convert_to_tensor=True)
    assert isinstance(single, torch.Tensor) and single.shape == (x.shape[1],)
    unit_rows = encode(SENTENCES, normalize_embeddings=True)
    np.testing.assert_allclose(np.linalg.norm(unit_rows, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(unit_rows, unit(x), atol=1e-5)  # after the head, for a head
    np.testing.assert_allclose(encode(SENTENCES[0], normalize_embeddings=True), unit(x[0]),
                               atol=1e-5)


@pytest.mark.parametrize("which", ["encoder", "head"])
def test_mteb_keywords_are_ignored_and_options_that_change_embeddings_refused(
        tiny_encoder, head, which):
    def encode(sentences, **options):
        if which == "encoder":
            return tiny_encoder.encode(sentences, "mean", **options)
        return head.encode(sentences, tiny_encoder, **options)

    x = encode(SENTENCES)
    got = encode(SENTENCES, batch_size=3, show_progress_bar=False, prompt=None,
                 prompt_name=None, precision="float32", truncate_dim=None,
                 output_value="sentence_embedding", **MTEB_KEYWORDS)
    np.testing.assert_allclose(got, x, atol=1e-5)
    for option, value in (("prompt", "query: "), ("prompt_name", "query"),
                          ("precision", "int8"), ("truncate_dim", 8),
                          ("output_value", "token_embeddings"), ("output_value", None)):
        with pytest.raises(BertflowError, match=f"{option}=.* is not supported"):
            encode(SENTENCES, **{option: value})
    with pytest.raises(BertflowError, match="several devices"):
        encode(SENTENCES, device=["cpu", "cpu"])
    with pytest.raises(BertflowError, match="list of dict"):  # e.g. MTEB 2's batches
        encode([{"text": SENTENCES}])
    with pytest.raises(BertflowError, match="non-empty"):
        encode([])
    with pytest.raises(BertflowError, match="batch size must be at least 1"):
        encode(SENTENCES, batch_size=0)


def test_progress_bar_by_either_name(tiny_encoder, capsys):
    tiny_encoder.encode(SENTENCES, "mean", show_progress_bar=True)
    assert "encoding" in capsys.readouterr().err
    tiny_encoder.encode(SENTENCES, "mean", progress=True, show_progress_bar=False)
    assert "encoding" not in capsys.readouterr().err  # the sentence-transformers name wins
    tiny_encoder.encode(SENTENCES, "mean")
    assert "encoding" not in capsys.readouterr().err  # a few sentences: no bar by default


def test_device_moves_the_encoder_or_is_refused(tiny_encoder_dir, head):
    from bertflow import load_encoder

    encoder = load_encoder(tiny_encoder_dir, device="cpu")
    x = encoder.encode(SENTENCES, "mean")
    np.testing.assert_allclose(encoder.encode(SENTENCES, "mean", device="cpu"), x, atol=1e-6)
    assert encoder.device == torch.device("cpu")
    np.testing.assert_allclose(head.encode(SENTENCES, tiny_encoder_dir, device="cpu"),
                               head.transform(x), atol=1e-5)
    with pytest.raises(BertflowError, match="unknown device 'tpu'"):
        encoder.encode(SENTENCES, "mean", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(BertflowError, match="sees no CUDA GPU"):
            encoder.encode(SENTENCES, "mean", device="cuda")
        assert encoder.device == torch.device("cpu")  # refused before anything moved
    else:
        got = encoder.encode(SENTENCES, "mean", device="cuda")
        assert encoder.device.type == "cuda" and next(encoder.model.parameters()).is_cuda
        np.testing.assert_allclose(got, x, atol=1e-4)


def test_similarity_is_sentence_transformers_cosine(tiny_encoder, head):
    util = pytest.importorskip("sentence_transformers.util")
    a = tiny_encoder.encode(SENTENCES, "mean")
    b = tiny_encoder.encode(SENTENCES[:3], "mean", convert_to_tensor=True)
    for model in (tiny_encoder, head):
        assert model.similarity_fn_name == "cosine"
        s = model.similarity(a, b)
        assert isinstance(s, torch.Tensor) and s.shape == (len(SENTENCES), 3)
        torch.testing.assert_close(s, util.cos_sim(a, b))
        torch.testing.assert_close(model.similarity(a[0], a), util.cos_sim(a[0], a))
        assert model.similarity(a[0], a).shape == (1, len(SENTENCES))
        listed = tiny_encoder.encode(SENTENCES, "mean", convert_to_numpy=False)
        torch.testing.assert_close(model.similarity(listed, b), util.cos_sim(listed, b))
        pairs = model.similarity_pairwise(a[:3], b)
        assert pairs.shape == (3,)
        torch.testing.assert_close(pairs, util.pairwise_cos_sim(a[:3], b))
    mixed = head.similarity(a.astype(np.float64), b)  # float64 against float32: promoted
    assert mixed.dtype == torch.float64
    torch.testing.assert_close(mixed.float(), util.cos_sim(a, b))
    with pytest.raises(BertflowError, match="one shape"):
        head.similarity_pairwise(a, b)


def test_embedding_dimension(tiny_encoder, head):
    assert tiny_encoder.get_sentence_embedding_dimension() == tiny_encoder.width(DEFAULT_POOLING)
    assert tiny_encoder.get_sentence_embedding_dimension() == \
        tiny_encoder.encode(SENTENCES[0]).shape[0]
    assert tiny_encoder.get_sentence_embedding_dimension("static") == tiny_encoder.embedding_dim
    assert tiny_encoder.get_embedding_dimension() == tiny_encoder.get_sentence_embedding_dimension()
    assert head.get_sentence_embedding_dimension() == head.get_embedding_dimension() == head.dim


def test_head_encode_agrees_with_its_sentence_transformers_pipeline(tiny_encoder, head):
    pytest.importorskip("sentence_transformers")
    from bertflow.export.pipeline import build_pipeline

    model = build_pipeline(head, tiny_encoder)
    for options in ({}, {"normalize_embeddings": True}, {"convert_to_tensor": True},
                    {"convert_to_numpy": False}):
        for sentences in (SENTENCES, SENTENCES[2]):
            ours, theirs = head.encode(sentences, tiny_encoder, **options), \
                model.encode(sentences, **options)
            assert type(ours) is type(theirs), options
            if isinstance(ours, list):
                ours, theirs = torch.stack(ours), torch.stack(theirs)
            assert tuple(ours.shape) == tuple(theirs.shape)
            np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5)
    assert head.get_sentence_embedding_dimension() == model.get_embedding_dimension()
