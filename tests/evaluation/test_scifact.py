"""MTEB reproduced: raw all-MiniLM-L6-v2 (mean pooling, max length 256) on SciFact's test split
scores what MTEB published, and ranks as sentence-transformers' own `encode` + exact cosine search
does. The 5,183 abstracts' embeddings stay in a cache folder between runs: $BERTFLOW_TEST_CACHE,
else ~/.cache/bertflow-tests, keyed as the package keys its cache."""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from bertflow import FlowHead, default_encoder_path, load_encoder
from bertflow.cosine import top_hits
from bertflow.embeddings.cache import EmbeddingCache
from bertflow.evaluation.retrieval import MEASURES, evaluate_retrieval, ranking

from ..conftest import data_dir

pytestmark = pytest.mark.integration
pytest.importorskip("pytrec_eval")

SCIFACT, REFERENCE = data_dir() / "beir" / "scifact", data_dir() / "beir" / "reference"
MAX_LENGTH = 256  # MTEB's setting for all-MiniLM-L6-v2
TOLERANCE = {"ndcg_at_10": 0.001, "map_at_100": 0.002, "mrr_at_10": 0.002,
             "recall_at_100": 0.002}


def cache_root() -> Path:
    """The folder that keeps the real encoder's embeddings between runs of the suite."""
    root = os.environ.get("BERTFLOW_TEST_CACHE") or Path.home() / ".cache" / "bertflow-tests"
    return Path(root)


@pytest.fixture(scope="module")
def task():
    if not (SCIFACT / "corpus.jsonl").is_file():
        pytest.skip(f"no SciFact at {SCIFACT}")
    from bertflow.data.beir import load_task

    return load_task(SCIFACT, "test")


@pytest.fixture(scope="module")
def encoder():
    return load_encoder()


def test_raw_minilm_reproduces_mtebs_scifact_scores(task, encoder):
    reference = json.loads((REFERENCE / "SciFact.json").read_text())["scores"]["test"][0]
    [row] = evaluate_retrieval(task, "raw", encoder, EmbeddingCache(cache_root() / "embeddings"),
                               pooling="mean", max_length=MAX_LENGTH, progress=False)
    assert (row["queries"], row["documents"]) == (300, 5183)
    assert set(TOLERANCE) == set(MEASURES)
    for measure, tolerance in TOLERANCE.items():
        assert abs(row[measure] - reference[measure]) <= tolerance, (measure, row[measure],
                                                                      reference[measure])


def test_ranking_equals_sentence_transformers_encode_and_exact_search(task, encoder):
    """The same top 10 for at least 99% of the test queries."""
    st = pytest.importorskip("sentence_transformers")
    cache = EmbeddingCache(cache_root() / "embeddings")
    documents = cache.files(task.corpus, encoder, "mean", MAX_LENGTH, progress=False)["mean"]
    queries = list(task.queries.values())
    ours = ranking(cache.encode(queries, encoder, "mean", MAX_LENGTH), documents.load(),
                   list(task.queries), task.corpus.ids, top=10)
    model = st.SentenceTransformer(str(default_encoder_path()), device="cpu")
    model.max_seq_length = MAX_LENGTH
    key = json.dumps({"sentence_transformers": st.__version__, "encoder": encoder.id.fingerprint,
                      "corpus": task.corpus.sha256, "max_seq_length": MAX_LENGTH})
    theirs_docs = _kept(cache_root() / f"st-{hashlib.sha256(key.encode()).hexdigest()[:24]}.npy",
                        lambda: model.encode(list(task.corpus), batch_size=32))
    _, rows = top_hits(model.encode(queries, batch_size=32), theirs_docs, top=10)
    same = [list(ours[q]) == [task.corpus.ids[j] for j in r]
            for q, r in zip(task.queries, rows, strict=True)]
    assert sum(same) >= 0.99 * len(same), f"{sum(same)} of {len(same)} the same"


def _kept(path: Path, make) -> np.ndarray:
    """The array at `path`, else `make()`, saved there (written whole, then renamed)."""
    if path.is_file():
        return np.load(path)
    x = np.asarray(make(), dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    with open(partial, "wb") as f:
        np.save(f, x)
    os.replace(partial, path)
    return x


def test_the_retrieval_choice_beats_raw_without_qrels(task, encoder, tmp_path):
    """experiments/retrieval_beir.py chose, on the train queries, whitening with shrinkage 0.9
    fit on the documents (mean pooling); as a saved head it ranks the test queries better
    than raw pooling, by the value the experiment recorded."""
    cache = EmbeddingCache(cache_root() / "embeddings")
    documents = cache.files(task.corpus, encoder, "mean", MAX_LENGTH, progress=False)["mean"]
    head = FlowHead.fit_linear(documents.load(), "whitening", shrinkage=0.9, encoder=encoder.id,
                               pooling="mean", max_length=MAX_LENGTH)
    head = FlowHead.load(head.save(tmp_path / "scifact-head"))
    [shrunk] = evaluate_retrieval(task, head, encoder, cache, progress=False)
    [raw] = evaluate_retrieval(task, "raw", encoder, cache, pooling="mean",
                               max_length=MAX_LENGTH, progress=False)
    assert round(100 * shrunk["ndcg_at_10"], 2) == 65.52
    assert all(shrunk[m] > raw[m] for m in MEASURES), (shrunk, raw)
