"""Each pooling's recommended flow head (before the Glow, its architecture, its training),
chosen on STS-B dev and unlabeled text only (`experiments/recipe.py`, evidence in
`experiments/results/recipe.md`). `bertflow fit` and `eval --method flow` start from it and change
what their options name; `fit_head` keeps the release's flow as its defaults.

One rule reads the embeddings the flow is fit on, no labels and no encoder name: a recipe that
whitens is for anisotropic embeddings. Where their mean pair cosine (over all pairs, exactly:
`mean_cosine`) is under `ISOTROPIC`, they already fill the sphere, whitening them only costs
alignment, and the pooling's `ISOTROPIC_RECIPES` entry is used instead (all-mpnet-base-v2's
CLS, chosen the same way: `experiments/results/recipe-all-mpnet-base-v2.md`). `rule_note`
says the choice with the cosine (`bertflow fit` and `eval` print it), a close call is warned
of, and `isotropic` (`--isotropic`, `--no-isotropic`) makes the choice instead."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import FlowConfig, TrainConfig
from ..constants import BEFORE, POOLINGS
from ..errors import BertflowError, BertflowWarning

__all__ = ["BEFORE", "CORPORA", "ISOTROPIC", "ISOTROPIC_RECIPES", "NEAR", "RECIPES", "Recipe",
           "choose", "close_call", "corpus_note", "recommended", "rule_note"]

CORPORA = ("target", "generic", "target+generic")  # the kinds of text a recipe is chosen on


@dataclass(frozen=True)
class Recipe:
    """A flow head's settings: `before` the Glow (``standardize`` per feature, ``whiten`` fully,
    ``none``), its `flow` and its `train`ing. `corpus` is the text it was chosen on: ``generic``
    (such as the Wikipedia sample), ``target`` (the sentences to compare, without their scores: a
    transductive fit, which sees the test sentences) or both (`eval --fit-on target FILE`)."""

    flow: FlowConfig = field(default_factory=FlowConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    before: str = "standardize"
    corpus: str = "target"

    def __post_init__(self) -> None:
        for name, value, allowed in (("before", self.before, BEFORE),
                                     ("corpus", self.corpus, CORPORA)):
            if value not in allowed:
                raise BertflowError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")

    def updated(self, flow: dict[str, Any] | None = None, train: dict[str, Any] | None = None,
                before: str | None = None) -> Recipe:
        """This recipe with `before` and the named fields of its flow and training changed."""
        return replace(self, flow=FlowConfig.from_dict({**self.flow.to_dict(), **(flow or {})}),
                       train=TrainConfig.from_dict({**self.train.to_dict(), **(train or {})}),
                       before=before or self.before)

    def fit_options(self) -> dict[str, Any]:
        """The keywords of `fit_head` (and of `make_method("flow")`) this recipe sets."""
        return {"flow": self.flow, "train": self.train, "before": self.before}


RECIPES: dict[str, Recipe] = {
    # the CLS recipe is whitening on general text: the flow after it moves STS-B dev by at
    # most 0.01 over three seeds (under 0.05: experiments/results/recipe.md)
    "cls": Recipe(train=TrainConfig(lr=1e-4), before="whiten", corpus="generic"),
    # nearly isotropic already: a flow that moves little from the standardised start, fit on
    # the target sentences and general text together
    "mean": Recipe(train=TrainConfig(lr=1e-4), corpus="target+generic"),
    "first_last": Recipe(train=TrainConfig(lr=1e-4), corpus="target+generic"),
    "last2": Recipe(FlowConfig(hidden=128), TrainConfig(lr=1e-4), corpus="target+generic"),
    # the static token average: longer training and affine coupling
    "static": Recipe(FlowConfig(coupling="affine"), TrainConfig(epochs=3, patience=0),
                     corpus="target+generic"),
}
assert set(RECIPES) == set(POOLINGS)

# Under this mean pair cosine, embeddings count as isotropic: all-MiniLM-L6-v2's CLS is at 0.51
# to 0.62 on STS-B, SICK, the Wikipedia sample and SNLI, where whitening first is chosen
# (experiments/results/recipe.md); all-mpnet-base-v2's at 0.049 to 0.087, where it is not
# (experiments/results/rule_cosines.md). 0.3 lies between; two encoders are all the evidence
ISOTROPIC = 0.3
NEAR = 0.02  # a cosine this close to ISOTROPIC is a close call, and said to be one
ISOTROPIC_RECIPES: dict[str, Recipe] = {
    # all-mpnet-base-v2's CLS: standardised, the flow that moves least (learning rate 1e-4), fit
    # on the target sentences; no flow and no baseline is above raw there on STS-B dev
    "cls": Recipe(train=TrainConfig(lr=1e-4)),
}
assert all(RECIPES[p].before == "whiten" and r.before != "whiten"
           for p, r in ISOTROPIC_RECIPES.items())


def corpus_note(pooling: str, fit_on: Sequence[str | os.PathLike],
                kind: str | None = None, options: bool = True) -> str | None:
    """What to say when a flow of `pooling` is fit on `fit_on` (``"target"`` and text files, as
    `bertflow eval --fit-on` takes them) but its recipe was chosen on other text, `kind` (one of
    `CORPORA`; default: the recommended recipe's), with the `options` of eval that fit on it;
    else None."""
    kind, given = kind or recommended(pooling).corpus, [str(p) for p in fit_on]
    fit = ("target" in given, any(p != "target" for p in given))  # the target, text files
    if fit == ("target" in kind, "generic" in kind):
        return None
    wanted, option = {
        "target": ("the target sentences alone", "--fit-on target"),
        "generic": ("general text", "--fit-on FILE, e.g. the Wikipedia sample"),
        "target+generic": ("the target sentences and general text together",
                           "--fit-on target FILE")}[kind]
    return (f"note: the {pooling} recipe was chosen fit on {wanted}"
            f"{f' ({option})' if options else ''}; this flow was fit on {' '.join(given)}")


def recommended(pooling: str, x: Any = None, isotropic: bool | None = None) -> Recipe:
    """The recipe for embeddings of `pooling`; for a pooling with an `ISOTROPIC_RECIPES` entry,
    that entry where `isotropic`, else where `x`, the embeddings the recipe is to be fit on, is
    isotropic (`choose`)."""
    given = None if isotropic is None else {"isotropic": isotropic}
    return choose(given, pooling, x, stacklevel=3)[0]


def choose(recipe: Recipe | dict[str, Any] | None, pooling: str, x: Any = None, *,
           stacklevel: int = 2) -> tuple[Recipe, float | None]:
    """Where every flow's recipe is chosen: `recipe` itself (a whole `Recipe`), else the
    recommended recipe of `pooling` changed by `recipe`'s `Recipe.updated` keywords (a dict,
    or None). For a pooling with an `ISOTROPIC_RECIPES` entry, the dict's ``isotropic`` picks
    it, else the rule does where the embeddings `x` are given: their mean pair cosine
    (`mean_cosine`) under `ISOTROPIC`. Also the cosine read (None where none was); within
    `NEAR` of the line a `BertflowWarning` says so (`rule_note`)."""
    if isinstance(recipe, Recipe):
        return recipe, None
    options = dict(recipe or {})
    isotropic = options.pop("isotropic", None)
    if pooling not in RECIPES:
        raise BertflowError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    cosine = None
    if pooling not in ISOTROPIC_RECIPES:
        if isotropic:
            raise BertflowError(f"--isotropic: the {pooling} recipe is one for all embeddings; "
                                f"only {', '.join(ISOTROPIC_RECIPES)} has one for isotropic "
                                "embeddings")
        isotropic = False
    elif isotropic is None and x is not None:
        from ..embeddings.isotropy import mean_cosine

        cosine = mean_cosine(x)
        isotropic = cosine < ISOTROPIC
    if close_call(cosine):
        warnings.warn(rule_note(pooling, cosine), BertflowWarning, stacklevel=stacklevel)
    chosen = ISOTROPIC_RECIPES[pooling] if isotropic else RECIPES[pooling]
    return chosen.updated(**options), cosine


def close_call(cosine: float | None) -> bool:
    """Whether the rule's `cosine` is within `NEAR` of `ISOTROPIC`."""
    return cosine is not None and abs(cosine - ISOTROPIC) < NEAR


def rule_note(pooling: str, cosine: float) -> str:
    """What the rule chose for embeddings of `pooling` whose mean pair cosine is `cosine`, and,
    for a close call, how to make the choice instead."""
    isotropic = cosine < ISOTROPIC
    kind = ("isotropic embeddings, which does not whiten" if isotropic
            else "anisotropic embeddings, which whitens first")
    close = (f"; within {NEAR} of the line: --isotropic or --no-isotropic makes the choice"
             if close_call(cosine) else "")
    return (f"these {pooling} embeddings' mean pair cosine is {cosine:.4f}, "
            f"{'under' if isotropic else 'not under'} {ISOTROPIC}: the {pooling} recipe for "
            f"{kind} (`bertflow recipes --pooling {pooling}`){close}")
