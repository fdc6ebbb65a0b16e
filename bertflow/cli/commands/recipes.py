"""`bertflow recipes`: print each pooling's recommended flow recipe."""

from __future__ import annotations

import argparse
from typing import Any

from ...constants import POOLINGS

SUMMARY = "print each pooling's recommended flow recipe"
COMPUTES = False
DESCRIPTION = """\
The settings `bertflow fit` and `bertflow eval --method flow` start from, per pooling
(bertflow.training.recipes): what comes before the flow, the flow, its training, and the kind of
text the recipe was chosen on; where a recipe whitens, the one used instead when the
embeddings the flow is fit on are already isotropic. An option given to those commands
changes only itself."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="print this pooling's recipe only")


def run(args: argparse.Namespace) -> None:
    from ...training.recipes import ISOTROPIC, ISOTROPIC_RECIPES, RECIPES

    def show(recipe: Any, indent: str) -> None:
        print(f"{indent}before:   {recipe.before}\n{indent}corpus:   {recipe.corpus}")
        for name, config in (("flow", recipe.flow), ("training", recipe.train)):
            settings = " ".join(f"{k}={v}" for k, v in config.to_dict().items())
            print(f"{indent}{name + ':':<9} {settings}")

    for pooling, recipe in RECIPES.items():
        if args.pooling in (None, pooling):
            print(f"{pooling}:")
            show(recipe, "  ")
            if pooling in ISOTROPIC_RECIPES:
                print(f"  where the fit embeddings' mean pair cosine is under {ISOTROPIC} "
                      "(--isotropic):")
                show(ISOTROPIC_RECIPES[pooling], "    ")
