"""The commands of `bertflow`, a module each: its `SUMMARY` and `DESCRIPTION`, its
`arguments`, where it has some its own `check` (before torch is imported), and its `run`;
`COMPUTES = False` where the run computes nothing (torch's threads are not set for it)."""

from . import diagnose, encode, eval, export, fit, index, info, recipes, search, transform

__all__ = ["COMMANDS"]

COMMANDS = {"encode": encode, "fit": fit, "transform": transform, "eval": eval,
            "diagnose": diagnose, "export": export, "index": index, "search": search,
            "info": info, "recipes": recipes}
