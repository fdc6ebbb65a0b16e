"""MTEB's STS protocol run offline on a flow head: a small `AbsTaskSTS` whose data is local,
evaluated by `mteb.evaluate` through the head's sentence-transformers-style `encode` and
`similarity`, and its main score checked against bertflow's own Spearman."""

import itertools
from pathlib import Path

import numpy as np
import pytest

from bertflow import sts

from ..conftest import REPO, SENTENCES, data_dir, fit_tiny_head

mteb = pytest.importorskip("mteb")
datasets = pytest.importorskip("datasets")
from mteb.abstasks.sts import AbsTaskSTS  # noqa: E402
from mteb.abstasks.task_metadata import TaskMetadata  # noqa: E402
from mteb.models.model_meta import ModelMeta  # noqa: E402


def metadata(name: str, where: str) -> TaskMetadata:
    """A task's metadata that names a local folder, not a hub dataset (`load_data` reads it)."""
    return TaskMetadata(
        name=name, dataset={"path": where, "revision": "local"}, description=f"{name}, local",
        reference=None, type="STS", category="t2t", modalities=["text"], eval_splits=["test"],
        eval_langs=["eng-Latn"], main_score="cosine_spearman", date=None, domains=None,
        task_subtypes=None, license=None, annotations_creators=None, dialect=None,
        sample_creation=None, bibtex_citation=None)


def as_dataset(pairs: sts.Pairs) -> "datasets.DatasetDict":
    return datasets.DatasetDict({"test": datasets.Dataset.from_dict(
        {"sentence1": pairs.first, "sentence2": pairs.second, "score": pairs.gold.tolist()})})


class LocalSTSB(AbsTaskSTS):
    """STS-B test, read from the shared data folder by bertflow's own reader."""

    metadata = metadata("BertflowLocalSTSB", str(data_dir() / "STSBenchmark"))

    def load_data(self, **kwargs) -> None:
        self.dataset = as_dataset(sts.read_stsb(data_dir() / "STSBenchmark", "test"))
        self.data_loaded = True


class ToySTS(AbsTaskSTS):
    """Every pair of the test sentences, with made-up gold scores."""

    metadata = metadata("BertflowToySTS", "tests/conftest.py:SENTENCES")
    pairs = list(itertools.combinations(SENTENCES, 2))
    gold = np.random.default_rng(0).uniform(0, 5, len(pairs))

    def load_data(self, **kwargs) -> None:
        self.dataset = as_dataset(sts.Pairs("toy", [a for a, _ in self.pairs],
                                            [b for _, b in self.pairs], self.gold))
        self.data_loaded = True


class HeadModel:
    """A head and its encoder as MTEB 2 calls a model: `encode` gets a DataLoader of text
    batches and MTEB's keywords, which go on to `FlowHead.encode` untouched."""

    def __init__(self, head, encoder, name: str):
        self.head, self.encoder = head, encoder
        self.mteb_model_meta = ModelMeta.create_empty({"name": name, "revision": "local"})
        self.keywords: list[set[str]] = []

    def encode(self, inputs, **kwargs):
        self.keywords.append(set(kwargs))
        texts = [text for batch in inputs for text in batch["text"]]
        return self.head.encode(texts, self.encoder, **kwargs)

    def similarity(self, embeddings1, embeddings2):
        return self.head.similarity(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1, embeddings2):
        return self.head.similarity_pairwise(embeddings1, embeddings2)


def main_score(model, task) -> dict:
    result = mteb.evaluate(model, task, cache=None, show_progress_bar=False,
                           encode_kwargs={"batch_size": 32, "show_progress_bar": False})
    assert not result.exceptions
    return result.task_results[0].scores["test"][0]


def test_mteb_runs_a_head_and_agrees_with_bertflows_spearman(tiny_encoder):
    head = fit_tiny_head(tiny_encoder, "mean")
    model = HeadModel(head, tiny_encoder, "bertflow/tiny-mean")
    scores = main_score(model, ToySTS())
    assert model.keywords == [{"task_metadata", "hf_split", "hf_subset", "prompt_type",
                               "batch_size", "show_progress_bar"}] * 2
    pairs = ToySTS.pairs
    ours = sts.pair_spearman(sts.Pairs("toy", [a for a, _ in pairs], [b for _, b in pairs],
                                       ToySTS.gold), SENTENCES, head.encode(SENTENCES,
                                                                            tiny_encoder))
    assert scores["main_score"] == scores["cosine_spearman"]
    assert 100 * scores["main_score"] == pytest.approx(ours, abs=1e-3)
    assert scores["spearman"] == pytest.approx(scores["cosine_spearman"], abs=1e-6)  # similarity
    # the head's sentence-transformers pipeline, through MTEB's own wrapper, scores the same
    pytest.importorskip("sentence_transformers")
    from bertflow.export.pipeline import build_pipeline

    piped = main_score(build_pipeline(head, tiny_encoder), ToySTS())
    assert piped["main_score"] == pytest.approx(scores["main_score"], abs=1e-5)


@pytest.mark.integration
@pytest.mark.skipif(not (data_dir() / "STSBenchmark").is_dir(),
                    reason=f"no STS-B data at {data_dir()}")
def test_mteb_sts_benchmark_of_the_shipped_head_matches_bertflow_eval():
    from bertflow import FlowHead, load_encoder

    head = FlowHead.load(REPO / "checkpoints" / "minilm-first_last-wiki")
    encoder = load_encoder(None, device="cpu")
    scores = main_score(HeadModel(head, encoder, "bertflow/minilm-first_last-wiki"),
                        LocalSTSB())
    task = sts.load_task(data_dir(), "STS-B")
    sentences = task.sentences()
    ours = sts.score(task.test, sentences, head.encode(sentences, encoder))["all"]
    assert 100 * scores["main_score"] == pytest.approx(ours, abs=0.01)
    assert ours > 70  # a working head, not noise


def test_the_local_task_names_no_hub_dataset():
    for task in (LocalSTSB, ToySTS):
        path = task.metadata.dataset["path"]
        assert task.metadata.dataset["revision"] == "local"
        assert Path(path).is_absolute() or path.startswith("tests/")
