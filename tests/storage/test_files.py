import sys
from pathlib import Path

import numpy as np
import pytest

from bertflow import BertflowError
from bertflow.embeddings.file import EmbeddingFile
from bertflow.storage.files import atomic_directory, meta_path, read_json, read_sentences


def test_read_sentences(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes("\ufeffone sentence\r\ntwo – ünïcode\nthree\n".encode())
    assert read_sentences(path) == ["one sentence", "two – ünïcode", "three"]
    path.write_text("no final newline")
    assert read_sentences(path) == ["no final newline"]


@pytest.mark.parametrize(
    "content,message",
    [
        (b"", "is empty"),
        (b"\n", "line 1 is blank"),
        (b"fine\n\nfine\n", "line 2 is blank"),
        (b"ok\n\xff\xfe bad\n", "not UTF-8 text \\(bad byte on line 2\\)"),
    ],
)
def test_bad_corpora_are_refused(tmp_path, content, message):
    path = tmp_path / "c.txt"
    path.write_bytes(content)
    with pytest.raises(BertflowError, match=message):
        read_sentences(path)


def test_json_holding_an_integer_past_pythons_limit_is_refused_in_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"dim": ' + "3" * 5001 + "}")
    with pytest.raises(BertflowError) as caught:
        read_json(path)
    assert str(caught.value) == (f"{path} holds an integer of over "
                                 f"{sys.get_int_max_str_digits()} digits")


def test_missing_corpus_and_folder(tmp_path):
    with pytest.raises(BertflowError, match="no such file"):
        read_sentences(tmp_path / "nope.txt")
    with pytest.raises(BertflowError, match="is not a file"):
        read_sentences(tmp_path)


def _load(path):
    with EmbeddingFile(path) as file:
        return file.verify().load()


def test_embeddings_load_memory_mapped(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.save(tmp_path / "e.npy", x)
    loaded = _load(tmp_path / "e.npy")
    assert isinstance(loaded, np.memmap) and loaded.dtype == np.float32
    np.testing.assert_array_equal(loaded, x)
    assert meta_path(tmp_path / "e.npy").name == "e.meta.json"


@pytest.mark.parametrize(
    "array,message",
    [
        (np.zeros(5, np.float32), "expected \\(sentences, dim\\)"),
        (np.zeros((0, 4), np.float32), "is empty"),
        (np.zeros((3, 4), np.int64), "dtype int64"),
        (np.array([[1.0, np.nan], [0.0, 1.0]], np.float32), "NaN values \\(first in row 0\\)"),
        (np.array([[1.0, 2.0], [np.inf, 1.0]], np.float32), "inf values \\(first in row 1\\)"),
    ],
)
def test_bad_embeddings_are_refused(tmp_path, array, message):
    np.save(tmp_path / "e.npy", array)
    with pytest.raises(BertflowError, match=message):
        _load(tmp_path / "e.npy")


def test_unreadable_embeddings_are_refused(tmp_path):
    (tmp_path / "e.npy").write_bytes(b"not a numpy file")
    with pytest.raises(BertflowError, match="not a readable .npy"):
        _load(tmp_path / "e.npy")
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object))
    with pytest.raises(BertflowError, match="not a readable .npy"):
        _load(tmp_path / "o.npy")
    with pytest.raises(BertflowError, match="no such file"):
        _load(tmp_path / "missing.npy")


def test_atomic_directory_swaps_or_leaves_old(tmp_path):
    target = tmp_path / "out"
    with atomic_directory(target) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(ZeroDivisionError), atomic_directory(target) as tmp:
        (tmp / "a").write_text("2")
        raise ZeroDivisionError
    assert (target / "a").read_text() == "1"
    with atomic_directory(target) as tmp:
        (tmp / "b").write_text("3")
    assert [p.name for p in target.iterdir()] == ["b"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_splits_sentences(tmp_path, ending):
    from bertflow.storage.corpus import Corpus
    from bertflow.storage.files import iter_sentences

    path = tmp_path / "c.txt"
    for final in (ending, b""):
        path.write_bytes(b"\xef\xbb\xbfa" + ending + b"b \xc3\xbc" + ending + b"c" + final)
        assert read_sentences(path) == ["a", "b ü", "c"]
        assert list(iter_sentences(path, start=1)) == ["b ü", "c"]
    lf = tmp_path / "lf.txt"
    lf.write_bytes(b"a\nb \xc3\xbc\nc\n")
    assert Corpus.from_file(path).sha256 == Corpus.from_file(lf).sha256


@pytest.mark.parametrize(
    "content,message",
    [
        (b"a\r\rb\r", "line 2 is blank"),
        (b"a\r\r\nb\n", "line 2 is blank"),
        (b"a\rb\r\xff\rc", "bad byte on line 3"),
        (b"a\r\nb\n\rc", "line 3 is blank"),
    ],
)
def test_cr_endings_keep_line_numbers_in_errors(tmp_path, content, message):
    path = tmp_path / "c.txt"
    path.write_bytes(content)
    with pytest.raises(BertflowError, match=message):
        read_sentences(path)


def test_iter_sentences_stays_lazy_over_cr_lines_across_blocks(tmp_path, monkeypatch):
    import io

    import bertflow.storage.files
    from bertflow.storage.files import iter_sentences

    monkeypatch.setattr(bertflow.storage.files, "_BLOCK_SIZE", 3)  # a CRLF split across blocks
    path = tmp_path / "c.txt"
    lines = [f"sentence {i}" for i in range(50)]
    path.write_bytes("\r\n".join(lines).encode() + b"\r\n")
    assert list(iter_sentences(path)) == lines
    path.write_bytes("\r".join(lines).encode())
    assert list(iter_sentences(path, start=48)) == lines[48:]
    f = io.BytesIO(path.read_bytes())
    assert next(bertflow.storage.files._raw_lines(f)) == b"sentence 0"
    assert f.tell() < 20  # a CR-only file is read a block at a time, not whole


def flushes(monkeypatch, look):
    """Record each os.fsync as (the path flushed, what `look()` says at that moment)."""
    import os

    synced, real = [], os.fsync

    def fsync(fd):
        synced.append((Path(os.readlink(f"/proc/self/fd/{fd}")), look()))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_a_file_and_its_folder_are_flushed_around_the_rename(tmp_path, monkeypatch):
    from bertflow.storage.files import write_json

    target = tmp_path / "record.json"
    write_json(target, {"done": 1})
    synced = flushes(monkeypatch, lambda: {p.name: p.read_bytes() for p in tmp_path.iterdir()})
    write_json(target, {"done": 2})
    (temporary, before), (folder, after) = synced
    assert temporary.parent == tmp_path and temporary.name.startswith(".record.json.")
    new = target.read_bytes()
    assert before[temporary.name] == new and b'"done": 1' in before["record.json"]
    assert folder == tmp_path and after == {"record.json": new}


def test_a_folder_is_flushed_file_by_file_before_the_swap_and_its_parent_after(
        tmp_path, monkeypatch):
    target = tmp_path / "out"
    synced = flushes(monkeypatch, lambda: (target / "sub" / "weights").exists())
    with atomic_directory(target) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights").write_bytes(b"w" * 100)
        (tmp / "config").write_text("c")
    *inside, (parent, swapped) = synced
    assert {path for path, _ in inside} == {tmp / "config", tmp / "sub" / "weights",
                                            tmp / "sub", tmp}
    assert not any(seen for _, seen in inside)
    assert parent == tmp_path and swapped


def test_atomic_writes_read_the_umask_without_setting_it(tmp_path, monkeypatch):
    """Setting the umask to read it races with other threads (one may create a file meanwhile
    under umask 0, or two leave it at 0): it is read once, at import."""
    import os

    from bertflow.storage.files import atomic_file

    mask = os.umask(0)
    os.umask(mask)

    def umask(value):
        raise AssertionError("os.umask called")

    monkeypatch.setattr(os, "umask", umask)
    with atomic_file(tmp_path / "f") as tmp:
        tmp.write_text("x")
    with atomic_directory(tmp_path / "d") as tmp:
        (tmp / "x").write_text("x")
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o666 & ~mask
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o777 & ~mask


def test_only_an_output_inside_a_grown_folder_is_let_be(tmp_path):
    from bertflow.storage.files import check_outputs

    logs, grows = tmp_path / "logs", {"--logdir": ["--out"]}
    check_outputs({"--logdir": logs, "--out": logs / "head"}, {}, grows=grows)
    for outputs in ({"--logdir": logs, "--out": logs}, {"--out": logs, "--logdir": logs}):
        with pytest.raises(BertflowError, match=r"logs is another output of this command"):
            check_outputs(outputs, {}, grows=grows)
