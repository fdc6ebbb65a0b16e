"""A package's public names, each imported from its module on first use: importing a package
(the command line's checks import several) loads nothing heavy until a name is used."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(package: str, where: Mapping[str, tuple[str, ...]],
            modules: Mapping[str, str] | None = None,
            ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """`__all__`, `__getattr__` and `__dir__` for `package`: `where` maps each of its modules
    to the public names it defines, `modules` public names to modules served whole; any other
    module of the package is its attribute too, as after an import."""
    module_of = {name: module for module, names in where.items() for name in names}
    whole = dict(modules or {})
    names = sorted([*module_of, *whole])

    def __getattr__(name: str) -> Any:
        if name in whole:
            return importlib.import_module(f".{whole[name]}", package)
        if name not in module_of:  # a module of the package, as an attribute
            try:
                return importlib.import_module(f".{name}", package)
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(f".{module_of[name]}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return names

    return names, __getattr__, __dir__
