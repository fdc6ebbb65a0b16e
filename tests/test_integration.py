"""The real default encoder on real sentences: 500 STS-B sentences from the shared data folder,
or, on a machine without it, 500 sentences of the Lee corpus that ships with gensim."""

import numpy as np
import pytest
import torch

from bertflow import FlowHead, fit_head, lee, load_encoder, mean_pair_cosine, sts
from bertflow.cli.main import main

from .conftest import REPO, data_dir

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    folder = data_dir() / "STSBenchmark"
    if folder.is_dir():
        pairs = sts.read_stsb(folder, "train")
        return pairs.sentences()[:500]
    return lee.background_sentences()[:500]


@pytest.fixture(scope="module")
def encoder():
    return load_encoder()


def cosine(x) -> float:
    return mean_pair_cosine(torch.from_numpy(np.asarray(x, dtype=np.float32)))


def test_encode_fit_export_load_transform_under_cls(tmp_path, capsys, sentences, encoder):
    """Fit on 400 sentences, transform the 100 held out."""
    corpus, held_out = tmp_path / "corpus.txt", tmp_path / "held_out.txt"
    corpus.write_text("\n".join(sentences[:400]) + "\n", encoding="utf-8")
    held_out.write_text("\n".join(sentences[400:]) + "\n", encoding="utf-8")
    emb, emb_out = tmp_path / "emb.npy", tmp_path / "held_out.npy"
    head, z_txt, z_emb = tmp_path / "head", tmp_path / "z1.npy", tmp_path / "z2.npy"

    assert main(["encode", str(corpus), "--out", str(emb), "--pooling", "cls"]) == 0
    assert main(["fit", str(emb), "--out", str(head), "--seed", "0", "--quiet"]) == 0
    assert main(["transform", "--head", str(head), "--sentences", str(held_out),
                 "--out", str(z_txt)]) == 0
    assert main(["encode", str(held_out), "--out", str(emb_out), "--pooling", "cls"]) == 0
    assert main(["transform", "--head", str(head), "--embeddings", str(emb_out),
                 "--out", str(z_emb)]) == 0
    capsys.readouterr()

    x, z = np.load(emb_out), np.load(z_txt)
    assert x.shape == z.shape == (100, 384)
    np.testing.assert_allclose(np.load(z_emb), z, atol=1e-4)
    loaded = FlowHead.load(head)
    assert loaded.encoder == encoder.id and loaded.pooling == "cls"
    before, after = cosine(x), cosine(z)
    assert before > 0.3, before  # CLS vectors of the default encoder sit in a narrow cone
    assert after < 0.1, after


def test_real_fit_is_bit_identical_across_runs(tmp_path, sentences, encoder):
    x = encoder.encode(sentences, "static")
    a = fit_head(x, encoder=encoder.id, pooling="static").save(tmp_path / "a")
    b = fit_head(x, encoder=encoder.id, pooling="static").save(tmp_path / "b")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


@pytest.mark.parametrize("pooling", ["cls", "mean", "first_last", "last2", "static"])
def test_every_pooling_runs_on_the_real_encoder(sentences, encoder, pooling):
    x = encoder.encode(sentences[:64], pooling)
    assert x.shape == (64, 384) and np.isfinite(x).all()
    assert np.linalg.norm(x, axis=1).min() > 0


def test_shipped_head_in_a_pipeline_and_an_index(tmp_path, sentences, encoder):
    """The committed head on the real encoder: the sentence-transformers pipeline gives what
    `head.encode` gives, and a flat index finds each sentence first."""
    from bertflow.export.pipeline import build_pipeline, load_pipeline, save_pipeline
    from bertflow.search.index import Index

    head = FlowHead.load(REPO / "checkpoints" / "minilm-first_last-wiki")
    batch = sentences[:64]
    expected = head.encode(batch, encoder)
    model = save_pipeline(build_pipeline(head, encoder, normalize=True), tmp_path / "st")
    got = load_pipeline(model).encode(batch)
    np.testing.assert_allclose(
        got, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-4)

    index = Index.build(sentences, encoder, head=head)
    hits = index.search(batch[:10], encoder, k=1)
    assert [h[0][1] for h in hits] == batch[:10]


def test_a_head_chosen_without_labels_on_real_documents(tmp_path, capsys, encoder):
    """300 SciFact abstracts: the proxy pairs each first sentence with the rest; the chosen
    head is the candidate the table marks, and transforms as that candidate does."""
    source = data_dir() / "beir" / "scifact" / "corpus.jsonl"
    if not source.is_file():
        pytest.skip(f"no {source}")
    corpus = tmp_path / "corpus.jsonl"
    with open(source, encoding="utf-8") as f:
        corpus.write_text("".join(next(f) for _ in range(300)), encoding="utf-8")
    head = tmp_path / "head"
    code = main(["fit", str(corpus), "--for", "retrieval", "--pooling", "mean", "--max-length",
                 "128", "--out", str(head), "--cache", str(tmp_path / "cache"), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    chosen = FlowHead.load(head)
    record = chosen.training_info["choice"]
    assert record["proxy"]["pairs"]["first sentence → rest"] >= 250
    [row] = [r for r in record["candidates"] if r["chosen"]]
    assert f"| {row['candidate']} * |" in out and record["chosen"] == row["candidate"]
    assert chosen.method == row["method"] and chosen.pooling == "mean"
    identity = record["candidates"][0]
    assert identity["candidate"] == "identity (raw)" and identity["difference"] == 0
    if row is not identity:
        assert row["interval"][0] > 0
    x = encoder.encode(["A protein that binds DNA.", "Cells divide."], "mean", max_length=128)
    assert np.isfinite(chosen.transform(x)).all()


def test_int8_keeps_the_real_encoders_vectors_within_0_99(sentences, encoder):
    """The int8 projections (`bertflow.encoders.quantized`) against float32 on 500 real
    sentences: every vector keeps a cosine of 0.99 to its float32 one under mean pooling."""
    exact = encoder.encode(sentences, "mean", 256, progress=False)
    low = load_encoder(None, "cpu", "int8").encode(sentences, "mean", 256, progress=False)
    cos = (exact * low).sum(1) / np.linalg.norm(exact, axis=1) / np.linalg.norm(low, axis=1)
    assert 0.99 < cos.min() < 0.99999
