import importlib
import json
import sys

import numpy as np
import pytest

from bertflow import BertflowError, FlowConfig, FlowHead, TrainConfig
from bertflow.constants import POOLINGS
from bertflow.recipes import RECIPES, Recipe, recommended

from .conftest import REPO


def _script(name: str):
    """experiments/NAME.py, imported as its own folder's scripts import each other."""
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "experiments"))


@pytest.fixture(scope="module")
def experiment():
    return _script("recipe")


@pytest.fixture(scope="module")
def made() -> dict:
    return json.loads((REPO / "experiments" / "results" / "recipe.json").read_text())


@pytest.mark.parametrize("pooling", POOLINGS)
def test_the_selection_rule_replayed_on_the_committed_rows_gives_the_recipe(
        experiment, made, pooling):
    """experiments/recipe.py's own rule (`choose`), run on the rows of recipe.json, reads
    exactly the joint and stage rows committed there and picks the pooling's recipe: the
    library's defaults and the evidence cannot drift apart."""
    assert set(made["chosen"]) == set(POOLINGS) == set(RECIPES)
    mine = [r for r in made["rows"] if r["pooling"] == pooling]
    read = {(r["table"], r["lever"]): r for r in mine if r["table"] in ("joint", "stage")}
    used = set()

    def dev(trial, table, lever):
        row = read[table, lever]
        assert row["key"] == trial.key() and row["seed"] == 0, (table, lever)
        used.add((table, lever))
        return row["stsb_dev"]

    defaults = [r for r in mine if r["table"] == "defaults"]
    spread = experiment.seed_spread(defaults, made["spread"])
    assert spread == pytest.approx(made["chosen"][pooling]["spread"], abs=1e-12)
    trial, levers = experiment.choose(dev, spread)
    assert used == set(read) and levers == made["chosen"][pooling]["levers"]
    assert experiment.as_recipe(trial) == RECIPES[pooling]


def test_updated_changes_only_what_it_names_and_fits():
    base = Recipe(FlowConfig(levels=2, depth=2), TrainConfig(epochs=2, lr=3e-4), "whiten")
    changed = base.updated(flow={"hidden": 8}, train={"seed": 5})
    assert changed.flow == FlowConfig(levels=2, depth=2, hidden=8)
    assert changed.train == TrainConfig(epochs=2, lr=3e-4, seed=5)
    assert changed.before == "whiten" and base.updated(before="none").before == "none"
    x = np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32)
    head = FlowHead.fit(x, **changed.fit_options())
    assert head.linear is not None and head.standardize is None
    head = FlowHead.fit(x, **changed.updated(before="standardize").fit_options())
    assert head.linear is None and head.standardize is not None


def test_bad_recipes_are_refused():
    with pytest.raises(BertflowError, match="unknown pooling 'max'"):
        recommended("max")
    with pytest.raises(BertflowError, match="before must be one of"):
        Recipe(before="pca")
    with pytest.raises(BertflowError, match="corpus must be one of target, generic, "):
        Recipe(corpus="wiki")


def test_a_flow_fit_on_other_text_than_its_recipe_s_says_so():
    from bertflow.recipes import corpus_note

    assert corpus_note("cls", ["wiki-sample.txt"]) is None
    assert corpus_note("first_last", ["target", "wiki-sample.txt"]) is None
    assert "chosen fit on general text (--fit-on FILE" in corpus_note("cls", ["target"])
    note = corpus_note("first_last", ["target"])
    assert note.endswith("together (--fit-on target FILE); this flow was fit on target")
    assert "--fit-on target FILE" in corpus_note("mean", ["news.txt"])
    assert corpus_note("mean", ["target", "a + b.txt"]) is None  # a file name is not parsed


@pytest.mark.parametrize("pooling", POOLINGS)
def test_retrieval_fits_the_recipe_s_flow_on_the_recipe_s_text(pooling):
    """experiments/retrieval.py's "flow (recipe)" row is fit on the text its recipe names
    (target sentences and the generic sample, or the generic sample alone); the others on the
    target sentences."""
    target, generic = np.zeros((3, 2)), np.ones((5, 2))
    fit_on = {label: x for label, _, x in _script("retrieval")._methods(pooling, target, generic)}
    assert all(x is target for label, x in fit_on.items() if label != "flow (recipe)")
    parts = {"target": [target], "generic": [generic], "target+generic": [target, generic]}
    np.testing.assert_array_equal(fit_on["flow (recipe)"],
                                  np.concatenate(parts[recommended(pooling).corpus]))


def test_the_dropout_pass_runs_on_the_encoder_s_device(tiny_encoder):
    """release_differences.dropout_pass (recipe.py's dropout levers) without dropout gives the
    library's embeddings wherever the encoder is loaded (CUDA where there is one)."""
    sentences = [f"sentence number {i} is here ." for i in range(20)]
    _script("release_differences")._check_dropout_pass(tiny_encoder, sentences)
