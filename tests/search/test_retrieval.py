"""FAISS retrieval over transformed embeddings: exactness, kinds, reduction, save/load, the
experiment's retrieval measures on a hand case, refusals and the index/search commands."""

import json
import sys

import numpy as np
import pytest

from bertflow import BertflowError, load_encoder
from bertflow.cli.main import main
from bertflow.data.sts import Pairs
from bertflow.search.index import Hit, Index

from ..conftest import REPO, SENTENCES, WORDS, fit_tiny_head, swap_after


@pytest.fixture(scope="module")
def head(tiny_encoder):
    return fit_tiny_head(tiny_encoder, "mean")


@pytest.fixture(scope="module")
def items():
    rng = np.random.default_rng(5)
    lines = [" ".join(rng.choice(WORDS, size=rng.integers(3, 9))) for _ in range(150)]
    return list(dict.fromkeys(SENTENCES + lines))


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_flat_index_is_exact_cosine_after_the_head(head, tiny_encoder, items):
    index = Index.build(items, tiny_encoder, head=head)
    z = unit(head.encode(items, tiny_encoder))
    queries = items[:5] + ["a dog and a cat"]
    scores, ids = index.search_embeddings(tiny_encoder.encode(queries, "mean"), k=7)
    q = unit(head.transform(tiny_encoder.encode(queries, "mean")))
    cosines = q @ z.T
    expected = np.argsort(-cosines, axis=1, kind="stable")[:, :7]
    np.testing.assert_allclose(scores, np.take_along_axis(cosines, expected, 1), atol=1e-5)
    # the same ranking, up to ties within float error
    np.testing.assert_allclose(np.take_along_axis(cosines, ids, 1),
                               np.take_along_axis(cosines, expected, 1), atol=1e-5)
    assert (ids[:5, 0] == np.arange(5)).all()  # each item finds itself first
    hits = index.search(["a man plays the guitar"], tiny_encoder, k=3)[0]
    assert hits[0] == (pytest.approx(1, abs=1e-5), "a man plays the guitar", 1, "1")
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_hnsw_and_reduced_indexes(head, tiny_encoder, items):
    x = tiny_encoder.encode(items, "mean")
    hnsw = Index.from_embeddings(x, items, head=head, encoder=tiny_encoder.id, pooling="mean",
                                 kind="hnsw")
    assert (hnsw.search_embeddings(x[:20], k=1)[1][:, 0] == np.arange(20)).all()
    small = Index.from_embeddings(x, items, head=head, encoder=tiny_encoder.id,
                                  pooling="mean", dims=4)
    assert small.config["dims"] == 4 and small.faiss_index.d == 16
    # the reduction is the top principal components of the transformed corpus
    z = head.transform(x)
    centred = z - z.mean(0)
    top = np.linalg.svd(centred, full_matrices=False)[2][:4]
    p = unit(centred @ top.T)
    scores, ids = small.search_embeddings(x[:10], k=3)
    np.testing.assert_allclose(scores, np.take_along_axis(p[:10] @ p.T, ids, 1), atol=1e-4)
    with pytest.raises(BertflowError, match="dims must be 16 .all. or between 1 and 16"):
        Index.from_embeddings(x, items, dims=17)
    every = Index.from_embeddings(x[:8], items[:8], dims=16)  # all 16 of 8 rows: no PCA
    assert every.search_embeddings(x[:2], k=1)[1][:, 0].tolist() == [0, 1]


def test_save_load_round_trip(tmp_path, head, tiny_encoder, items):
    index = Index.build(items, tiny_encoder, head=head, kind="hnsw", dims=8)
    index.save(tmp_path / "idx")
    loaded = Index.load(tmp_path / "idx")
    assert loaded.config == index.config and loaded.items == items
    assert loaded.ids == [str(n) for n in range(1, len(items) + 1)]
    queries = ["the cat eats", "a red car"]
    assert loaded.search(queries, tiny_encoder) == index.search(queries, tiny_encoder)


def test_refusals(tmp_path, head, tiny_encoder, items, other_encoder_dir, wide_encoder_dir):
    index = Index.build(items, tiny_encoder, head=head)
    with pytest.raises(BertflowError, match="index was built with encoder"):
        index.search(["a cat"], other_encoder_dir)
    wide = fit_tiny_head(load_encoder(wide_encoder_dir), "mean")
    with pytest.raises(BertflowError, match="24-d.*16-d"):
        Index.build(items, tiny_encoder, head=wide)
    with pytest.raises(BertflowError, match="index expects 16-d"):
        index.search_embeddings(np.zeros((2, 24), np.float32))
    with pytest.raises(BertflowError, match="NaN values"):
        index.search_embeddings(np.full((1, 16), np.nan, np.float32))
    from bertflow.storage.files import sha256_file

    folder = index.save(tmp_path / "idx")
    (folder / "items.json").write_text(json.dumps({"items": items[:-1]}))
    with pytest.raises(BertflowError, match="items.json does not match the checksum"):
        Index.load(folder)
    sums = json.loads((folder / "config.json").read_text())["sha256"]
    edit_config(folder, sha256={**sums, "items.json": sha256_file(folder / "items.json")})
    with pytest.raises(BertflowError, match="does not hold a list of items and their ids"):
        Index.load(folder)
    (folder / "items.json").write_text(json.dumps({"items": items[:-1],
                                                   "ids": ["7"] * (len(items) - 1)}))
    edit_config(folder, sha256={**sums, "items.json": sha256_file(folder / "items.json")})
    with pytest.raises(BertflowError, match="items.json: ids must be unique: '7'"):
        Index.load(folder)
    (folder / "items.json").write_text(json.dumps({"items": items[:-1], "ids": index.ids[:-1]}))
    edit_config(folder, sha256={**sums, "items.json": sha256_file(folder / "items.json")})
    with pytest.raises(BertflowError, match="inconsistent"):
        Index.load(folder)
    (folder / "index.faiss").write_bytes(b"garbage" * 4096)  # as large as its vectors
    edit_config(folder, sha256={"index.faiss": sha256_file(folder / "index.faiss"),
                                "items.json": sha256_file(folder / "items.json")})
    with pytest.raises(BertflowError, match="not a valid FAISS index"):
        Index.load(folder)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("keep")
    with pytest.raises(BertflowError, match="not an index"):
        index.save(tmp_path / "notes")


def test_retrieval_scores_on_a_hand_case():
    """The measures of experiments/retrieval.py (STS pairs as queries)."""
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        from retrieval import relevant_pairs, retrieval_scores
    finally:
        sys.path.remove(str(REPO / "experiments"))
    # four items on a circle; angles make the ranking of each query plain
    items = ["a", "b", "c", "d"]
    angle = np.radians([0, 10, 30, 100])
    x = np.stack([np.cos(angle), np.sin(angle)], 1).astype(np.float32)
    index = Index.from_embeddings(x, items, pooling="mean")
    pairs = Pairs("hand", ["a", "a", "c", "d"], ["b", "c", "d", "b"],
                  np.array([5.0, 3.0, 4.5, 1.0]))
    relevant = relevant_pairs(pairs, threshold=4)
    assert relevant == {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}
    got = retrieval_scores(index, x, relevant)
    # a: b first (rank 1); b: a first (rank 1); c: b, a, d (rank 3); d: c first (rank 1)
    assert got["recall@1"] == pytest.approx(3 / 4)
    assert got["recall@10"] == pytest.approx(1)
    assert got["mrr"] == pytest.approx((1 + 1 + 1 / 3 + 1) / 4)
    assert got["queries"] == 4 and got["candidates"] == 4


def test_index_and_search_commands(tmp_path, capsys, head, tiny_encoder, tiny_encoder_dir,
                                   items):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(items) + "\n")
    head.save(tmp_path / "head")
    assert main(["index", str(corpus), "--out", str(tmp_path / "idx"), "--head",
                 str(tmp_path / "head"), "--encoder", str(tiny_encoder_dir)]) == 0
    assert "mean pooling, with a head" in capsys.readouterr().out
    assert main(["search", "--index", str(tmp_path / "idx"), "--query", "a man plays the guitar",
                 "--top", "2", "--encoder", str(tiny_encoder_dir), "--json"]) == 0
    hit = json.loads(capsys.readouterr().out)
    assert hit["hits"][0]["item"] == "a man plays the guitar" and len(hit["hits"]) == 2
    assert (hit["id"], hit["query"]) == ("1", "a man plays the guitar")
    for h in hit["hits"]:  # a text corpus: the id is the 1-based line each item came from
        assert set(h) == {"id", "score", "item", "line"} and h["id"] == str(h["line"])
        assert corpus.read_text().splitlines()[h["line"] - 1] == h["item"]
    assert main(["search", "--index", str(tmp_path / "idx"), "--query", items[40], "--top", "1",
                 "--encoder", str(tiny_encoder_dir)]) == 0
    query, row = capsys.readouterr().out.splitlines()
    assert query == items[40] and row.split(maxsplit=3) == ["1", row.split()[1], "41", items[40]]
    cache = tmp_path / "cache"  # the queries' embeddings are kept once, then read
    search = ["search", "--index", str(tmp_path / "idx"), "--query", items[3], "--top", "1",
              "--encoder", str(tiny_encoder_dir), "--cache", str(cache), "--json", "--quiet"]
    stamps = []
    for _ in range(2):
        assert main(search) == 0
        assert json.loads(capsys.readouterr().out)["hits"][0]["line"] == 4
        kept, = cache.rglob("*.npy")
        stamps.append((kept.stat().st_ino, kept.stat().st_mtime_ns))
    assert stamps[0] == stamps[1]
    np.testing.assert_allclose(np.load(kept), tiny_encoder.encode([items[3]], "mean"),
                               atol=1e-6)

    for args, message in (
        (["search", "--index", str(tmp_path / "none"), "--query", "x"], "no index"),
        (["search", "--index", str(tmp_path / "idx"), "--query", " "], "empty query"),
        (["index", str(corpus), "--out", str(tmp_path / "i2"), "--head", str(tmp_path / "head"),
          "--pooling", "cls", "--encoder", str(tiny_encoder_dir)], "differs from the head's"),
        (["index", str(corpus), "--out", str(tmp_path / "i2"), "--head", str(tmp_path / "head"),
          "--max-length", "64", "--encoder", str(tiny_encoder_dir)], "--max-length 64 differs"),
    ):
        assert main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "i2").exists()


@pytest.fixture
def saved(tmp_path, head, tiny_encoder, items):
    return Index.build(items, tiny_encoder, head=head).save(tmp_path / "idx")


def test_hits_carry_their_line(saved, tiny_encoder, items):
    index = Index.load(saved)
    queries = [items[7], items[100]]
    for query, hits in zip(queries, index.search(queries, tiny_encoder, k=3), strict=True):
        assert isinstance(hits[0], Hit) and hits[0]._fields == ("score", "item", "line", "id")
        assert hits[0].item == query and hits[0].line == items.index(query) + 1
        assert all(items[hit.line - 1] == hit.item and hit.id == str(hit.line) for hit in hits)
        score, item, line, key = hits[0]
        assert (score, item, line, key) == (hits[0].score, hits[0].item, hits[0].line, hits[0].id)
    with pytest.raises(BertflowError, match="one string"):
        index.search(items[0], tiny_encoder)


def edit_config(folder, **changes):
    """Edit an index's config and re-sign its manifest, to reach the checks behind it."""
    from bertflow.storage.artifacts import write_manifest

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    write_manifest(folder, "bertflow-index")


def test_a_tampered_index_is_refused(saved, tiny_encoder, items):
    import faiss

    config = json.loads((saved / "config.json").read_text())
    edit_config(saved, pooling="cls")  # the head was fit on mean pooling
    with pytest.raises(BertflowError, match="cls"):
        Index.load(saved)
    edit_config(saved, pooling="mean", max_length=config["max_length"] // 2)
    with pytest.raises(BertflowError, match="fit on embeddings of at most"):
        Index.load(saved)
    edit_config(saved, pooling="mean", head=False)
    with pytest.raises(BertflowError, match="disagree on a head"):
        Index.load(saved)
    edit_config(saved, head=True, max_length=None)
    with pytest.raises(BertflowError, match="malformed"):
        Index.load(saved)
    for field, value in (("dim", config["dim"] + 0.9), ("dims", config["dims"] - 0.5),
                         ("count", float(config["count"])), ("dims", 0), ("count", True)):
        edit_config(saved, **{**config, field: value})
        with pytest.raises(BertflowError, match=rf"config.json is malformed \({field} must be a "
                                                rf"positive integer, got {value!r}\)"):
            Index.load(saved)
    edit_config(saved, **config)
    data = bytearray((saved / "index.faiss").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (saved / "index.faiss").write_bytes(bytes(data))
    with pytest.raises(BertflowError, match="altered or truncated"):
        Index.load(saved)
    # a well-formed FAISS file of the wrong kind, its checksum made to match
    l2 = faiss.IndexFlatL2(16)
    l2.add(np.zeros((len(items), 16), np.float32))
    faiss.write_index(l2, str(saved / "index.faiss"))
    from bertflow.storage.files import sha256_file
    edit_config(saved, sha256={**config["sha256"], "index.faiss": sha256_file(
        saved / "index.faiss")})
    with pytest.raises(BertflowError, match="inconsistent"):
        Index.load(saved)


def test_an_index_binds_the_head_its_vectors_went_through(saved, tiny_encoder):
    import shutil

    config = json.loads((saved / "config.json").read_text())
    shutil.rmtree(saved / "head")  # another head of the same encoder and pooling in its place
    fit_tiny_head(tiny_encoder, "mean", seed=1).save(saved / "head")
    edit_config(saved)
    with pytest.raises(BertflowError, match="its head/ folder is not the head its vectors went "
                       "through .its config records weights [0-9a-f]{12}, the folder holds "
                       "[0-9a-f]{12}.") as caught:
        Index.load(saved)
    edit_config(saved, head=True)  # written before the head's weights were recorded
    assert Index.load(saved).head is not None
    from bertflow.heads.format import weights_sha256

    assert config["head"] != weights_sha256(Index.load(saved).head)
    assert config["head"].startswith(str(caught.value).split("weights ")[1][:12])
    shutil.rmtree(saved / "head")
    edit_config(saved, head=config["head"])
    with pytest.raises(BertflowError, match="disagree on a head"):
        Index.load(saved)
    edit_config(saved, head=7)
    with pytest.raises(BertflowError, match="malformed .bad head record"):
        Index.load(saved)


def test_an_index_file_too_small_for_its_config_is_refused_before_faiss_reads_it(
        saved, items, monkeypatch):
    import faiss

    from bertflow.storage.files import sha256_file

    config = json.loads((saved / "config.json").read_text())
    few = faiss.IndexFlatIP(16)  # 3 vectors in a file whose config says many more
    few.add(np.zeros((3, 16), np.float32))
    faiss.write_index(few, str(saved / "index.faiss"))
    edit_config(saved, sha256={**config["sha256"], "index.faiss": sha256_file(
        saved / "index.faiss")})
    monkeypatch.setattr(faiss, "read_index", lambda *a: pytest.fail("FAISS read the file"))
    size = (saved / "index.faiss").stat().st_size
    with pytest.raises(BertflowError, match=f"index.faiss holds {size} bytes, fewer than the "
                       f"{len(items)} vectors its config describes take .{len(items) * 64}."):
        Index.load(saved)


def test_an_index_file_declaring_more_than_it_holds_is_refused_before_faiss_allocates_it(
        saved, items, monkeypatch):
    import struct

    import faiss

    from bertflow.storage.files import sha256_file

    config = json.loads((saved / "config.json").read_text())
    data = bytearray((saved / "index.faiss").read_bytes())
    size = struct.pack("<Q", len(items) * 16)  # the flat vectors' floats, before them
    assert data.count(size) == 1
    at = data.index(size)
    data[at : at + 8] = struct.pack("<Q", 1 << 29)  # 2 GB declared in a few KB
    (saved / "index.faiss").write_bytes(bytes(data))
    edit_config(saved, sha256={**config["sha256"], "index.faiss": sha256_file(
        saved / "index.faiss")})
    read = faiss.read_index
    monkeypatch.setattr(faiss, "read_index", lambda given, *a: pytest.fail(
        "FAISS read the file") if isinstance(given, str) else read(given, *a))
    with pytest.raises(BertflowError, match="index.faiss is not a valid FAISS index .'nread "
                       "== .size.' failed: read error in : [0-9]+ != 2147483648") as caught:
        Index.load(saved)
    assert "\n" not in str(caught.value) and ".cpp" not in str(caught.value)


def test_an_index_replaced_as_it_loads_pairs_ids_with_their_own_vectors(tmp_path, monkeypatch):
    """What is parsed is the bytes the manifest checked: an index folder replaced by another
    between the items' read and the FAISS file's gives the first whole, never the first's ids
    over the other's vectors."""
    import bertflow.search.index

    rng = np.random.default_rng(3)
    first, other = (rng.normal(size=(8, 16)).astype(np.float32) for _ in range(2))
    Index.from_embeddings(first, SENTENCES, ids=[f"a{i}" for i in range(8)]).save(
        tmp_path / "index")
    Index.from_embeddings(other, SENTENCES, ids=[f"b{i}" for i in range(8)]).save(
        tmp_path / "other")
    swapped = swap_after(monkeypatch, bertflow.search.index, "read_json", tmp_path / "index",
                         tmp_path / "other", when=lambda path, *_: path.name == "items.json")
    loaded = Index.load(tmp_path / "index")
    assert swapped and loaded.ids[0] == "a0"
    np.testing.assert_allclose(loaded.faiss_index.reconstruct_n(0, 8), unit(first), atol=1e-6)


def test_save_keeps_foreign_folders_and_the_previous_index_on_failure(
        tmp_path, saved, head, tiny_encoder, items, monkeypatch):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "index.faiss").write_text("not ours")
    (folder / "notes.txt").write_text("keep")
    index = Index.build(items[:20], tiny_encoder, head=head)
    with pytest.raises(BertflowError, match="not an index"):
        index.save(folder)
    (folder / "config.json").write_text('{"format": "bertflow-index"}')  # no manifest: not ours
    with pytest.raises(BertflowError, match="a non-empty folder but not an index"):
        index.save(folder)
    assert (folder / "notes.txt").read_text() == "keep"

    before = {p.name: p.read_bytes() for p in saved.iterdir() if p.is_file()}
    def broken(self, folder):
        raise RuntimeError("disk full")
    monkeypatch.setattr(type(head), "write", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        index.save(saved)
    assert {p.name: p.read_bytes() for p in saved.iterdir() if p.is_file()} == before
    assert [p.name for p in saved.parent.iterdir() if p.name.startswith(".idx")] == []
    assert Index.load(saved).config["count"] == len(items)


def test_more_dims_than_items_is_refused(tiny_encoder, items):
    with pytest.raises(BertflowError, match="number of items"):
        Index.build(items[:5], tiny_encoder, dims=8)
