"""BEIR folders: the reader (corpus, queries, qrels of a split) on small folders, each bad input
in one line naming its file and line, streaming, ids through the index and the CLI; the real
SciFact folder's counts."""

import json
import sys
import tracemalloc

import numpy as np
import pytest

from bertflow import BertflowError
from bertflow.cli.main import main
from bertflow.data.beir import MAX_RELEVANCE, load_task, read_qrels, read_queries
from bertflow.embeddings.cache import EmbeddingCache
from bertflow.embeddings.file import EmbeddingFile
from bertflow.search.index import Index
from bertflow.storage.corpus import Corpus, corpus_sha256, document, read_corpus

from ..conftest import data_dir

DOCS = [  # (_id, title, text): a title, an empty one, none, and a title alone with blanks
    ("d1", "Cats", "the small cat eats food"),
    ("d2", "", "a man plays the guitar "),
    ("d3", None, "the dog runs in the park"),
    ("d4", "music", "  "),
    ("d5", "Cars", "a big red car"),
]
QUERIES = [("q1", "a cat eats"), ("q2", "guitar music"), ("q3", "a red car"), ("q4", "dogs")]
TEST_QRELS = [("q3", "d5", 1), ("q1", "d1", 1), ("q1", "d2", 0)]
TRAIN_QRELS = [("q2", "d2", 2), ("q4", "d3", 1)]


def jsonl(rows):
    return "".join(json.dumps(row) + "\n" for row in rows)


def tsv(rows):
    return "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows)


def corpus_rows(docs=DOCS):
    return [{"_id": i, "text": t, **({} if title is None else {"title": title})}
            for i, title, t in docs]


def write_folder(folder, corpus=None, queries=None, test=None, train=None):
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(corpus if corpus is not None else jsonl(corpus_rows()))
    (folder / "queries.jsonl").write_text(queries if queries is not None else jsonl(
        {"_id": i, "text": t, "metadata": {}} for i, t in QUERIES))
    (folder / "qrels" / "test.tsv").write_text(test if test is not None else tsv(TEST_QRELS))
    (folder / "qrels" / "train.tsv").write_text(train if train is not None else tsv(TRAIN_QRELS))
    return folder


@pytest.fixture
def folder(tmp_path):
    return write_folder(tmp_path / "tiny")


EXPECTED_DOCS = ["Cats the small cat eats food", "a man plays the guitar",
                 "the dog runs in the park", "music", "Cars a big red car"]


def test_a_folder_is_read_as_mteb_builds_it(folder):
    assert [document(t or "", x) for _, t, x in DOCS] == EXPECTED_DOCS
    task = load_task(folder)
    assert (task.name, task.split) == ("tiny", "test")
    assert task.corpus.ids == ["d1", "d2", "d3", "d4", "d5"]
    assert list(task.corpus) == EXPECTED_DOCS
    assert list(task.queries.items()) == [("q1", "a cat eats"), ("q3", "a red car")]  # file order
    assert task.qrels == {"q3": {"d5": 1}, "q1": {"d1": 1, "d2": 0}}
    train = load_task(folder, "train")
    assert list(train.queries) == ["q2", "q4"] and train.qrels["q2"] == {"d2": 2}
    # the digest is of the texts as embedded: a text file of them shares the cache's entries
    text = folder.parent / "docs.txt"
    text.write_text("\n".join(EXPECTED_DOCS) + "\n")
    assert task.corpus.sha256 == corpus_sha256(EXPECTED_DOCS) == Corpus.from_file(text).sha256
    assert Corpus.from_file(folder / "corpus.jsonl").ids == task.corpus.ids
    assert Corpus.from_file(text).ids is None
    assert [list(c) for c in task.corpus.chunks(1, 4, 2)] == [EXPECTED_DOCS[1:3],
                                                               EXPECTED_DOCS[3:4]]
    # a query file of one query a line: ids are the lines
    lines = folder.parent / "queries.txt"
    lines.write_text("a cat eats\nguitar music\n")
    assert read_queries(lines) == {"1": "a cat eats", "2": "guitar music"}
    assert read_qrels(folder / "qrels" / "train.tsv") == {"q2": {"d2": 2}, "q4": {"d3": 1}}


def test_a_document_with_a_line_break_has_a_digest_of_its_own():
    assert corpus_sha256(["a\nb", "c"]) != corpus_sha256(["a", "b\nc"])
    assert corpus_sha256(["a", "b"]) != corpus_sha256(["a\nb"])


BAD_CORPUS = [  # (corpus.jsonl, the line named, what the message says)
    ('{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": \n', 2, "is not valid JSON"),
    ('{"_id": "d1", "text": "a"}\n{"_id": ' + "7" * 5001 + ', "text": "b"}\n', 2,
     f"holds an integer of over {sys.get_int_max_str_digits()} digits"),
    ('{"_id": "d1", "text": "a"}\n["d2", "b"]\n', 2, "is not a JSON object"),
    ('{"_id": "d1", "text": "a"}\n{"text": "b"}\n', 2, "has no '_id'"),
    ('{"_id": "d1", "title": "t"}\n', 1, "has no 'text'"),
    ('{"_id": "d1", "text": 3}\n', 1, "'text' is not a string"),
    ('{"_id": "d1", "text": "a", "title": ["t"]}\n', 1, '"title" is not a string'),
    ('{"_id": "", "text": "a"}\n', 1, "'_id' is empty"),
    ('{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "b"}\n{"_id": "d1", "text": "c"}\n', 3,
     "duplicate id 'd1' (also on line 1)"),
    ('{"_id": "d1", "text": "a"}\n\n{"_id": "d2", "text": "b"}\n', 2,
     "is blank: expected one JSON object per line"),
    ('{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "b\\ud800"}\n', 2,
     "'text' is not valid Unicode (a lone surrogate)"),
    ('{"_id": "d1", "text": "a", "title": "\\udfff"}\n', 1,
     "'title' is not valid Unicode"),
]


@pytest.mark.parametrize(("text", "line", "message"), BAD_CORPUS)
def test_a_bad_corpus_line_is_named(tmp_path, text, line, message):
    path = tmp_path / "corpus.jsonl"
    path.write_text(text)
    with pytest.raises(BertflowError) as caught:
        read_corpus(path)
    assert_one_line(caught.value, f"{path} line {line}", message)


def assert_one_line(error, *parts):
    text = str(error)
    assert "\n" not in text and all(part in text for part in parts), text


QRELS = f"{tsv(TEST_QRELS)}"
BAD_FOLDERS = [  # (what to write, the file and line named, what the message says)
    ({"queries": '{"_id": "q1", "text": "a cat eats"}\n\n{"_id": "q3", "text": "car"}\n'},
     "queries.jsonl line 2", "is blank"),
    ({"queries": '{"_id": "q1", "text": "a"}\n{"_id": "q1", "text": "b"}\n'},
     "queries.jsonl line 2", "duplicate id 'q1'"),
    ({"test": tsv([("q1", "d1", 1), ("q1", "d9", 1)])}, "test.tsv line 3",
     "no document with id 'd9'"),
    ({"test": tsv([("q1", "d1", 1), ("q9", "d1", 1)])}, "test.tsv line 3",
     "no query with id 'q9'"),
    ({"test": tsv([])}, "test.tsv has no judgements", "the split is empty"),
    ({"test": ""}, "test.tsv line 1", "expected the header"),
    ({"test": "q1\td1\t1\n"}, "test.tsv line 1", "expected the header"),
    ({"test": tsv([("q1", "d1", "high")])}, "test.tsv line 2", "'high' is not an integer"),
    ({"test": tsv([]) + "q1 d1 1\n"}, "test.tsv line 2", "separated by tabs"),
    ({"test": tsv([("q1", "d1", 1), ("q3", "d5", MAX_RELEVANCE + 1)])}, "test.tsv line 3",
     f"score {MAX_RELEVANCE + 1} is outside -{MAX_RELEVANCE}..{MAX_RELEVANCE}"),
    ({"test": tsv([("q1", "d1", -MAX_RELEVANCE - 1)])}, "test.tsv line 2", "is outside"),
    ({"test": tsv([("q1", "d1", 0), ("q3", "d5", -1)])}, "test.tsv judges no document relevant",
     "the split cannot be scored"),
    ({"queries": '{"_id": "q1", "text": "\\ud800"}\n'}, "queries.jsonl line 1",
     "not valid Unicode"),
    ({"test": tsv([("q1", "d1", 1), ("q1", "d1", 0)])}, "test.tsv line 3", "judged twice"),
    ({"test": tsv([("q1", "d1", 1)]) + "\n" + "q3\td5\t1\n"}, "test.tsv line 3", "is blank"),
    ({"corpus": '{"_id": "d1", "text": "caf\u00e9"}\n'.encode("latin-1")},
     "corpus.jsonl is not UTF-8", "bad byte on line 1"),
]


@pytest.mark.parametrize(("files", "where", "message"), BAD_FOLDERS)
def test_a_bad_folder_is_refused_naming_file_and_line(tmp_path, files, where, message):
    folder = write_folder(tmp_path / "bad", **{k: v for k, v in files.items()
                                               if isinstance(v, str)})
    for name, value in files.items():
        if isinstance(value, bytes):
            (folder / f"{name}.jsonl").write_bytes(value)
    with pytest.raises(BertflowError) as caught:
        load_task(folder)
    assert_one_line(caught.value, str(folder), where, message)


def test_a_folder_without_its_parts_is_refused(tmp_path, folder):
    with pytest.raises(BertflowError, match="has no split 'dev' .*; it has test, train"):
        load_task(folder, "dev")
    with pytest.raises(BertflowError, match="no BEIR folder at"):
        load_task(tmp_path / "none")
    (folder / "queries.jsonl").unlink()
    with pytest.raises(BertflowError, match="has no queries.jsonl: not a BEIR folder"):
        load_task(folder)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for read, message in ((read_corpus, "one JSON document"), (read_queries, "one query")):
        with pytest.raises(BertflowError, match=f"empty.jsonl is empty: expected {message}"):
            read(empty)
    lines = tmp_path / "queries.txt"
    lines.write_text("a cat\n\nguitar\n")
    with pytest.raises(BertflowError, match="queries.txt line 2 is blank: expected one query"):
        read_queries(lines)


def test_empty_queries_are_read_as_empty_documents_are(tmp_path):
    """As MTEB embeds them: an item of a JSON-lines file whose text is empty is kept."""
    folder = write_folder(tmp_path / "empty", queries=jsonl([{"_id": "q1", "text": ""},
                                                             {"_id": "q3", "text": " "}]),
                          corpus=jsonl(corpus_rows([*DOCS, ("d6", "", "")])))
    task = load_task(folder)
    assert task.queries == {"q1": "", "q3": " "}
    assert list(task.corpus)[-1] == ""


def test_the_largest_relevance_is_read(tmp_path):
    folder = write_folder(tmp_path / "graded", test=tsv([("q1", "d1", MAX_RELEVANCE),
                                                         ("q3", "d5", -MAX_RELEVANCE)]))
    assert load_task(folder).qrels == {"q1": {"d1": MAX_RELEVANCE}, "q3": {"d5": -MAX_RELEVANCE}}


def test_a_file_of_json_lines_named_json_is_refused(tmp_path):
    """Its lines would be read as text, each raw line a query or a sentence."""
    path = tmp_path / "queries.json"
    path.write_text(jsonl({"_id": i, "text": t} for i, t in QUERIES))
    for read in (read_queries, Corpus.from_file):
        with pytest.raises(BertflowError) as caught:
            read(path)
        assert_one_line(caught.value, str(path), "name a file of one JSON object a line *.jsonl")


def test_the_corpus_is_read_streamed(tmp_path, monkeypatch):
    """Reading (checking, hashing, counting) and re-reading a 12 MB corpus holds a small part
    of it at a time: the documents are never held whole."""
    import bertflow.storage.files

    monkeypatch.setattr(bertflow.storage.files, "_BLOCK_SIZE", 1 << 16)
    path = tmp_path / "corpus.jsonl"
    body = "the dog runs in the park " * 200  # 5 kB a document
    with path.open("w") as f:
        for n in range(2400):
            f.write(json.dumps({"_id": f"doc{n}", "title": f"t{n}", "text": body}) + "\n")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        corpus = read_corpus(path)
        read_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        rows = sum(len(chunk) for chunk in corpus.chunks(0, len(corpus), 64))
        chunk_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(corpus) == rows == 2400 and corpus.ids[-1] == "doc2399"
    assert read_peak < size / 10 and chunk_peak < size / 5, (read_peak, chunk_peak, size)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:100]))
    with pytest.raises(BertflowError, match="corpus.jsonl changed while it was being read"):
        list(corpus.chunks(0, len(corpus), 64))  # read again from the file, not from memory


def test_ids_go_through_the_index_and_search(tmp_path, folder, tiny_encoder):
    task = load_task(folder)
    for cache in (None, EmbeddingCache(tmp_path / "cache")):
        index = Index.build(task.corpus, tiny_encoder, pooling="mean", cache=cache)
        assert index.ids == task.corpus.ids and index.items == EXPECTED_DOCS
    loaded = Index.load(index.save(tmp_path / "idx"))
    assert loaded.ids == task.corpus.ids
    [hits] = loaded.search([EXPECTED_DOCS[4]], tiny_encoder, k=2)
    assert (hits[0].id, hits[0].line, hits[0].item) == ("d5", 5, EXPECTED_DOCS[4])
    with pytest.raises(BertflowError, match="ids must be unique: 'x'"):
        Index.build(["a", "b"], tiny_encoder, ids=["x", "x"])
    with pytest.raises(BertflowError, match="one id .* per item: 1 for 2"):
        Index.build(["a", "b"], tiny_encoder, ids=["x"])


def test_an_index_of_the_previous_format_is_refused(tmp_path, tiny_encoder):
    from bertflow.storage.artifacts import write_manifest

    folder = Index.build(["a cat", "a dog"], tiny_encoder).save(tmp_path / "idx")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "format_version": 2}))
    write_manifest(folder, "bertflow-index")
    with pytest.raises(BertflowError) as caught:
        Index.load(folder)
    assert_one_line(caught.value, str(folder), "index format version 2; this bertflow reads "
                    "version 3")


def test_encode_index_and_search_commands_on_a_beir_folder(tmp_path, capsys, folder,
                                                          tiny_encoder, tiny_encoder_dir):
    corpus, encoder = str(folder / "corpus.jsonl"), ["--encoder", str(tiny_encoder_dir)]
    assert main(["encode", corpus, "--out", str(tmp_path / "emb.npy"), "--pooling", "mean",
                 *encoder, "--quiet"]) == 0
    assert "5 × 16" in capsys.readouterr().out
    np.testing.assert_allclose(EmbeddingFile(tmp_path / "emb.npy").load(),
                               tiny_encoder.encode(EXPECTED_DOCS, "mean"), atol=1e-5)
    idx = str(tmp_path / "idx")
    assert main(["index", corpus, "--out", idx, "--pooling", "mean", *encoder, "--quiet"]) == 0
    assert "wrote" in capsys.readouterr().out and Index.load(idx).ids == ["d1", "d2", "d3",
                                                                          "d4", "d5"]
    assert main(["search", "--index", idx, "--queries", str(folder / "queries.jsonl"),
                 "--top", "2", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["id"], r["query"]) for r in lines] == QUERIES
    for row in lines:
        assert len(row["hits"]) == 2 and row["hits"][0]["score"] >= row["hits"][1]["score"]
        for hit in row["hits"]:
            assert hit["item"] == EXPECTED_DOCS[hit["line"] - 1] and hit["id"] == f"d{hit['line']}"
    assert main(["search", "--index", idx, "--query", EXPECTED_DOCS[4], "--top", "1"]) == 0
    query, row = capsys.readouterr().out.splitlines()
    rank, score, key, item = row.split(maxsplit=3)
    assert (query, rank, key, item) == (EXPECTED_DOCS[4], "1", "d5", EXPECTED_DOCS[4])
    assert float(score) == pytest.approx(1, abs=1e-4)
    lines_file = tmp_path / "queries.txt"
    lines_file.write_text("a red car\nguitar music\n")
    assert main(["search", "--index", idx, "--queries", str(lines_file), "--json"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["1", "2"]
    assert main(["search", "--index", idx, "--queries", str(lines_file), "--top", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "1  a red car"


def test_commands_refuse_bad_beir_input_in_one_line(tmp_path, capsys, folder, tiny_encoder_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"_id": "d1", "text": "a"}\n{"_id": "d1", "text": "b"}\n')
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"_id": "q1", "text": "a"}\n\n')
    named_json = tmp_path / "queries.json"
    named_json.write_text('{"_id": "q1", "text": "a"}\n')
    encoder = ["--encoder", str(tiny_encoder_dir)]
    idx = tmp_path / "idx"
    assert main(["index", str(folder / "corpus.jsonl"), "--out", str(idx), *encoder,
                 "--quiet"]) == 0
    capsys.readouterr()
    for args, message in (
        (["encode", str(bad), "--out", str(tmp_path / "e.npy"), *encoder],
         f"{bad} line 2: duplicate id 'd1' (also on line 1)"),
        (["index", str(bad), "--out", str(tmp_path / "i2"), *encoder],
         f"{bad} line 2: duplicate id 'd1'"),
        (["search", "--index", str(idx), "--queries", str(blank)], f"{blank} line 2 is blank"),
        (["search", "--index", str(idx), "--queries", str(tmp_path / "none.jsonl")],
         "no such file"),
        (["search", "--index", str(idx), "--queries", str(named_json)],
         f"{named_json} is named .json"),
    ):
        assert main(args) == 1, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "e.npy").exists() and not (tmp_path / "i2").exists()


def test_search_text_output_is_one_row_a_hit_whatever_the_documents_hold(tmp_path, capsys,
                                                                         tiny_encoder_dir):
    """A document or query holding newlines, terminal escapes (an OSC 52 clipboard write,
    colours) or a bidirectional override is printed escaped: it forges no hit row and sends the
    terminal nothing; an id holding a control character is refused."""
    forged = "a dog\nFAKE   2  0.9999  d9  forged hit\x1b]52;c;ZWNobyBoaQ==\x07\x1b[31mred\u202e"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{n}", "text": text}) + "\n" for n, text in
                              enumerate([forged, "a cat eats food", "a red car"], 1)))
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"_id": "q1", "text": "a dog\x1b[2J"}) + "\n")
    idx = str(tmp_path / "idx")
    assert main(["index", str(corpus), "--out", idx, "--pooling", "mean", "--quiet",
                 "--encoder", str(tiny_encoder_dir)]) == 0
    capsys.readouterr()
    assert main(["search", "--index", idx, "--queries", str(queries), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\u202e") and len(out.splitlines()) == 4, out
    assert out.splitlines()[0] == "q1  a dog\\x1b[2J"
    assert any(row.endswith("d1  a dog\\nFAKE   2  0.9999  d9  forged hit\\x1b]52;c;ZWNobyBoaQ=="
                            "\\x07\\x1b[31mred\\u202e") for row in out.splitlines()), out
    for bad_id in ("d\n1", "d\x1b1", "d\u20281"):
        corpus.write_text(json.dumps({"_id": bad_id, "text": "a dog"}) + "\n")
        assert main(["index", str(corpus), "--out", str(tmp_path / "bad"), "--quiet",
                     "--encoder", str(tiny_encoder_dir)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{corpus} line 1: '_id'" in err[0] and "control" in err[0]
    assert not (tmp_path / "bad").exists()


@pytest.mark.integration
def test_the_real_scifact_folder():
    folder = data_dir() / "beir" / "scifact"
    if not folder.is_dir():
        pytest.skip(f"no SciFact at {folder}")
    assert len(read_queries(folder / "queries.jsonl")) == 1109
    for split, queries, rows in (("test", 300, 339), ("train", 809, 919)):
        task = load_task(folder, split)
        assert (task.name, len(task.corpus), len(set(task.corpus.ids))) == ("scifact", 5183, 5183)
        assert len(task.queries) == len(task.qrels) == queries
        assert sum(len(docs) for docs in task.qrels.values()) == rows
    first = next(iter(task.corpus))
    record = json.loads(open(folder / "corpus.jsonl", encoding="utf-8").readline())
    assert first == f"{record['title']} {record['text']}".strip()
