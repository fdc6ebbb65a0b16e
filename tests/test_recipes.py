import json

import numpy as np
import pytest

from bertflow import BertflowError, FlowConfig, FlowHead, TrainConfig
from bertflow.constants import POOLINGS
from bertflow.recipes import RECIPES, Recipe, recommended

from .conftest import REPO


def test_every_pooling_has_the_recipe_its_experiment_chose():
    """`bertflow.recipes` holds what experiments/recipe.py chose on STS-B dev, field by field
    (the seed aside): the library's defaults and the evidence cannot drift apart."""
    chosen = json.loads((REPO / "experiments" / "results" / "recipe.json").read_text())["chosen"]
    assert set(chosen) == set(POOLINGS) == set(RECIPES)
    for pooling, record in chosen.items():
        recipe, made = recommended(pooling), record["recipe"]
        assert recipe.flow == FlowConfig.from_dict(made["flow"]), pooling
        assert recipe.train == TrainConfig.from_dict({**made["train"], "seed": 0}), pooling
        assert recipe.before == made["before"], pooling
        assert made["dropout"] == 0 and "release_clip" not in made, pooling  # not expressible
        corpus = {"wiki": "generic", "snli": "generic",
                  "target+wiki": "target+generic"}.get(made["corpus"], made["corpus"])
        assert recipe.corpus == corpus, pooling


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
