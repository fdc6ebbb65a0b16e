"""A package's public names, each imported from its module on first use: importing a package
(the command line's checks import several) loads nothing heavy until a name is used. A module's
`__all__` says its public names once; the package reads it from the module's source."""

from __future__ import annotations

import ast
import collections
import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["exports", "public_names"]


def exports(package: str, where: Mapping[str, tuple[str, ...]] | Iterable[str],
            modules: Mapping[str, str] | None = None,
            ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """`__all__`, `__getattr__` and `__dir__` for `package`: `where` maps each of its modules
    to the public names it serves, or names the modules whose whole `__all__` it serves;
    `modules` maps public names to modules served whole. A name two modules define is served by
    neither (import it from its module); any other module of the package is its attribute too,
    as after an import."""
    if not isinstance(where, Mapping):
        where = {module: public_names(package, module) for module in where}
    served = [(name, module) for module, names in where.items() for name in names]
    count = collections.Counter(name for name, _ in served)
    module_of = {name: module for name, module in served if count[name] == 1}  # else ambiguous
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


def public_names(package: str, module: str) -> tuple[str, ...]:
    """The `__all__` of `package.module`, read from its source without running it."""
    source = Path(sys.modules[package].__file__).parent / f"{module.replace('.', '/')}.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] \
                == ["__all__"]:
            return tuple(ast.literal_eval(node.value))
    raise ImportError(f"{source} has no __all__")
