import importlib
import json
import sys
import warnings

import numpy as np
import pytest

from bertflow import BertflowError, FlowConfig, FlowHead, TrainConfig, fit_head
from bertflow.constants import POOLINGS
from bertflow.embeddings.isotropy import mean_pair_cosine
from bertflow.training.recipes import RECIPES, Recipe, recommended

from ..conftest import REPO


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
    head = fit_head(x, **changed.fit_options())
    assert head.linear is not None and head.standardize is None
    head = fit_head(x, **changed.updated(before="standardize").fit_options())
    assert head.linear is None and head.standardize is not None


def test_bad_recipes_are_refused():
    with pytest.raises(BertflowError, match="unknown pooling 'max'"):
        recommended("max")
    with pytest.raises(BertflowError, match="before must be one of"):
        Recipe(before="pca")
    with pytest.raises(BertflowError, match="corpus must be one of target, generic, "):
        Recipe(corpus="wiki")


def test_a_flow_fit_on_other_text_than_its_recipe_s_says_so():
    from bertflow.training.recipes import corpus_note

    assert corpus_note("cls", ["wiki-sample.txt"]) is None
    assert corpus_note("first_last", ["target", "wiki-sample.txt"]) is None
    assert "chosen fit on general text (--fit-on FILE" in corpus_note("cls", ["target"])
    note = corpus_note("first_last", ["target"])
    assert note.endswith("together (--fit-on target FILE); this flow was fit on target")
    assert "--fit-on target FILE" in corpus_note("mean", ["news.txt"])
    assert corpus_note("mean", ["target", "a + b.txt"]) is None  # a file name is not parsed
    assert corpus_note("cls", ["target"], "target") is None  # the recipe the rule chose
    assert "alone (--fit-on target)" in corpus_note("cls", ["wiki-sample.txt"], "target")


@pytest.mark.parametrize("pooling", POOLINGS)
def test_retrieval_fits_the_recipe_s_flow_on_the_recipe_s_text(pooling):
    """experiments/retrieval.py's "flow (recipe)" row is fit on the text its recipe names
    (target sentences and the generic sample, or the generic sample alone); the others on the
    target sentences."""
    target, generic = np.ones((3, 2)), np.full((5, 2), 2.0)  # a cone: the rule keeps the recipe
    fit_on = {label: x for label, _, x in _script("retrieval")._methods(pooling, target, generic)}
    assert all(x is target for label, x in fit_on.items() if label != "flow (recipe)")
    parts = {"target": [target], "generic": [generic], "target+generic": [target, generic]}
    np.testing.assert_array_equal(fit_on["flow (recipe)"],
                                  np.concatenate(parts[recommended(pooling).corpus]))


@pytest.mark.parametrize("kind", ["bert", "mpnet"])
def test_the_dropout_pass_runs_on_the_encoder_s_device(kind, request):
    """release_differences.dropout_pass (recipe.py's dropout levers) without dropout gives the
    library's embeddings wherever the encoder is loaded (CUDA where there is one), for BERT and
    for MPNet (no token types)."""
    from bertflow import load_encoder

    folder = request.getfixturevalue({"bert": "tiny_encoder_dir", "mpnet": "tiny_mpnet_dir"}[kind])
    sentences = [f"sentence number {i} is here ." for i in range(20)]
    _script("release_differences")._check_dropout_pass(load_encoder(folder), sentences)


def _cloud(offset: float, n: int = 400, dim: int = 16) -> np.ndarray:
    """Gaussian rows shifted by `offset` along one direction: isotropic at 0, a cone beyond."""
    x = np.random.default_rng(0).normal(size=(n, dim)).astype(np.float32)
    x[:, 0] += offset
    return x


def test_a_whitening_recipe_is_for_anisotropic_embeddings_only():
    """The rule reads the fit embeddings: under `ISOTROPIC` mean random-pair cosine the
    pooling's isotropic recipe replaces the whitening one; above it, and without embeddings,
    the recipe stays; poolings without an isotropic recipe never change; options given change
    whichever recipe the rule picks."""
    from bertflow.training.recipes import ISOTROPIC, ISOTROPIC_RECIPES, choose

    flat, cone = _cloud(0.0), _cloud(8.0)
    assert mean_pair_cosine(flat) < 0.05 < ISOTROPIC < 0.6 < mean_pair_cosine(cone)
    assert RECIPES["cls"].before == "whiten" and ISOTROPIC_RECIPES["cls"].before != "whiten"
    assert recommended("cls", flat) == ISOTROPIC_RECIPES["cls"]
    assert recommended("cls", cone) == recommended("cls") == RECIPES["cls"]
    for pooling in set(POOLINGS) - set(ISOTROPIC_RECIPES):
        assert recommended(pooling, flat) == recommended(pooling, cone) == RECIPES[pooling]
    given = {"train": {"seed": 3}, "flow": {"hidden": 8}}
    chosen, cosine = choose(given, "cls", flat)
    assert chosen == ISOTROPIC_RECIPES["cls"].updated(**given)
    assert cosine == pytest.approx(mean_pair_cosine(flat), abs=0.05)  # the rule's reading
    assert choose(given, "cls", cone)[0] == RECIPES["cls"].updated(**given)
    assert choose(RECIPES["cls"], "cls", flat) == (RECIPES["cls"], None)  # a whole recipe
    assert choose(None, "mean", flat) == (RECIPES["mean"], None)  # one recipe: nothing read


def test_fit_and_eval_apply_the_rule_to_the_embeddings_they_fit(tmp_path, capsys):
    """`bertflow fit` of a CLS `.npy` whitens a cone first and only standardises an isotropic
    cloud, and says so, and says where the recipe was chosen on other text than one file (as
    `eval` does, in one line); `eval`'s flow rows record the settings each fit used."""
    from bertflow.cli.main import main
    from bertflow.data.sts import Pairs, Task
    from bertflow.evaluation.methods import flow_by_recipe
    from bertflow.evaluation.sts import evaluate
    from bertflow.training.recipes import ISOTROPIC_RECIPES

    for name, x, before in (("flat", _cloud(0.0), "standardize"), ("cone", _cloud(8.0),
                                                                   "whiten")):
        np.save(tmp_path / f"{name}.npy", x)
        out = tmp_path / f"head-{name}"
        assert main(["fit", str(tmp_path / f"{name}.npy"), "--pooling", "cls", "--out", str(out),
                     "--epochs", "1", "--levels", "1", "--depth", "2"]) == 0
        said = capsys.readouterr().err
        assert "note: these cls embeddings' mean pair cosine is" in said
        assert (", under 0.3: the cls recipe for isotropic" in said) == (name == "flat")
        note = ("note: the cls recipe was chosen fit on the target sentences alone; this flow "
                f"was fit on {tmp_path / 'flat.npy'}\n")  # the cone's recipe: general text
        assert (note in said) == (name == "flat")
        head = FlowHead.load(out)
        assert (head.linear is not None, head.standardize is not None) == (
            before == "whiten", before == "standardize"), name
    assert main(["fit", str(tmp_path / "flat.npy"), "--pooling", "mean", "--out",
                 str(tmp_path / "mean"), "--epochs", "1", "--levels", "1", "--depth", "2"]) == 0
    assert ("note: the mean recipe was chosen fit on the target sentences and general text "
            f"together; this flow was fit on {tmp_path / 'flat.npy'}\n") in capsys.readouterr().err

    def make():
        return flow_by_recipe("cls", {"flow": {"levels": 1, "depth": 2}})

    sentences = [f"s{i}" for i in range(400)]
    pairs = Pairs("pairs", sentences[:200], sentences[200:], np.arange(200.0) % 5)
    task = Task("STS-B", (pairs,), tuple(sentences))
    for offset, before in ((0.0, "standardize"), (8.0, "whiten")):
        vectors = dict(zip(sentences, _cloud(offset), strict=True))
        rows = evaluate({"STS-B": task}, [], lambda s, v=vectors: np.stack([v[t] for t in s]),
                        make, "target", {"method": "flow"})
        assert len(rows) > 2 and all(r["before"] == before for r in rows), offset
        kind = (ISOTROPIC_RECIPES if offset == 0 else RECIPES)["cls"].corpus
        assert {r["recipe_corpus"] for r in rows} == {kind}  # what `eval`'s note reads


def _near_the_line(n: int = 2000) -> np.ndarray:
    """Rows whose exact mean pair cosine is 0.2995, just under `ISOTROPIC`, spread widely
    (60% a cone, 40% a ball): 10,000 random pairs land on either side."""
    from bertflow.embeddings.isotropy import mean_cosine

    base = np.random.default_rng(1).normal(size=(n, 16)).astype(np.float32)
    low, high = 0.0, 50.0
    for _ in range(60):
        x = base.copy()
        x[: n * 6 // 10, 0] += (low + high) / 2
        low, high = ((low + high) / 2, high) if mean_cosine(x) < 0.2995 else (low, (low + high) / 2)
    return x


def test_the_rule_reads_every_pair_so_row_order_cannot_flip_it(tmp_path, capsys):
    """Near the line, 10,000 pairs sampled by row position gave both recipes as the rows were
    shuffled; the exact mean over all pairs gives one, says its value and that the call is
    close, and --isotropic / --no-isotropic (`isotropic`) make the choice instead."""
    from bertflow.cli.main import main
    from bertflow.embeddings.isotropy import mean_cosine
    from bertflow.errors import BertflowWarning
    from bertflow.training.recipes import ISOTROPIC_RECIPES

    x = _near_the_line()
    orders = [np.random.default_rng(seed).permutation(len(x)) for seed in range(20)]
    sampled = {mean_pair_cosine(x[order]) < 0.3 for order in orders}
    assert sampled == {True, False}  # what the rule read before
    for order in orders:
        assert mean_cosine(x[order]) == pytest.approx(mean_cosine(x), abs=1e-12)
        with pytest.warns(BertflowWarning) as said:
            assert recommended("cls", x[order]) == ISOTROPIC_RECIPES["cls"]
        assert "mean pair cosine is 0.2995, under 0.3" in str(said[0].message)
        assert "within 0.02 of the line: --isotropic or --no-isotropic" in str(said[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say where the choice is made
        assert recommended("cls", x, isotropic=False) == RECIPES["cls"]
        assert recommended("cls", _cloud(8.0), isotropic=True) == ISOTROPIC_RECIPES["cls"]
    with pytest.raises(BertflowError, match="only cls has one for isotropic"):
        recommended("mean", x, isotropic=True)
    np.save(tmp_path / "near.npy", x)
    fit = ["fit", str(tmp_path / "near.npy"), "--pooling", "cls", "--epochs", "1", "--levels", "1",
           "--depth", "2"]
    assert main([*fit, "--out", str(tmp_path / "auto")]) == 0
    assert "within 0.02 of the line" in capsys.readouterr().err
    assert main([*fit, "--out", str(tmp_path / "pinned"), "--no-isotropic"]) == 0
    assert "mean pair cosine" not in capsys.readouterr().err
    assert FlowHead.load(tmp_path / "auto").linear is None
    assert FlowHead.load(tmp_path / "pinned").linear is not None  # whitened first
    for args, says in ((["--method", "whitening", "--no-isotropic"], "--no-isotropic apply to "
                                                                       "--method flow only"),
                       (["--pooling", "mean", "--isotropic"], "only cls has one")):
        assert main([*fit[:2], "--out", str(tmp_path / "bad"), *args]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "bad").exists()


def test_the_isotropic_recipe_replayed_on_the_second_encoder_s_rows(experiment):
    """The CLS recipe for isotropic embeddings is what `recipe.py --encoder` chose on
    all-mpnet-base-v2's CLS (mean random-pair cosine under `ISOTROPIC`), replayed on the rows
    committed in recipe-all-mpnet-base-v2.json."""
    from bertflow.training.recipes import ISOTROPIC_RECIPES

    made = json.loads((REPO / "experiments" / "results" / "recipe-all-mpnet-base-v2.json")
                      .read_text())
    for pooling, recipe in ISOTROPIC_RECIPES.items():
        mine = [r for r in made["rows"] if r["pooling"] == pooling]
        read = {(r["table"], r["lever"]): r for r in mine if r["table"] in ("joint", "stage")}
        defaults = [r for r in mine if r["table"] == "defaults"]
        trial, levers = experiment.choose(
            lambda t, table, lever, rows=read: rows[table, lever]["stsb_dev"],
            experiment.seed_spread(defaults, made["spread"]))
        assert levers == made["chosen"][pooling]["levers"]
        assert experiment.as_recipe(trial) == recipe
