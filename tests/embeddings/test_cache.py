import json

import numpy as np
import pytest

from bertflow.embeddings.cache import EmbeddingCache
from bertflow.embeddings.file import embeddings_meta
from bertflow.errors import BertflowError
from bertflow.storage.corpus import Corpus, corpus_sha256
from bertflow.storage.files import meta_path

from ..conftest import SENTENCES


class Counting:
    """Wraps an encoder and records the poolings of each chunk it encodes."""

    def __init__(self, encoder):
        self.inner, self.calls = encoder, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode_chunk(self, sentences, poolings, *args, **kwargs):
        self.calls.append(list(poolings))
        return self.inner.encode_chunk(sentences, poolings, *args, **kwargs)


@pytest.fixture
def counting(tiny_encoder):
    return Counting(tiny_encoder)


def entry(cache, encoder):
    """Where `cache` keeps the cls embeddings of SENTENCES."""
    return cache.path(embeddings_meta(Corpus.from_sentences(SENTENCES), encoder, "cls", 128))


def test_same_request_is_read_back_not_encoded_again(tmp_path, counting):
    cache = EmbeddingCache(tmp_path)
    first = cache.encode(SENTENCES, counting, "cls")
    again = cache.encode(SENTENCES, counting, "cls")
    assert counting.calls == [["cls"]]
    assert isinstance(again, np.memmap)
    np.testing.assert_array_equal(first, again)
    meta = json.loads(meta_path(entry(cache, counting)).read_text())
    assert meta["pooling"] == "cls" and meta["count"] == len(SENTENCES)
    assert meta["dim"] == 16 and meta["max_length"] == 128
    assert meta["corpus_sha256"] == corpus_sha256(SENTENCES)
    assert meta["encoder"] == counting.id.to_dict()


def test_other_settings_never_reuse_a_cached_file(tmp_path, counting, other_encoder_dir):
    from bertflow import load_encoder

    cache = EmbeddingCache(tmp_path)
    cache.encode(SENTENCES, counting, "cls")
    cache.encode(SENTENCES, counting, "mean")
    cache.encode(SENTENCES, counting, "cls", max_length=8)
    cache.encode(SENTENCES[:-1], counting, "cls")
    assert len(counting.calls) == 4
    other = Counting(load_encoder(other_encoder_dir))
    x = cache.encode(SENTENCES, other, "cls")
    assert other.calls == [["cls"]]
    np.testing.assert_allclose(x, other.inner.encode(SENTENCES, "cls"), atol=1e-6)


def test_only_missing_poolings_are_encoded(tmp_path, counting):
    cache = EmbeddingCache(tmp_path)
    cache.encode(SENTENCES, counting, "cls")
    both = cache.encode(SENTENCES, counting, ["cls", "static"])
    assert counting.calls == [["cls"], ["static"]]
    assert set(both) == {"cls", "static"}


def test_a_tampered_cache_entry_is_encoded_again(tmp_path, counting):
    cache = EmbeddingCache(tmp_path)
    good = cache.encode(SENTENCES, counting, "cls")
    path = entry(cache, counting)
    meta = json.loads(meta_path(path).read_text())
    meta_path(path).write_text(json.dumps({**meta, "pooling": "mean"}))
    again = cache.encode(SENTENCES, counting, "cls")
    assert len(counting.calls) == 2
    np.testing.assert_allclose(again, good, atol=1e-6)
    np.save(path, np.zeros((3, 16), np.float32))  # wrong shape under a good sidecar
    cache.encode(SENTENCES, counting, "cls")
    assert len(counting.calls) == 3
    rows = np.load(path)
    rows[: len(rows) // 2] = 0  # half the rows zeroed: same size, other checksum
    np.save(path, rows)
    np.testing.assert_allclose(cache.encode(SENTENCES, counting, "cls"), good, atol=1e-6)
    assert len(counting.calls) == 4


def test_corpus_hash_equals_the_file_hash(tmp_path):
    import hashlib

    path = tmp_path / "c.txt"
    path.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    assert corpus_sha256(SENTENCES) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_interrupted_entry_that_cannot_be_continued_is_encoded_afresh(
        tmp_path, counting, monkeypatch):
    """The cache's files are its own: an interrupted entry is continued where it can be (same
    settings, rows that agree with its record), else encoded again; neither wedges the entry."""
    import bertflow.embeddings.writer
    import bertflow.encoders.encoder
    from bertflow.embeddings.writer import write_embeddings

    monkeypatch.setattr(bertflow.encoders.encoder, "CHUNK_SIZE", 2)
    monkeypatch.setattr(bertflow.embeddings.writer, "CHUNK_SIZE", 2)
    cache = EmbeddingCache(tmp_path / "cache")
    whole = EmbeddingCache(tmp_path / "whole").encode(SENTENCES, counting, "cls",
                                                      batch_size=4)
    path = entry(cache, counting)

    def interrupt(batch_size):
        real, calls = Counting.encode_chunk, []

        def encode_chunk(self, *args, **kwargs):
            calls.append(1)
            if len(calls) > 2:
                raise KeyboardInterrupt
            return real(self, *args, **kwargs)

        monkeypatch.setattr(Counting, "encode_chunk", encode_chunk)
        with pytest.raises(KeyboardInterrupt):
            write_embeddings({"cls": path}, Corpus.from_sentences(SENTENCES), counting,
                             batch_size=batch_size)
        monkeypatch.setattr(Counting, "encode_chunk", real)
        assert path.with_name(path.name + ".partial").exists()

    interrupt(batch_size=2)  # another encoder batch size: rows may differ in the last bits
    np.testing.assert_array_equal(cache.encode(SENTENCES, counting, "cls", batch_size=4), whole)

    path.unlink()
    meta_path(path).unlink()
    interrupt(batch_size=4)
    record = path.with_name(path.name + ".progress-0-of-1.json")
    record.write_text(json.dumps({**json.loads(record.read_text()), "done": 6}))  # lies
    counting.calls.clear()
    np.testing.assert_array_equal(cache.encode(SENTENCES, counting, "cls", batch_size=4), whole)
    assert len(counting.calls) == 4  # every chunk again

    path.unlink()
    meta_path(path).unlink()
    interrupt(batch_size=4)
    counting.calls.clear()
    np.testing.assert_array_equal(cache.encode(SENTENCES, counting, "cls", batch_size=4), whole)
    assert len(counting.calls) == 2  # continued: only the chunks that were missing


def test_the_same_weights_loaded_from_a_copy_of_their_folder_reuse_what_they_made(
        tmp_path, counting, tiny_encoder_dir):
    """An encoder is its weights (their fingerprint), not where they were loaded from: the
    cache's entry is read back, by a reader and by a writer that waited at its lock, and
    `encode --resume` keeps a finished output."""
    import shutil

    from bertflow import load_encoder
    from bertflow.embeddings.writer import write_embeddings

    corpus, cache = Corpus.from_sentences(SENTENCES), EmbeddingCache(tmp_path / "cache")
    out = tmp_path / "out.npy"
    cache.encode(SENTENCES, counting, "cls")
    write_embeddings({"cls": out}, corpus, counting)
    made = {p: p.read_bytes() for npy in (entry(cache, counting), out)
            for p in (npy, meta_path(npy))}
    copy = Counting(load_encoder(shutil.copytree(tiny_encoder_dir, tmp_path / "copy")))
    assert copy.id.fingerprint == counting.id.fingerprint
    assert copy.id.to_dict() != counting.id.to_dict()  # another name and source
    cache.encode(SENTENCES, copy, "cls")
    write_embeddings({"cls": entry(cache, copy)}, corpus, copy, resume=True, restart=True,
                     wait=True)  # the cache's way, once the lock is its turn
    write_embeddings({"cls": out}, corpus, copy, resume=True)
    assert copy.calls == []
    assert {p: p.read_bytes() for p in made} == made


def test_encode_to_refuses_a_bad_destination_before_making_anything(tmp_path, tiny_encoder):
    from bertflow.embeddings.cache import encode_to

    out = tmp_path / "new" / "e.txt"
    with pytest.raises(BertflowError, match=f"^--out {out} must end in .npy$"):
        encode_to(out, Corpus.from_sentences(SENTENCES), tiny_encoder, "cls")
    assert list(tmp_path.iterdir()) == []


def test_a_corpus_rewritten_after_it_was_hashed_is_not_cached_under_the_old_hash(
        tmp_path, counting):
    """The corpus is hashed in one pass and read again to encode: rows that changed between the
    two are refused, not filed under the old text's digest."""
    from bertflow.storage.corpus import read_corpus

    path = tmp_path / "corpus.jsonl"

    def write(texts):
        path.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n"
                                for i, t in enumerate(texts)), encoding="utf-8")

    write(SENTENCES)
    corpus = read_corpus(path)
    write(SENTENCES[:4] + [s.upper() for s in SENTENCES[4:]])  # in place, after the hash
    cache = EmbeddingCache(tmp_path / "cache")
    with pytest.raises(BertflowError, match="changed while it was being read"):
        cache.files(corpus, counting, "cls")
    assert cache.get(embeddings_meta(corpus, counting, "cls", 128)) is None
    assert not list((tmp_path / "cache").glob("*.meta.json"))


@pytest.mark.parametrize("debris", ["damaged sidecar", "no sidecar", "foreign partial",
                                    "foreign record"])
def test_a_cache_entry_that_fails_its_check_is_replaced(tmp_path, counting, debris):
    """The cache folder is bertflow's own: what fails its check there is encoded again, never
    a refusal that blocks every later command on that corpus."""
    cache = EmbeddingCache(tmp_path)
    good = np.array(cache.encode(SENTENCES, counting, "cls"))
    path = entry(cache, counting)
    if debris == "damaged sidecar":
        meta_path(path).write_text("{")
    elif debris == "no sidecar":
        meta_path(path).unlink()
    else:
        path.unlink()
        meta_path(path).unlink()
        name = ".partial" if debris == "foreign partial" else ".progress-0-of-1.json"
        path.with_name(path.name + name).write_text("not ours")
    np.testing.assert_array_equal(cache.encode(SENTENCES, counting, "cls"), good)
    assert len(counting.calls) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [meta_path(path).name, path.name]
