import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import bertflow.embeddings.outputs
import bertflow.embeddings.writer
import bertflow.encoders.encoder
from bertflow import BertflowError
from bertflow.embeddings.file import EmbeddingFile, read_meta
from bertflow.embeddings.writer import write_embeddings
from bertflow.storage.corpus import Corpus
from bertflow.storage.files import meta_path

from ..conftest import REPO, WORDS

CHUNK = 16


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 16 sentences, so that a corpus of a few hundred has many."""
    monkeypatch.setattr(bertflow.encoders.encoder, "CHUNK_SIZE", CHUNK)
    monkeypatch.setattr(bertflow.embeddings.writer, "CHUNK_SIZE", CHUNK)


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
    monkeypatch.setattr(bertflow.encoders.encoder, "CHUNK_SIZE", CHUNK)
    monkeypatch.setattr(bertflow.embeddings.writer, "CHUNK_SIZE", CHUNK)
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
    monkeypatch.setattr(bertflow.encoders.encoder, "CHUNK_SIZE", CHUNK)
    monkeypatch.setattr(bertflow.embeddings.writer, "CHUNK_SIZE", CHUNK)
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
    write_embeddings({"mean": out}, corpus, tiny_encoder, restart=True)  # its own leftovers
    assert listing(tmp_path) == ["out.meta.json", "out.npy"]


def test_foreign_files_are_never_replaced(tmp_path, tiny_encoder):
    corpus = Corpus.from_sentences(salad(20))
    mine = tmp_path / "mine.npy"
    np.save(mine, np.ones((2, 2), np.float32))
    with pytest.raises(BertflowError, match="exists and is not a bertflow output"):
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
    with bertflow.embeddings.outputs.lock(out, wait=False), pytest.raises(
            BertflowError, match="another process is writing"):
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
import bertflow.encoders.encoder, bertflow.embeddings.writer
bertflow.encoders.encoder.CHUNK_SIZE = bertflow.embeddings.writer.CHUNK_SIZE = 16
from bertflow.cli.main import main
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
    assert len(lines) == 1, result.stderr
    assert "file too large (a file size limit) while preparing" in lines[0], result.stderr
    assert listing(out.parent) == []


# Runs `bertflow` and kills it (os._exit(9)) at the point KILL_AT names: "hashing", the first
# block hashed while a file is finished, or MODULE:FUNCTION:NAME:before|after[:N], around the
# Nth (first) call of MODULE.FUNCTION with an argument whose file name matches the regex NAME.
KILLING = """
import hashlib, importlib, os, re, sys
import bertflow.encoders.encoder, bertflow.embeddings.writer
bertflow.encoders.encoder.CHUNK_SIZE = bertflow.embeddings.writer.CHUNK_SIZE = 16
kill = os.environ["KILL_AT"]
if kill == "hashing":
    finishing, real_sha256 = [], hashlib.sha256
    real_finish = bertflow.embeddings.writer._Output.finish
    def finish(self):
        finishing.append(True)
        return real_finish(self)
    class Dying:
        def __init__(self, *data):
            self.inner = real_sha256(*data)
        def update(self, data):
            if finishing:
                os._exit(9)
            self.inner.update(data)
        def __getattr__(self, name):
            return getattr(self.inner, name)
    bertflow.embeddings.writer._Output.finish, hashlib.sha256 = finish, Dying
else:
    module, name, pattern, when, *nth = kill.split(":")
    module, hits = importlib.import_module(module), []
    real = getattr(module, name)
    def dying(*args, **kwargs):
        matched = any(re.fullmatch(pattern, os.path.basename(str(a))) for a in args)
        hits.append(matched)
        hit = matched and sum(hits) == int(nth[0] if nth else 1)
        if hit and when == "before":
            os._exit(9)
        result = real(*args, **kwargs)
        if hit:
            os._exit(9)
        return result
    setattr(module, name, dying)
from bertflow.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def encode_args(corpus, out, encoder_dir, *extra):
    return ["encode", str(corpus), "--out", str(out), "--encoder", str(encoder_dir),
            "--pooling", "mean", "--encode-batch-size", "4", *map(str, extra)]


def killed_at(point, *args):
    result = subprocess.run([sys.executable, "-c", KILLING, *args], capture_output=True,
                            text=True, env={**os.environ, "KILL_AT": point})
    assert result.returncode == 9, result.stderr[-2000:]


def encode_in_process(*args):
    from bertflow.cli.main import main

    assert main(list(args)) == 0


@pytest.fixture
def kill_setup(tmp_path, tiny_encoder_dir, small_chunks):
    """A 40-sentence corpus (3 chunks) and its embeddings written by an uninterrupted run."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(salad(40)) + "\n")
    whole = tmp_path / "whole" / "e.npy"
    encode_in_process(*encode_args(corpus, whole, tiny_encoder_dir, "--no-cache"))
    return corpus, whole


@pytest.mark.parametrize("point", [
    "hashing",
    r"bertflow.embeddings.writer:write_json:e\.meta\.json:before",
    r"bertflow.embeddings.writer:write_json:e\.meta\.json:after",
    r"os:replace:e\.npy:before",
    r"os:replace:e\.npy:after",
])
def test_a_kill_while_finishing_is_finished_by_resume_and_by_the_plain_command(
        tmp_path, tiny_encoder_dir, kill_setup, point):
    import shutil

    corpus, whole = kill_setup
    out = tmp_path / "killed" / "e.npy"
    killed_at(point, *encode_args(corpus, out, tiny_encoder_dir, "--no-cache"))
    for name, extra in (("resumed", ["--resume"]), ("again", [])):
        folder = shutil.copytree(out.parent, tmp_path / name, symlinks=True)
        encode_in_process(*encode_args(corpus, folder / "e.npy", tiny_encoder_dir,
                                       "--no-cache", *extra))
        assert (folder / "e.npy").read_bytes() == whole.read_bytes(), name
        assert read_meta(folder / "e.npy") == read_meta(whole)
        assert listing(folder) == ["e.meta.json", "e.npy"]


@pytest.mark.parametrize("point,cached", [
    (r"bertflow.embeddings.outputs:write_json:mean-.*\.meta\.json:before", False),  # adopt
    (r"os:replace:mean-.*\.npy:after", False),
    (r"bertflow.embeddings.outputs:write_json:e\.meta\.json:before", True),  # from the cache
    (r"os:replace:e\.npy:after", True),
])
def test_a_kill_while_filing_into_or_copying_from_the_cache_wedges_nothing(
        tmp_path, tiny_encoder_dir, tiny_encoder, kill_setup, point, cached):
    from bertflow.embeddings.cache import EmbeddingCache

    corpus, whole = kill_setup
    cache, out = tmp_path / "cache", tmp_path / "killed" / "e.npy"
    out.parent.mkdir()
    if cached:
        encode_in_process(*encode_args(corpus, tmp_path / "first.npy", tiny_encoder_dir,
                                       "--cache", cache))
    killed_at(point, *encode_args(corpus, out, tiny_encoder_dir, "--cache", cache))
    [x] = EmbeddingCache(cache).files(Corpus.from_file(corpus), tiny_encoder, "mean",
                                      batch_size=4).values()
    assert x.path.read_bytes() == whole.read_bytes()
    for name in ("other.npy", "killed/e.npy"):
        encode_in_process(*encode_args(corpus, tmp_path / name, tiny_encoder_dir, "--cache",
                                       cache))
        assert (tmp_path / name).read_bytes() == whole.read_bytes()
        assert read_meta(tmp_path / name) == read_meta(whole)
    assert listing(out.parent) == ["e.meta.json", "e.npy"]
    # the entry, and the empty lock that a kill while filing it leaves
    assert len([name for name in listing(cache) if not name.endswith(".lock")]) == 2


def snapshot(folder):
    """Every path under `folder` with its link target or its bytes."""
    return {str(p.relative_to(folder)): os.readlink(p) if p.is_symlink() else
            (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("name,target", [
    ("e.npy", "elsewhere/real.npy"),  # embeddings elsewhere, with a sidecar copied beside
    ("e.npy", "elsewhere/missing.npy"),  # dangling
    ("e.meta.json", "elsewhere/real.meta.json"),
    ("e.npy.partial", "elsewhere/file"),
    ("e.npy.progress-0-of-1.json", "elsewhere/record.json"),
    (".e.npy.lock", "elsewhere/lock"),
])
def test_encode_refuses_a_symbolic_link_at_any_path_it_writes_before_any_work(
        tmp_path, capsys, tiny_encoder_dir, small_chunks, name, target):
    from bertflow.cli.main import main

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(salad(40)) + "\n")
    real = tmp_path / "elsewhere" / "real.npy"
    encode_in_process(*encode_args(corpus, real, tiny_encoder_dir, "--no-cache"))
    (tmp_path / "elsewhere" / "file").write_bytes(b"precious")
    out = tmp_path / "out" / "e.npy"
    out.parent.mkdir()
    if name == "e.npy" and target.endswith("real.npy"):
        (out.parent / "e.meta.json").write_bytes(meta_path(real).read_bytes())
    if name.startswith("e.npy.progress"):
        (tmp_path / "elsewhere" / "record.json").write_text(json.dumps(
            {"format": "bertflow-embeddings-progress", "done": 0, "rows": [0, 40]}))
    (out.parent / name).symlink_to(tmp_path / target)
    before = snapshot(tmp_path)
    capsys.readouterr()
    code = main(encode_args(corpus, out, tiny_encoder_dir, "--no-cache"))
    [line] = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and f"{out.parent / name} is a symbolic link" in line, line
    assert snapshot(tmp_path) == before


def test_encode_from_the_cache_makes_the_folders_of_out(tmp_path, tiny_encoder_dir,
                                                         small_chunks):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(salad(40)) + "\n")
    first, nested = tmp_path / "first.npy", tmp_path / "a" / "b" / "c" / "e.npy"
    for out in (first, nested):
        encode_in_process(*encode_args(corpus, out, tiny_encoder_dir, "--cache",
                                       tmp_path / "cache"))
    assert nested.read_bytes() == first.read_bytes()
    assert read_meta(nested) == read_meta(first)
    assert listing(nested.parent) == ["e.meta.json", "e.npy"]


def interrupted(tmp_path, encoder, monkeypatch):
    """A 150-sentence corpus, the file an uninterrupted run writes, and a run of it to
    `out/e.npy` that stopped after 2 chunks."""
    corpus = Corpus.from_sentences(salad(150))
    whole = tmp_path / "whole" / "e.npy"
    write_embeddings({"mean": whole}, corpus, encoder)
    out = tmp_path / "out" / "e.npy"
    real = type(encoder).encode_chunk
    crash_after(encoder, monkeypatch, 2)
    with pytest.raises(Crash):
        write_embeddings({"mean": out}, corpus, encoder)
    monkeypatch.setattr(type(encoder), "encode_chunk", real)
    return corpus, whole, out


def test_a_stopped_run_is_neither_continued_nor_discarded_without_being_asked(
        tmp_path, tiny_encoder, small_chunks, monkeypatch):
    corpus, whole, out = interrupted(tmp_path, tiny_encoder, monkeypatch)
    before = snapshot(out.parent)
    with pytest.raises(BertflowError, match=r"e\.npy holds an interrupted encode of this "
                       r"request \(32 of 150 rows done\); continue it with --resume, or "
                       "discard it with --restart"):
        write_embeddings({"mean": out}, corpus, tiny_encoder)
    with pytest.raises(BertflowError, match=r"an interrupted encode of another request "
                       r"\(pooling mean, not cls; 32 of 150 rows done\); discard it with "
                       "--restart"):
        write_embeddings({"cls": out}, corpus, tiny_encoder)
    assert snapshot(out.parent) == before
    calls = crash_after(tiny_encoder, monkeypatch, 100)
    write_embeddings({"mean": out}, corpus, tiny_encoder, restart=True)
    assert sum(calls) == 150  # from the start
    assert out.read_bytes() == whole.read_bytes()
    assert listing(out.parent) == ["e.meta.json", "e.npy"]


def test_the_command_names_both_ways_on_and_takes_one(tmp_path, capsys, tiny_encoder_dir,
                                                       small_chunks):
    from bertflow.cli.main import main

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(salad(40)) + "\n")
    out = tmp_path / "out" / "e.npy"
    killed_at(r"bertflow.embeddings.writer:write_json:e\.npy\.progress-0-of-1\.json:after:2",
              *encode_args(corpus, out, tiny_encoder_dir, "--no-cache"))
    (out.parent / ".e.npy.lock").unlink()  # the killed run's; a refusal removes it
    before = snapshot(out.parent)
    capsys.readouterr()
    assert main(encode_args(corpus, out, tiny_encoder_dir, "--no-cache")) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "interrupted encode of this request (16 of 40 rows done)" in line
    assert "--resume" in line and "--restart" in line
    assert snapshot(out.parent) == before
    with pytest.raises(SystemExit) as exit:
        main(encode_args(corpus, out, tiny_encoder_dir, "--resume", "--restart"))
    assert exit.value.code == 2
    encode_in_process(*encode_args(corpus, out, tiny_encoder_dir, "--no-cache", "--restart"))
    assert listing(out.parent) == ["e.meta.json", "e.npy"]


@pytest.mark.parametrize("case", ["done edited", "row altered", "no checksum"])
def test_resume_refuses_records_that_disagree_with_the_partial_file(
        tmp_path, tiny_encoder, small_chunks, monkeypatch, case):
    corpus, whole, out = interrupted(tmp_path, tiny_encoder, monkeypatch)
    record, partial = out.parent / "e.npy.progress-0-of-1.json", out.parent / "e.npy.partial"
    value = json.loads(record.read_text())
    if case == "done edited":  # as if every row were in
        record.write_text(json.dumps({**value, "done": 150}))
        message = "does not agree with .*e.npy.partial: rows 0 to 150"
    elif case == "row altered":
        data = bytearray(partial.read_bytes())
        data[-150 * 16 * 4 + 20 * 16 * 4] ^= 1  # row 20, among the 32 done
        partial.write_bytes(bytes(data))
        message = "does not agree with .*e.npy.partial: rows 0 to 32"
    else:
        record.write_text(json.dumps({k: v for k, v in value.items() if k != "rows_sha256"}))
        message = "is malformed"
    before = snapshot(out.parent)
    with pytest.raises(BertflowError, match=f"{record}.*{message}.*start afresh with "
                                            "--restart"):
        write_embeddings({"mean": out}, corpus, tiny_encoder, resume=True)
    assert snapshot(out.parent) == before
    write_embeddings({"mean": out}, corpus, tiny_encoder, restart=True)
    assert out.read_bytes() == whole.read_bytes()


def test_an_output_a_kill_left_a_chunk_ahead_keeps_its_rows(tmp_path, tiny_encoder,
                                                            small_chunks, monkeypatch):
    corpus = Corpus.from_sentences(salad(150))
    targets = {"mean": tmp_path / "mean.npy", "cls": tmp_path / "cls.npy"}
    wholes = {p: tmp_path / "whole" / f"{p}.npy" for p in targets}
    write_embeddings(wholes, corpus, tiny_encoder)
    real = bertflow.embeddings.writer._Output.record

    def record(self, rank, done, checksum):  # the kill comes between the two records
        if done == 3 * CHUNK and self.path.name == "cls.npy":
            raise Crash
        real(self, rank, done, checksum)

    monkeypatch.setattr(bertflow.embeddings.writer._Output, "record", record)
    with pytest.raises(Crash):
        write_embeddings(targets, corpus, tiny_encoder)
    monkeypatch.setattr(bertflow.embeddings.writer._Output, "record", real)
    done = {p: json.loads(Path(f"{t}.progress-0-of-1.json").read_text())["done"]
            for p, t in targets.items()}
    assert done == {"mean": 3 * CHUNK, "cls": 2 * CHUNK}
    write_embeddings(targets, corpus, tiny_encoder, resume=True)
    for p, path in targets.items():
        assert path.read_bytes() == wholes[p].read_bytes()


def test_a_corpus_error_names_the_path_given(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(BertflowError, match=f"^{tmp_path / 'empty.txt'} is empty"):
        Corpus.from_file(tmp_path / "empty.txt")


def refused(capsys, *args) -> str:
    """The one line a command that exits 1 writes."""
    from bertflow.cli.main import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and not out, (code, out, err)
    return lines[0]


@pytest.fixture
def cached_setup(tmp_path, tiny_encoder_dir, kill_setup):
    """`kill_setup` with the embeddings of its corpus in the cache `tmp_path / "cache"`."""
    corpus, whole = kill_setup
    encode_in_process(*encode_args(corpus, tmp_path / "first.npy", tiny_encoder_dir, "--cache",
                                   tmp_path / "cache"))
    return corpus, whole, tmp_path / "cache"


def test_encode_from_the_cache_waits_its_turn_at_the_writers_lock(
        tmp_path, capsys, tiny_encoder_dir, cached_setup):
    from bertflow.embeddings.outputs import lock

    corpus, whole, cache = cached_setup
    out = tmp_path / "out" / "e.npy"
    with lock(out, wait=False):  # another encode (or transform) of the same --out
        line = refused(capsys, *encode_args(corpus, out, tiny_encoder_dir, "--cache", cache))
        assert f"another process is writing {out}" in line
        assert listing(out.parent) == [".e.npy.lock"]
    encode_in_process(*encode_args(corpus, out, tiny_encoder_dir, "--cache", cache))
    assert out.read_bytes() == whole.read_bytes()
    assert listing(out.parent) == ["e.meta.json", "e.npy"]


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_encode_from_the_cache_takes_a_stopped_run_as_encoding_would(
        tmp_path, capsys, tiny_encoder_dir, cached_setup, pooling):
    """Refused without --resume or --restart; with either, the cache's copy finishes the job
    and the stopped run's files go (with --resume, only a stopped run of this request's)."""
    import shutil

    corpus, whole, cache = cached_setup
    out = tmp_path / "out" / "e.npy"
    killed_at(r"bertflow.embeddings.writer:write_json:e\.npy\.progress-0-of-1\.json:after:2",
              *encode_args(corpus, out, tiny_encoder_dir, "--no-cache")[:-3], "--pooling",
              pooling, "--encode-batch-size", "4")
    (out.parent / ".e.npy.lock").unlink()  # the killed run's
    before = snapshot(out.parent)
    line = refused(capsys, *encode_args(corpus, out, tiny_encoder_dir, "--cache", cache))
    assert "interrupted encode" in line and "--resume" in line and "--restart" in line, line
    assert snapshot(out.parent) == before
    for flag in ("--resume", "--restart"):
        folder = shutil.copytree(out.parent, tmp_path / flag, symlinks=True)
        args = encode_args(corpus, folder / "e.npy", tiny_encoder_dir, "--cache", cache, flag)
        if flag == "--resume" and pooling != "mean":
            assert "belongs to another run (pooling cls, not mean)" in refused(capsys, *args)
            assert snapshot(folder) == before
            continue
        encode_in_process(*args)
        assert "from the cache" in capsys.readouterr().out
        assert (folder / "e.npy").read_bytes() == whole.read_bytes()
        assert read_meta(folder / "e.npy") == read_meta(whole)
        assert listing(folder) == ["e.meta.json", "e.npy"]


def test_a_file_made_at_out_while_encoding_is_not_replaced(tmp_path, capsys, tiny_encoder_dir,
                                                           kill_setup, monkeypatch):
    """--out is checked again just before the finished file takes its place."""
    corpus, whole = kill_setup
    out = tmp_path / "out" / "e.npy"
    mine = np.arange(6, dtype=np.float32).reshape(2, 3)
    real = bertflow.embeddings.writer.sha256_file

    def meanwhile(path):  # as the finished rows are hashed, a user saves a file at --out
        if not out.exists():
            np.save(out, mine)
        return real(path)

    monkeypatch.setattr(bertflow.embeddings.writer, "sha256_file", meanwhile)
    line = refused(capsys, *encode_args(corpus, out, tiny_encoder_dir, "--no-cache"))
    assert f"{out} exists and is not a bertflow output" in line, line
    np.testing.assert_array_equal(np.load(out), mine)
    monkeypatch.setattr(bertflow.embeddings.writer, "sha256_file", real)
    out.unlink()  # the user moves it away: the run, every row in, is finished
    encode_in_process(*encode_args(corpus, out, tiny_encoder_dir, "--no-cache"))
    assert out.read_bytes() == whole.read_bytes()
    assert listing(out.parent) == ["e.meta.json", "e.npy"]


def test_a_file_made_at_out_while_copying_from_the_cache_is_not_replaced(
        tmp_path, capsys, tiny_encoder_dir, cached_setup, monkeypatch):
    import contextlib

    corpus, whole, cache = cached_setup
    out = tmp_path / "out" / "e.npy"
    (tmp_path / "out").mkdir()
    real = bertflow.embeddings.outputs.atomic_file

    @contextlib.contextmanager
    def meanwhile(path, *args, **kwargs):
        with real(path, *args, **kwargs) as temporary:
            if path == out:
                meta_path(out).write_text('{"mine": true}\n')
            yield temporary

    monkeypatch.setattr(bertflow.embeddings.outputs, "atomic_file", meanwhile)
    line = refused(capsys, *encode_args(corpus, out, tiny_encoder_dir, "--cache", cache))
    assert f"{meta_path(out)} exists and is not a bertflow sidecar" in line, line
    assert listing(out.parent) == ["e.meta.json"]
    assert meta_path(out).read_text() == '{"mine": true}\n'


@pytest.mark.parametrize("command", ["encode", "encode --no-cache", "fit", "index"])
def test_a_max_length_beyond_the_encoders_positions_is_refused_before_any_work(
        tmp_path, capsys, tiny_encoder_dir, kill_setup, command):
    corpus, _ = kill_setup
    name, *extra = command.split()
    out = tmp_path / "out" / ("e.npy" if name == "encode" else "h")
    (tmp_path / "out").mkdir()
    before = snapshot(tmp_path)
    cache = extra or ["--cache", tmp_path / "cache"]  # --no-cache, or a cache
    line = refused(capsys, name, corpus, "--out", out, "--encoder", tiny_encoder_dir, *cache,
                   "--max-length", 100000)
    assert line.endswith("max_length 100000 is more than encoder tiny-bert0 takes: at most "
                         "128 tokens"), line
    assert snapshot(tmp_path) == before


def test_the_lock_never_follows_a_link_nor_removes_what_bertflow_did_not_make(tmp_path):
    from bertflow.embeddings.outputs import lock as writer_lock

    out, lock = tmp_path / "z.npy", tmp_path / ".z.npy.lock"
    (tmp_path / "precious.txt").write_text("mine\n")
    for kind in ("link", "dangling link", "file", "folder"):
        if kind == "link":
            lock.symlink_to("precious.txt")
        elif kind == "dangling link":
            lock.symlink_to("nowhere")
        elif kind == "file":
            lock.write_text("mine\n")
        else:
            lock.mkdir()
        before = snapshot(tmp_path)
        with pytest.raises(BertflowError, match=f"^{lock} is (a symbolic link|not a lock "
                                                "bertflow made)"), writer_lock(out, wait=False):
            pass
        assert snapshot(tmp_path) == before, kind
        lock.rmdir() if kind == "folder" else lock.unlink()
    with writer_lock(out, wait=False):  # another lock takes its place meanwhile: it stays
        lock.unlink()
        lock.write_bytes(b"")
    assert lock.exists()
    with writer_lock(out, wait=False):  # an empty lock a killed writer left is taken over
        pass
    assert not lock.exists()


def test_an_input_at_the_lock_path_is_refused_and_left_whole(tmp_path, capsys,
                                                            tiny_encoder_dir, tiny_encoder):
    from ..conftest import fit_tiny_head

    corpus = tmp_path / ".p.npy.lock"
    corpus.write_text("\n".join(salad(20)) + "\n")
    before = snapshot(tmp_path)
    line = refused(capsys, "encode", corpus, "--out", tmp_path / "p.npy", "--encoder",
                   tiny_encoder_dir, "--no-cache")
    assert f"{corpus} is not a lock bertflow made" in line
    fit_tiny_head(tiny_encoder, "mean").save(tmp_path / "head")
    before = snapshot(tmp_path)
    line = refused(capsys, "transform", "--head", tmp_path / "head", "--sentences", corpus,
                   "--encoder", tiny_encoder_dir, "--out", tmp_path / "p.npy")
    assert f"{corpus} is not a lock bertflow made" in line
    assert snapshot(tmp_path) == before


def test_encode_replaces_either_kind_of_bertflow_output_and_names_a_foreign_sidecar(
        tmp_path, capsys, tiny_encoder_dir, tiny_encoder, kill_setup):
    from ..conftest import fit_tiny_head

    corpus, whole = kill_setup
    fit_tiny_head(tiny_encoder, "mean", max_length=128).save(tmp_path / "head")
    out = tmp_path / "zt.npy"
    encode_in_process("transform", "--head", str(tmp_path / "head"), "--embeddings",
                      str(whole), "--out", str(out))
    assert json.loads(meta_path(out).read_text())["format"] == "bertflow-transformed"
    encode_in_process(*encode_args(corpus, out, tiny_encoder_dir, "--no-cache"))
    assert out.read_bytes() == whole.read_bytes() and read_meta(out) == read_meta(whole)
    for sidecar in ('{"format": "mine"}', "not json"):
        meta_path(out).write_text(sidecar)
        line = refused(capsys, *encode_args(corpus, out, tiny_encoder_dir, "--no-cache"))
        assert line.endswith(f"{meta_path(out)} exists and is not a bertflow sidecar; not "
                             "replacing it nor zt.npy"), line


def test_the_locks_of_several_outputs_are_taken_in_the_order_of_their_paths(
        tmp_path, tiny_encoder, monkeypatch):
    """Two writers waiting for the same outputs, asked for in other orders, never each hold a
    lock that the other waits for."""
    taken, lock = [], bertflow.embeddings.writer.lock
    monkeypatch.setattr(bertflow.embeddings.writer, "lock",
                        lambda path, wait: taken.append(path.name) or lock(path, wait))
    write_embeddings({"mean": tmp_path / "b.npy", "cls": tmp_path / "a.npy"},
                     Corpus.from_sentences(salad(5)), tiny_encoder)
    assert taken == ["a.npy", "b.npy"]


def test_embeddings_without_a_sidecar_are_read_once_and_named_by_the_files_sha256(
        tmp_path, monkeypatch):
    """Their digest is `verify`'s, where it hashed every byte of the file; else the file's."""
    import hashlib

    import bertflow.embeddings.file
    from bertflow.embeddings.file import open_embeddings

    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    np.save(tmp_path / "c.npy", x)
    np.save(tmp_path / "f.npy", np.asfortranarray(x))
    np.save(tmp_path / "t.npy", x)
    with open(tmp_path / "t.npy", "ab") as f:
        f.write(b"more")  # bytes after the rows
    hashed, sha256_file = [], bertflow.embeddings.file.sha256_file
    monkeypatch.setattr(bertflow.embeddings.file, "sha256_file",
                        lambda path: hashed.append(path.name) or sha256_file(path))
    for name in ("c.npy", "f.npy", "t.npy"):
        origin = open_embeddings(tmp_path / name, pooling="cls")[1]
        digest = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
        assert origin["data"] == origin["corpus"]["npy_sha256"] == digest
    assert hashed == ["f.npy", "t.npy"]


@pytest.mark.parametrize("order", ["C", "F"])
def test_a_verified_file_loads_the_rows_it_verified_after_its_path_is_replaced(tmp_path, order):
    path, other = tmp_path / "emb.npy", tmp_path / "other.npy"
    rows = np.asarray(np.arange(12, dtype=np.float32).reshape(4, 3), order=order)
    np.save(path, rows)
    np.save(other, rows + 100)
    file = EmbeddingFile(path).verify()
    os.replace(other, path)
    np.testing.assert_array_equal(file.load(), rows)


def test_a_run_that_wrote_no_row_leaves_nothing_in_the_way(tmp_path, tiny_encoder,
                                                          tiny_encoder_dir, kill_setup,
                                                          small_chunks, monkeypatch):
    """A run that fails before its first row removes its partial file and records; one killed
    then leaves a partial file with nothing to continue, which a run with other settings
    replaces without --restart."""
    corpus, whole = kill_setup
    out, real = tmp_path / "out" / "e.npy", type(tiny_encoder).encode_chunk
    crash_after(tiny_encoder, monkeypatch, 0)
    with pytest.raises(Crash):
        write_embeddings({"cls": out}, Corpus.from_file(corpus), tiny_encoder)
    monkeypatch.setattr(type(tiny_encoder), "encode_chunk", real)
    assert listing(out.parent) == []
    killed_at(r"bertflow.embeddings.writer:fsync:out:after",
              *encode_args(corpus, out, tiny_encoder_dir, "--no-cache", "--pooling", "cls"))
    (out.parent / ".e.npy.lock").unlink()  # the killed run's
    assert listing(out.parent) == ["e.npy.partial", "e.npy.progress-0-of-1.json"]
    encode_in_process(*encode_args(corpus, out, tiny_encoder_dir, "--no-cache"))
    assert out.read_bytes() == whole.read_bytes()
    assert listing(out.parent) == ["e.meta.json", "e.npy"]
