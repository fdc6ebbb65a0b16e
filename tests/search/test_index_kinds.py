"""Index kinds given as FAISS index_factory strings (IVF, PQ, HNSW...): recall against the
flat index, the seeded training sample, nprobe, save/load and its checks, refusals, the CLI
and one index built from every rank's vectors under torchrun."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertflow import BertflowError
from bertflow.cli.main import main
from bertflow.search.index import Index
from bertflow.search.kinds import MAX_PER_CENTROID, sample
from bertflow.storage.artifacts import write_manifest

from ..cli.test_cli_checks import _NOTHING_HEAVY
from ..conftest import REPO, SENTENCES, WORDS
from ..runtime.test_distributed import bertflow, setup  # noqa: F401 (a fixture)
from .test_retrieval import edit_config

GROUPS, SIZE, DIM = 200, 10, 16


@pytest.fixture(scope="module")
def easy():
    """200 tight, well-apart groups of 10 vectors, and a query near each group's centre: the
    flat index's top 10 of a query is its group."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(GROUPS, DIM))
    x = np.repeat(centres, SIZE, 0) + 0.05 * rng.normal(size=(GROUPS * SIZE, DIM))
    queries = centres + 0.05 * rng.normal(size=(GROUPS, DIM))
    return x.astype(np.float32), [f"v{i}" for i in range(len(x))], queries.astype(np.float32)


def recall_at_10(index, truth, queries):
    got = index.search_embeddings(queries, 10)[1]
    return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, got, strict=True)])


def test_trained_kinds_find_what_flat_finds(easy):
    x, items, queries = easy
    flat = Index.from_embeddings(x, items, pooling="mean")
    scores, truth = flat.search_embeddings(queries, 10)
    assert (truth // SIZE == np.arange(GROUPS)[:, None]).all()
    assert flat.nprobe is None and flat.config["trained_on"] == 0
    ivf = Index.from_embeddings(x, items, pooling="mean", kind="IVF16,Flat")
    assert ivf.config["trained_on"] == len(x)  # 2000 < 256 × 16
    assert ivf.nprobe == ivf.config["nprobe"] == 4  # the square root of its 16 lists
    ivf.nprobe = 16  # every list: exhaustive, the flat index's answer
    got_scores, got = ivf.search_embeddings(queries, 10)
    np.testing.assert_allclose(got_scores, scores, atol=1e-5)
    assert recall_at_10(ivf, truth, queries) == 1
    for kind, floor in (("IVF16,PQ8x4np", 0.95), ("IVF16,SQ8", 0.95), ("HNSW32", 0.95)):
        index = Index.from_embeddings(x, items, pooling="mean", kind=kind)
        if index.nprobe is not None:
            index.nprobe = 16
        assert recall_at_10(index, truth, queries) >= floor, kind
        assert index.config["kind"] == kind


@pytest.mark.parametrize("kind", ["PCA8,Flat", "PCAR8,Flat", "PCAW8,Flat", "PCAWR8,Flat",
                                  "RR16,Flat", "PCA8,IVF4,Flat", "PCA8,L2norm,Flat"])
def test_a_kind_with_vector_transforms_still_scores_cosines(kind, easy):
    """A string's own PCA, whitening, OPQ or rotation changes lengths: the index normalises
    after them too, so each score is a cosine (at most 1, a vector's own 1) and the groups are
    found as with --dims."""
    x, items, queries = easy
    index = Index.from_embeddings(x, items, pooling="mean", kind=kind)
    if index.nprobe is not None:
        index.nprobe = 4
    scores, rows = index.search_embeddings(x[::SIZE], 10)
    assert scores.max() <= 1 + 1e-5 and (rows[:, 0] == np.arange(0, len(x), SIZE)).all()
    np.testing.assert_allclose(scores[:, 0], 1, atol=1e-4)
    truth = Index.from_embeddings(x, items, pooling="mean").search_embeddings(queries, 10)[1]
    reduced = Index.from_embeddings(x, items, pooling="mean", dims=8)
    assert recall_at_10(index, truth, queries) >= min(0.95, recall_at_10(reduced, truth,
                                                                         queries))
    assert index.config["kind"] == kind


def test_the_training_sample_is_seeded_and_capped(easy):
    x, items, _ = easy
    rows = sample(len(x), 1024)
    assert len(rows) == len(set(rows)) == 1024 and (np.diff(rows) > 0).all()
    assert (rows == sample(len(x), 1024)).all() and sample(10, 10) == slice(None)
    import faiss

    one, two = (Index.from_embeddings(x, items, pooling="mean", kind="IVF4,Flat")
                for _ in range(2))
    assert one.config["trained_on"] == 4 * MAX_PER_CENTROID == 1024
    assert (faiss.serialize_index(one.faiss_index) == faiss.serialize_index(two.faiss_index)
            ).all()


def test_a_trained_kind_saves_and_loads(tmp_path, tiny_encoder):
    items = SENTENCES + [f"{a} and {b}" for a in WORDS for b in WORDS[:5]]  # 8 + 165
    index = Index.build(items, tiny_encoder, kind="IVF4,Flat", dims=8)
    index.nprobe = 3
    index.save(tmp_path / "idx")
    loaded = Index.load(tmp_path / "idx")
    assert loaded.config == index.config and loaded.config["kind"] == "IVF4,Flat"
    assert loaded.nprobe == 3  # kept in index.faiss
    queries = ["the cat eats", "a red car"]
    assert loaded.search(queries, tiny_encoder) == index.search(queries, tiny_encoder)
    config = json.loads((tmp_path / "idx" / "config.json").read_text())
    for kind, message in (("IVF8,Flat", "not the trained 'IVF8,Flat' index"),
                          ("flat", "not the trained 'flat' index"),
                          ("IVF4,PQ4x4", "not the trained"),
                          ("nonsense", "malformed"), (7, "malformed")):
        edit_config(tmp_path / "idx", kind=kind)
        with pytest.raises(BertflowError, match=message):
            Index.load(tmp_path / "idx")
    edit_config(tmp_path / "idx", **{**config, "nprobe": 5})
    with pytest.raises(BertflowError, match="malformed .nprobe must be an integer from 1 to 4"):
        Index.load(tmp_path / "idx")
    edit_config(tmp_path / "idx", **{**config, "nprobe": 2})
    assert Index.load(tmp_path / "idx").nprobe == 2  # the config's, not the file's 3
    del config["nprobe"]  # written before nprobe was recorded: the file's own
    (tmp_path / "idx" / "config.json").write_text(json.dumps(config))
    write_manifest(tmp_path / "idx", "bertflow-index")
    assert Index.load(tmp_path / "idx").nprobe == 3


def test_refusals(easy, tiny_encoder, monkeypatch):
    x, items, _ = easy
    for kind, message in (
            ("IVF16,Nonsense", "not flat, hnsw or a FAISS index_factory string for 16-d "
                               "vectors by inner product .*could not parse code description "
                               "Nonsense"),
            ("IVF16,PQ5", "should be a multiple of the number of subquantizers"),
            ("", "an index kind is flat, hnsw or a FAISS index_factory string"),
            ("OPQ8,IVF16,PQ8x4", "k-means of 256 centroids, which needs at least 9984 "
                                 "vectors .39 a centroid.; got 2000"),
            ("IVF64,Flat", "needs at least 2496 vectors"),
            *((kind, "sizes must be at least 1, an HNSW graph's neighbours at least 2 and an "
                     "NSG graph's at least 8")
              for kind in ("IVF0,Flat", "PCA0,Flat", "IVF4,PQ8x0", "HNSW0", "HNSW1",
                           "IVF4_HNSW0,Flat", "NSG0", "NSG7")),
            *((kind, "its sizes must be at most 1048576, a graph's neighbours at most 512 and "
                     "a code's bits at most 16")
              for kind in ("HNSW100000000", "HNSW513", "IVF2000000,Flat", "PQ4x17",
                           "IMI2x9,Flat", "IVF4,PQ1x30")),
            *((kind, "a vector transform gives 100000-d vectors from 16-d ones; at most 16")
              for kind in ("RR100000,Flat", "PCA100000,Flat", "OPQ4_100000,IVF4,PQ4"))):
        with pytest.raises(BertflowError, match=message) as caught:
            Index.from_embeddings(x, items, pooling="mean", kind=kind)
        assert "\n" not in str(caught.value) and ".cpp" not in str(caught.value)
    flat = Index.from_embeddings(x[:50], items[:50], pooling="mean")
    with pytest.raises(BertflowError, match="nprobe applies to kinds with inverted lists"):
        flat.nprobe = 2
    ivf = Index.from_embeddings(x, items, pooling="mean", kind="IVF16,Flat")
    for bad in (0, 17, 2.5, True):
        with pytest.raises(BertflowError, match="nprobe must be an integer from 1 to 16"):
            ivf.nprobe = bad
    # Index.build refuses before it encodes
    monkeypatch.setattr(type(tiny_encoder), "encode", lambda *a, **k: pytest.fail("encoded"))
    for options, message in (({"kind": "IVF64,Flat"}, "needs at least 2496 vectors .*; got 8"),
                             ({"kind": "IVF2,Flat", "dims": 9},
                              "dims must be 16 .all. or between 1 and 8"),
                             ({"kind": "PQ3"}, "multiple of"),
                             ({"kind": "RR100000,Flat"}, "gives 100000-d vectors from 16-d"),
                             ({"kind": "HNSW100000000"}, "at most 1048576")):
        with pytest.raises(BertflowError, match=message):
            Index.build(SENTENCES, tiny_encoder, **options)


def test_index_and_search_commands_with_a_trained_kind(tmp_path, capsys, tiny_encoder_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"{a} {b} the {c}" for a in WORDS[:8] for b in WORDS[8:16]
                                for c in WORDS[16:20]) + "\n")  # 256 lines
    out, encoder = tmp_path / "idx", ["--encoder", str(tiny_encoder_dir)]
    assert main(["index", str(corpus), "--out", str(out), "--kind", "IVF4,Flat", *encoder]) == 0
    assert "256 items, IVF4,Flat (trained on 256), 16-d" in capsys.readouterr().out
    query = ["search", "--index", str(out), "--query", "a man in the park", "--json", *encoder]
    assert json.loads((out / "config.json").read_text())["nprobe"] == 2  # of its 4 lists
    assert main([*query, "--top", "256"]) == 0  # 2 lists hold fewer than all 256 lines
    hits, err = (lambda c: (json.loads(c.out)["hits"], c.err))(capsys.readouterr())
    assert len(hits) < 256 and err == ("bertflow: note: 1 of 1 queries got fewer than 256 "
                                       "hits: its nprobe 2 visits too few of its lists "
                                       "(--nprobe)\n")
    assert main([*query, "--top", "256", "--nprobe", "4"]) == 0
    hits, err = (lambda c: (json.loads(c.out)["hits"], c.err))(capsys.readouterr())
    assert len(hits) == 256 and err == ""
    assert main([*query, "--nprobe", "4"]) == 0
    exhaustive = json.loads(capsys.readouterr().out)["hits"]
    assert len(exhaustive) == 10
    flat = tmp_path / "flat"
    assert main(["index", str(corpus), "--out", str(flat), *encoder]) == 0
    capsys.readouterr()
    assert main([*query[:2], str(flat), *query[3:]]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert main([*query[:2], str(flat), *query[3:], "--top", "300"]) == 0
    assert capsys.readouterr().err == ("bertflow: note: 1 of 1 queries got fewer than 300 "
                                       "hits: the index holds 256 items\n")
    assert [h["id"] for h in hits] == [h["id"] for h in exhaustive]
    assert [h["score"] for h in hits] == pytest.approx([h["score"] for h in exhaustive], abs=1e-5)
    for args, message in (
            ([*query[:2], str(flat), *query[3:], "--nprobe", "2"],
             "nprobe applies to kinds with inverted lists (IVF...); this index is 'flat'"),
            ([*query, "--nprobe", "5"], "nprobe must be an integer from 1 to 4"),
            (["index", str(corpus), "--out", str(tmp_path / "bad"), "--kind", "IVF4,Nope",
              *encoder], "could not parse code description Nope"),
            (["index", str(corpus), "--out", str(tmp_path / "bad"), "--kind", "IVF8,Flat",
              *encoder], "needs at least 312 vectors (39 a centroid); got 256")):
        assert main(args) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "bad").exists()


def test_nprobe_for_a_named_kind_is_refused_before_torch_is_imported(tmp_path, easy):
    x, items, _ = easy
    for kind in ("flat", "hnsw"):
        Index.from_embeddings(x[:50], items[:50], pooling="mean", kind=kind).save(
            tmp_path / kind)
    argv = json.dumps([["search", "--index", str(tmp_path / kind), "--query", "a", "--nprobe",
                        "2"] for kind in ("flat", "hnsw")])
    done = subprocess.run([sys.executable, "-c", _NOTHING_HEAVY, argv], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == 2, done.stderr
    for kind, (code, err, heavy) in zip(("flat", "hnsw"), results, strict=True):
        assert code == 1 and heavy == [] and err == (
            "bertflow: error: nprobe applies to kinds with inverted lists (IVF...); this "
            f"index is {kind!r}\n")


@pytest.mark.xdist_group("torchrun")  # with test_distributed's jobs, one at a time
def test_torchrun_builds_one_trained_index_from_every_rank(setup):  # noqa: F811
    for out, processes in (("ivf-one", 1), ("ivf-two", 2)):
        bertflow(setup, "index", "corpus.txt", "--out", out, "--encoder", "encoder",
                 "--kind", "IVF4,Flat", "--cache", setup / f"cache-{out}", processes=processes)
    one, two = (Index.load(setup / name) for name in ("ivf-one", "ivf-two"))
    assert one.config["trained_on"] == two.config["trained_on"] == 300
    for name in ("index.faiss", "items.json"):
        assert (setup / "ivf-two" / name).read_bytes() == (setup / "ivf-one" / name).read_bytes()


def test_hnsw_graph_settings_are_set_recorded_and_checked(tmp_path, easy):
    x, items, queries = easy
    flat = Index.from_embeddings(x, items, pooling="mean")
    truth = flat.search_embeddings(queries, 10)[1]
    default = Index.from_embeddings(x, items, pooling="mean", kind="hnsw")
    assert default.config["hnsw"] == {"M": 32, "ef_construction": 40, "ef_search": 16}
    assert default.ef_search == 16 and flat.ef_search is None
    small = Index.from_embeddings(x, items, pooling="mean", kind="hnsw",
                                  hnsw={"M": 4, "ef_construction": 8, "ef_search": 1})
    import faiss

    inner = faiss.downcast_index(small.faiss_index.index)  # behind the normalisation
    assert (inner.hnsw.nb_neighbors(1), inner.hnsw.efConstruction, inner.hnsw.efSearch) == \
        (4, 8, 1)
    poor = recall_at_10(small, truth, queries)
    small.ef_search = 200  # a wider search of the same graph finds more
    assert small.config["hnsw"] == {"M": 4, "ef_construction": 8, "ef_search": 200}
    assert recall_at_10(small, truth, queries) > poor
    small.save(tmp_path / "small")
    loaded = Index.load(tmp_path / "small")
    assert loaded.ef_search == 200 and loaded.config == small.config
    edit_config(tmp_path / "small", hnsw={"M": 32, "ef_construction": 8, "ef_search": 200})
    with pytest.raises(BertflowError, match="is not the trained 'hnsw' index"):
        Index.load(tmp_path / "small")
    edit_config(tmp_path / "small", hnsw={"M": 4})
    with pytest.raises(BertflowError, match="config.json is malformed"):
        Index.load(tmp_path / "small")
    default.save(tmp_path / "old")  # written before M was settable: no settings, M 32
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["hnsw"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    write_manifest(tmp_path / "old", "bertflow-index")
    assert Index.load(tmp_path / "old").ef_search == 16
    for options, message in (
            ({"kind": "flat", "hnsw": {"M": 8}}, "are set for kind hnsw; this index is 'flat'"),
            ({"kind": "hnsw", "hnsw": {"M": 1}}, "HNSW's M must be an integer from 2 to 512"),
            ({"kind": "hnsw", "hnsw": {"M": 10**8}}, "M must be an integer from 2 to 512"),
            ({"kind": "hnsw", "hnsw": {"ef_search": 0}}, "ef_search must be an integer from 1 to")):
        with pytest.raises(BertflowError, match=message):
            Index.from_embeddings(x[:50], items[:50], pooling="mean", **options)
    with pytest.raises(BertflowError, match="efSearch applies to kinds with an HNSW graph"):
        flat.ef_search = 10
    factory = Index.from_embeddings(x[:50], items[:50], pooling="mean", kind="HNSW8,Flat")
    factory.ef_search = 64  # a graph from a factory string is searched the same way
    assert factory.ef_search == 64 and "hnsw" not in factory.config


def test_index_and_search_commands_set_the_hnsw_graph(tmp_path, capsys, tiny_encoder_dir):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"{a} {b}" for a in WORDS[:8] for b in WORDS[8:16]) + "\n")
    out, encoder = tmp_path / "idx", ["--encoder", str(tiny_encoder_dir)]
    assert main(["index", str(corpus), "--out", str(out), "--kind", "hnsw", "--hnsw-m", "8",
                 "--ef-construction", "20", "--ef-search", "12", *encoder]) == 0
    assert "hnsw (M 8, ef_construction 20, ef_search 12)" in capsys.readouterr().out
    assert Index.load(out).config["hnsw"] == {"M": 8, "ef_construction": 20, "ef_search": 12}
    query = ["search", "--index", str(out), "--query", "a man", "--json", *encoder]
    assert main([*query, "--ef-search", "64"]) == 0
    assert len(json.loads(capsys.readouterr().out)["hits"]) == 10
    assert main(["index", str(corpus), "--out", str(tmp_path / "flat"), "--hnsw-m", "8",
                 *encoder]) == 1
    assert "are set for kind hnsw; this index is 'flat'" in capsys.readouterr().err
    assert not (tmp_path / "flat").exists()
