import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import bertflow.embeddings
import bertflow.encoder
from bertflow import BertflowError
from bertflow.corpus import Corpus
from bertflow.embeddings import EmbeddingFile, read_meta, write_embeddings
from bertflow.files import meta_path

from .conftest import REPO, WORDS

CHUNK = 16


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 16 sentences, so that a corpus of a few hundred has many."""
    monkeypatch.setattr(bertflow.encoder, "CHUNK_SIZE", CHUNK)
    monkeypatch.setattr(bertflow.embeddings, "CHUNK_SIZE", CHUNK)


def salad(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_written_file_is_what_encode_gives_bit_for_bit(tmp_path, tiny_encoder, small_chunks):
    sentences = salad(100)
    expected = tiny_encoder.encode(sentences, ["cls", "static"], batch_size=5)
    targets = {"cls": tmp_path / "cls.npy", "static": tmp_path / "static.npy"}
    metas = write_embeddings(targets, Corpus.from_sentences(sentences), tiny_encoder,
                             batch_size=5)
    assert listing(tmp_path) == ["cls.meta.json", "cls.npy", "static.meta.json", "static.npy"]
    for pooling, path in targets.items():
        file = EmbeddingFile(path).verify()
        np.testing.assert_array_equal(file.read(0, len(file)), expected[pooling])
        np.testing.assert_array_equal(np.load(path), expected[pooling])  # a plain .npy
        meta = read_meta(path)
        assert meta == {**metas[pooling], "sha256": meta["sha256"]}
        assert meta["count"] == 100 and meta["precision"] == "float32"
        rows = np.array([99, 3, 3, 50])
        np.testing.assert_array_equal(file.take(rows), expected[pooling][rows])
        blocks = [block for _, block in file.chunks(rows=30)]
        assert [len(b) for b in blocks] == [30, 30, 30, 10]


def test_a_file_corpus_streams_and_hashes_like_its_sentences(tmp_path):
    sentences = salad(50)
    path = tmp_path / "c.txt"
    path.write_text("\ufeff" + "\r\n".join(sentences) + "\r\n", encoding="utf-8")
    corpus, listed = Corpus.from_file(path), Corpus.from_sentences(sentences)
    assert (corpus.count, corpus.sha256) == (listed.count, listed.sha256)
    assert [s for chunk in corpus.chunks(7, 50, 10) for s in chunk] == sentences[7:]
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(BertflowError, match="empty"):
        Corpus.from_file(tmp_path / "empty.txt")


class Crash(Exception):
    pass


def crash_after(encoder, monkeypatch, chunks: int):
    calls = []
    real = type(encoder).encode_chunk

    def encode_chunk(self, sentences, *args, **kwargs):
        calls.append(len(sentences))
        if len(calls) > chunks:
            raise Crash
        return real(self, sentences, *args, **kwargs)

    monkeypatch.setattr(type(encoder), "encode_chunk", encode_chunk)
    return calls


def test_interrupted_write_resumes_where_it_stopped_bit_for_bit(tmp_path, tiny_encoder,
                                                                  small_chunks, monkeypatch):
    sentences = salad(150)
    corpus = Corpus.from_sentences(sentences)
    whole = tmp_path / "whole.npy"
    write_embeddings({"mean": whole}, corpus, tiny_encoder)

    out = tmp_path / "out.npy"
    calls = crash_after(tiny_encoder, monkeypatch, 4)
    with pytest.raises(Crash):
        write_embeddings({"mean": out}, corpus, tiny_encoder)
    assert listing(tmp_path) == ["out.npy.partial", "out.npy.progress-0-of-1.json",
                                 "whole.meta.json", "whole.npy"]
    record = json.loads((tmp_path / "out.npy.progress-0-of-1.json").read_text())
    assert record["done"] == 4 * CHUNK and record["rows"] == [0, 150]

    monkeypatch.undo()
    monkeypatch.setattr(bertflow.encoder, "CHUNK_SIZE", CHUNK)
    monkeypatch.setattr(bertflow.embeddings, "CHUNK_SIZE", CHUNK)
    calls = crash_after(tiny_encoder, monkeypatch, 100)
    write_embeddings({"mean": out}, corpus, tiny_encoder, resume=True)
    assert sum(calls) == 150 - 4 * CHUNK  # only what was missing
    assert out.read_bytes() == whole.read_bytes()
    assert read_meta(out)["sha256"] == read_meta(whole)["sha256"]
    assert listing(tmp_path) == ["out.meta.json", "out.npy", "whole.meta.json", "whole.npy"]
    calls.clear()
    write_embeddings({"mean": out}, corpus, tiny_encoder, resume=True)
    assert calls == []  # complete: nothing to do


def test_resume_refuses_progress_of_another_request(tmp_path, tiny_encoder, small_chunks,
                                                    monkeypatch, tiny_encoder_dir):
    corpus = Corpus.from_sentences(salad(80))
    out = tmp_path / "out.npy"
    crash_after(tiny_encoder, monkeypatch, 2)
    with pytest.raises(Crash):
        write_embeddings({"mean": out}, corpus, tiny_encoder)
    monkeypatch.undo()
    monkeypatch.setattr(bertflow.encoder, "CHUNK_SIZE", CHUNK)
    monkeypatch.setattr(bertflow.embeddings, "CHUNK_SIZE", CHUNK)
    from bertflow import load_encoder

    low = load_encoder(tiny_encoder_dir, device="cpu", dtype="bfloat16")
    for args, message in [
        (({"cls": out}, corpus, tiny_encoder), "pooling mean, not cls"),
        (({"mean": out}, Corpus.from_sentences(salad(80, seed=1)), tiny_encoder),
         "corpus_sha256 "),
        (({"mean": out}, corpus, low), "precision float32, not bfloat16"),
    ]:
        with pytest.raises(BertflowError, match=f"belongs to another run .*{message}"):
            write_embeddings(*args, resume=True)
    with pytest.raises(BertflowError, match="written with batch_size 32, not 3"):
        write_embeddings({"mean": out}, corpus, tiny_encoder, batch_size=3, resume=True)
    record = tmp_path / "out.npy.progress-0-of-1.json"
    record.rename(tmp_path / "out.npy.progress-0-of-2.json")
    with pytest.raises(BertflowError, match="not those of a 1-process run"):
        write_embeddings({"mean": out}, corpus, tiny_encoder, resume=True)
    write_embeddings({"mean": out}, corpus, tiny_encoder)  # afresh: replaces its own leftovers
    assert listing(tmp_path) == ["out.meta.json", "out.npy"]


def test_foreign_files_are_never_replaced(tmp_path, tiny_encoder):
    corpus = Corpus.from_sentences(salad(20))
    mine = tmp_path / "mine.npy"
    np.save(mine, np.ones((2, 2), np.float32))
    with pytest.raises(BertflowError, match="exists and is not bertflow embeddings"):
        write_embeddings({"cls": mine}, corpus, tiny_encoder)
    assert np.load(mine).shape == (2, 2)
    (tmp_path / "out.npy.partial").write_bytes(b"precious")
    with pytest.raises(BertflowError, match="was not left by bertflow"):
        write_embeddings({"cls": tmp_path / "out.npy"}, corpus, tiny_encoder)
    assert (tmp_path / "out.npy.partial").read_bytes() == b"precious"
    (tmp_path / "x.npy.progress-0-of-1.json").write_text('{"format": "mine"}')
    with pytest.raises(BertflowError, match="not a bertflow progress record"):
        write_embeddings({"cls": tmp_path / "x.npy"}, corpus, tiny_encoder)
    assert listing(tmp_path) == ["mine.npy", "out.npy.partial", "x.npy.progress-0-of-1.json"]


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path, tiny_encoder):
    corpus = Corpus.from_sentences(salad(20))
    out = tmp_path / "out.npy"
    output = bertflow.embeddings._Output(out, {}, {"world": 1})
    with output.lock(wait=False), pytest.raises(BertflowError, match="another process is "
                                                                   "writing"):
        write_embeddings({"cls": out}, corpus, tiny_encoder)
    write_embeddings({"cls": out}, corpus, tiny_encoder)
    assert listing(tmp_path) == ["out.meta.json", "out.npy"]


def test_a_sidecar_that_is_not_the_arrays_is_detected(tmp_path, tiny_encoder):
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    write_embeddings({"cls": a}, Corpus.from_sentences(salad(20)), tiny_encoder)
    write_embeddings({"cls": b}, Corpus.from_sentences(salad(20, seed=1)), tiny_encoder)
    meta_path(a).write_text(meta_path(b).read_text())
    with pytest.raises(BertflowError, match="does not describe .*checksum differs"):
        EmbeddingFile(a).verify()


@pytest.mark.parametrize("case,message", [
    ("truncated", "is truncated"),
    ("fortran", None),
    ("float64", None),
])
def test_reader_checks_the_header_and_reads_other_layouts(tmp_path, case, message):
    x = np.arange(60, dtype=np.float64).reshape(12, 5) / 7
    path = tmp_path / "x.npy"
    if case == "truncated":
        np.save(path, x.astype(np.float32))
        path.write_bytes(path.read_bytes()[:-8])
        with pytest.raises(BertflowError, match=message):
            EmbeddingFile(path)
        return
    np.save(path, np.asfortranarray(x) if case == "fortran" else x)
    file = EmbeddingFile(path).verify()
    np.testing.assert_array_equal(file.read(2, 9), x[2:9].astype(np.float32))
    np.testing.assert_array_equal(file.take([11, 0, 4]), x[[11, 0, 4]].astype(np.float32))


SCRIPT = """
import sys
import bertflow.embeddings, bertflow.encoder
bertflow.encoder.CHUNK_SIZE = bertflow.embeddings.CHUNK_SIZE = 16
from bertflow.cli import main
sys.exit(main(sys.argv[1:]))
"""


def encode_command(corpus, out, encoder_dir, *extra):
    return [sys.executable, "-c", SCRIPT, "encode", str(corpus), "--out", str(out), "--encoder",
            str(encoder_dir), "--pooling", "mean", "--no-cache", "--encode-batch-size", "4", *extra]


def test_kill_9_at_random_moments_then_resume_gives_the_same_file(tmp_path, tiny_encoder_dir):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(salad(400)) + "\n")
    whole = tmp_path / "whole" / "e.npy"
    subprocess.run(encode_command(corpus, whole, tiny_encoder_dir), check=True,
                   capture_output=True)
    out = tmp_path / "runs" / "e.npy"
    rng = random.Random(0)
    kills = 0
    for _ in range(6):
        process = subprocess.Popen(encode_command(corpus, out, tiny_encoder_dir, "--resume"),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, 3.0))
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            kills += 1
        process.wait()
    subprocess.run(encode_command(corpus, out, tiny_encoder_dir, "--resume"), check=True,
                   capture_output=True)
    assert kills >= 1
    assert out.read_bytes() == whole.read_bytes()
    assert read_meta(out) == read_meta(whole)
    assert listing(out.parent) == ["e.meta.json", "e.npy"]


def test_full_disk_is_one_line_and_leaves_nothing(tmp_path, tiny_encoder_dir):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(salad(400)) + "\n")
    out = tmp_path / "out" / "e.npy"
    out.parent.mkdir()
    limit = "ulimit -f 8; "  # 8 KiB: the 400 × 16 float32 rows need 25 KiB
    command = " ".join(f"'{a}'" for a in encode_command(corpus, out, tiny_encoder_dir))
    result = subprocess.run(["bash", "-c", limit + command], capture_output=True, text=True,
                            cwd=REPO)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "file too large while preparing" in lines[0], result.stderr
    assert listing(out.parent) == []
