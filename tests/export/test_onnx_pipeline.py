"""The whole pipeline (token ids → encoder → pooling → head) as one ONNX graph with its
tokenizer, run in a fresh process where torch, transformers, bertflow and nflows cannot be
imported: its vectors are those `Head.encode` gives."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bertflow import POOLINGS, Head, load_encoder
from bertflow.cli.main import main
from bertflow.encoders.identity import default_encoder_path
from bertflow.export.graphs import export_pipeline

from ..conftest import SENTENCES, fit_tiny_head
from .test_export import BLOCKED

# in a fresh interpreter where torch, transformers, bertflow and nflows cannot be imported
RUN_PIPELINE = BLOCKED.format(blocked={"bertflow", "nflows", "torch", "transformers"}).replace(
    "x = np.load(sys.argv[2])", "") + textwrap.dedent("""
    import json, pathlib
    import onnxruntime, tokenizers
    folder = pathlib.Path(sys.argv[1])
    sentences = json.loads(pathlib.Path(sys.argv[2]).read_text())
    tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    batch = tokenizer.encode_batch(sentences)
    feed = {"input_ids": np.array([b.ids for b in batch], np.int64),
            "attention_mask": np.array([b.attention_mask for b in batch], np.int64)}
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"),
                                           providers=["CPUExecutionProvider"])
    np.save(sys.argv[3], session.run(["sentence_embedding"], feed)[0])
""")

# known words, an unknown one ([UNK] is kept by the static pooling, [CLS] and [SEP] are not),
# and a sentence longer than the head's 32 tokens (cut as bertflow cuts it)
TEXTS = [*SENTENCES, "a zebra plays the xylophone", " ".join(["the big red car"] * 12)]


def run_pipeline(folder, sentences, tmp_path):
    (tmp_path / "sentences.json").write_text(json.dumps(sentences))
    done = subprocess.run([sys.executable, "-c", RUN_PIPELINE, str(folder),
                           str(tmp_path / "sentences.json"), str(tmp_path / "z.npy")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return np.load(tmp_path / "z.npy")


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_the_pipeline_graph_gives_what_encode_gives(tmp_path, tiny_encoder, pooling):
    head = fit_tiny_head(tiny_encoder, pooling)
    folder = export_pipeline(head, tmp_path / "graph", tiny_encoder)
    z = run_pipeline(folder, TEXTS, tmp_path)
    want = head.encode(TEXTS, tiny_encoder)
    assert z.shape == want.shape
    assert np.abs(unit(z) - unit(want)).max() <= 1e-4
    record = json.loads((folder / "bertflow_onnx.json").read_text())
    assert record["pooling"] == pooling and record["max_length"] == 32
    assert record["head"] == head.config() and not record["normalize"]


def test_a_linear_head_normalised_and_written_the_same_twice(tmp_path, tiny_encoder_dir,
                                                             tiny_encoder, capsys):
    x = tiny_encoder.encode(SENTENCES * 4, "mean", max_length=32)
    head = Head.fit_linear(x, "whitening", shrinkage=0.5, encoder=tiny_encoder.id,
                           pooling="mean", max_length=32)
    head.save(tmp_path / "head")
    command = ["export", "--head", str(tmp_path / "head"), "--format", "onnx-pipeline",
               "--encoder", str(tiny_encoder_dir), "--normalize", "--out"]
    assert main([*command, str(tmp_path / "first")]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'first'} (onnx-pipeline)"
    z = run_pipeline(tmp_path / "first", TEXTS, tmp_path)
    want = head.encode(TEXTS, tiny_encoder, normalize_embeddings=True)
    assert np.abs(z - want).max() <= 1e-4
    assert np.allclose(np.linalg.norm(z, axis=1), 1, atol=1e-5)
    assert main([*command, str(tmp_path / "first")]) == 0  # over its own export
    files = sorted(p.name for p in (tmp_path / "first").iterdir())
    assert {"model.onnx", "tokenizer.json", "bertflow_onnx.json", "manifest.json"} <= set(files)
    assert main([*command, str(tmp_path / "second")]) == 0
    for name in files:
        assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "second" / name
                                                             ).read_bytes(), name
    assert main(["info", str(tmp_path / "first")]) == 0
    assert "ONNX pipeline" in capsys.readouterr().out


def test_the_pipeline_refuses_another_encoder_and_a_users_folder(tmp_path, tiny_encoder,
                                                                 wide_encoder_dir, capsys):
    head = fit_tiny_head(tiny_encoder, "mean")
    head.save(tmp_path / "head")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("keep")
    for out, encoder, message in (
            ("notes", None, "notes is a non-empty folder but not a bertflow ONNX pipeline; "
             "not replacing it"),
            ("graph", wide_encoder_dir, "head expects 16-d embeddings")):
        command = ["export", "--head", str(tmp_path / "head"), "--format", "onnx-pipeline",
                   "--out", str(tmp_path / out)]
        code = main(command + (["--encoder", str(encoder)] if encoder else []))
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head", "notes"]
    assert (tmp_path / "notes" / "keep.txt").read_text() == "keep"


@pytest.mark.integration
def test_the_shipped_head_as_one_graph_on_real_sentences(tmp_path):
    """all-MiniLM-L6-v2 → first_last → the shipped flow head, on 200 STS-B sentences."""
    from bertflow.data import sts

    from ..conftest import REPO, data_dir

    if not (data_dir() / "STSBenchmark").is_dir():
        pytest.skip(f"no STS-B in {data_dir()}")
    sentences = sts.read_stsb(data_dir() / "STSBenchmark", "test").sentences()[:200]
    head = Head.load(REPO / "checkpoints" / "minilm-first_last-wiki")
    encoder = load_encoder(default_encoder_path())
    folder = export_pipeline(head, tmp_path / "graph", encoder)
    z = run_pipeline(folder, sentences, tmp_path)
    assert np.abs(unit(z) - unit(head.encode(sentences, encoder))).max() <= 1e-4
