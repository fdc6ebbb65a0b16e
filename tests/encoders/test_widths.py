"""Encoders whose input embeddings are narrower than their hidden states (ELECTRA, ALBERT)."""

import json

import numpy as np
import pytest
import torch

from bertflow import POOLINGS, BertflowError, FlowHead, load_encoder
from bertflow.cli.main import main
from bertflow.encoders.fused import supports_fused

from ..conftest import SENTENCES, WORDS
from ..data.test_sts import write_stsb
from .test_encoder import hand_pooled

EMBEDDING, HIDDEN = 8, 16


def make_narrow_encoder(folder, kind: str, embedding: int = EMBEDDING, hidden: int = HIDDEN):
    """A tiny randomly initialised ELECTRA or ALBERT (embedding width `embedding`, hidden width
    `hidden`) with a WordPiece tokenizer over `WORDS`, saved to `folder`."""
    from transformers import (
        AlbertConfig,
        AlbertModel,
        BertTokenizerFast,
        ElectraConfig,
        ElectraModel,
        ElectraTokenizerFast,
    )

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = {"electra": ElectraTokenizerFast, "albert": BertTokenizerFast}[kind]
    tokenizer(vocab=str(vocab), do_lower_case=True).save_pretrained(folder)
    options = dict(vocab_size=len(WORDS) + 5, embedding_size=embedding, hidden_size=hidden,
                   num_hidden_layers=3, num_attention_heads=2, intermediate_size=2 * hidden,
                   max_position_embeddings=128)
    torch.manual_seed(0)
    if kind == "electra":
        ElectraModel(ElectraConfig(**options)).save_pretrained(folder)
    else:
        AlbertModel(AlbertConfig(**options)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["electra", "albert"])
def narrow_dir(request, tmp_path_factory):
    return make_narrow_encoder(tmp_path_factory.mktemp(f"tiny-{request.param}"), request.param)


@pytest.fixture(scope="module")
def narrow(narrow_dir):
    return load_encoder(narrow_dir, device="cpu")


def test_widths_per_pooling(narrow):
    assert narrow.dim == HIDDEN
    assert {p: narrow.width(p) for p in POOLINGS} == {
        "cls": HIDDEN, "mean": HIDDEN, "first_last": HIDDEN, "last2": HIDDEN, "static": EMBEDDING}
    with pytest.raises(BertflowError, match="unknown pooling 'max'"):
        narrow.width("max")


def test_tiny_bert_widths_agree(tiny_encoder):
    assert {tiny_encoder.width(p) for p in POOLINGS} == {tiny_encoder.dim} == {16}


def test_the_fused_forward_leaves_projected_and_shared_layers_to_the_model(narrow):
    """ELECTRA's `embeddings_project` and ALBERT's shared layer groups are not BERT's."""
    assert narrow.fused is None and not supports_fused(narrow.model)


def test_electra_without_a_projection_is_still_fused(tmp_path):
    encoder = load_encoder(make_narrow_encoder(tmp_path, "electra", embedding=HIDDEN),
                           device="cpu")
    assert not hasattr(encoder.model, "embeddings_project") and encoder.fused is not None
    got = encoder.encode(SENTENCES, "mean", batch_size=3)
    for row, sentence in zip(got, SENTENCES, strict=True):
        np.testing.assert_allclose(row, hand_pooled(encoder, sentence, "mean"), atol=1e-5)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_every_pooling_matches_the_models_own_outputs(narrow, pooling):
    got = narrow.encode(SENTENCES, pooling, batch_size=3)
    assert got.shape == (len(SENTENCES), narrow.width(pooling)) and got.dtype == np.float32
    for row, sentence in zip(got, SENTENCES, strict=True):
        np.testing.assert_allclose(row, hand_pooled(narrow, sentence, pooling), atol=1e-5)


def test_several_poolings_of_both_widths_in_one_pass(narrow):
    both = narrow.encode(SENTENCES, ["mean", "static"], batch_size=3)
    assert both["mean"].shape == (len(SENTENCES), HIDDEN)
    assert both["static"].shape == (len(SENTENCES), EMBEDDING)
    np.testing.assert_allclose(both["static"], narrow.encode(SENTENCES, "static"), atol=1e-6)


def test_encode_fit_transform_eval_commands(narrow_dir, corpus_file, tmp_path, capsys):
    cache = ["--cache", str(tmp_path / "cache")]
    common = ["--encoder", str(narrow_dir), "--device", "cpu"]
    small = ["--epochs", "1", "--levels", "1", "--depth", "1", "--linear", "lu", "--quiet"]
    for pooling, width in (("mean", HIDDEN), ("static", EMBEDDING)):
        emb = tmp_path / f"{pooling}.npy"
        assert main(["encode", str(corpus_file), "--out", str(emb), "--pooling", pooling,
                     *common, *cache]) == 0
        assert f"× {width} " in capsys.readouterr().out
        assert np.load(emb).shape == (120, width)
        assert json.loads(emb.with_name(f"{pooling}.meta.json").read_text())["dim"] == width
    head = tmp_path / "head"
    assert main(["fit", str(tmp_path / "mean.npy"), "--out", str(head), "--pooling", "mean",
                 *common, *small]) == 0
    assert FlowHead.load(head).dim == HIDDEN
    static_head = tmp_path / "static-head"
    assert main(["fit", str(corpus_file), "--out", str(static_head), "--pooling", "static",
                 *common, *small, *cache]) == 0
    assert FlowHead.load(static_head).dim == EMBEDDING
    bare = tmp_path / "bare.npy"  # no sidecar: --pooling and --encoder say how it was made
    np.save(bare, np.load(tmp_path / "static.npy"))
    assert main(["fit", str(bare), "--out", str(tmp_path / "bare-head"), "--pooling", "static",
                 *common, *small]) == 0
    assert main(["fit", str(bare), "--out", str(tmp_path / "bare-head"), "--pooling", "mean",
                 *common, *small]) == 1
    assert f"holds {EMBEDDING}-d embeddings, but encoder" in capsys.readouterr().err

    sentences, z = tmp_path / "s.txt", tmp_path / "z.npy"
    sentences.write_text("\n".join(SENTENCES) + "\n")
    for fitted, width in ((head, HIDDEN), (static_head, EMBEDDING)):
        assert main(["transform", "--head", str(fitted), "--sentences", str(sentences),
                     "--out", str(z), *common]) == 0
        assert np.load(z).shape == (len(SENTENCES), width)
    data = tmp_path / "data"
    write_stsb(data / "STSBenchmark")
    for fitted in (head, static_head):
        assert main(["eval", "sts", str(data), "--head", str(fitted), "--tasks", "STS-B",
                     "--out", str(tmp_path / "rows.json"), "--quiet", *common, *cache]) == 0
    assert main(["diagnose", str(corpus_file), "--out", str(tmp_path / "plots"), "--head",
                 str(static_head), "--quiet", *common, *cache]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("pooling", ["mean", "static"])
def test_index_and_pipeline_check_a_head_against_its_poolings_width(narrow, pooling):
    from bertflow.export.pipeline import build_pipeline
    from bertflow.search.index import Index

    from ..conftest import fit_tiny_head

    head = fit_tiny_head(narrow, pooling)
    assert head.dim == narrow.width(pooling)
    index = Index.build(SENTENCES, narrow, head=head)
    assert index.config["pooling"] == pooling and index.config["dims"] == head.dim
    model = build_pipeline(head, narrow)
    assert model.get_sentence_embedding_dimension() == head.dim
    got = model.encode(SENTENCES, convert_to_numpy=True)
    np.testing.assert_allclose(got, head.encode(SENTENCES, narrow), atol=1e-4)
