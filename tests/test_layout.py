"""docs/layout.md is the package's map: every folder and module of `bertflow/` is on it, nothing
else is, and each folder imports only from the folders before it on the page."""

import ast
import re

from .conftest import REPO

PACKAGE = REPO / "bertflow"
ROW = re.compile(r"^\| `(\w+)/` \| (.*) \|$", re.MULTILINE)


def _rows() -> list[tuple[str, set[str]]]:
    """(folder, or "" for the package's own modules; the modules its row names), in order."""
    text = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    return [("" if folder == "bertflow" else folder, set(re.findall(r"`(\w+)\.py`", cell)))
            for folder, cell in ROW.findall(text)]


def _folders() -> dict[str, set[str]]:
    found = {"": {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}}
    for init in PACKAGE.glob("*/__init__.py"):
        found[init.parent.name] = {p.stem for p in init.parent.glob("*.py")} - {"__init__"}
    return found


def test_the_map_names_every_folder_and_module_and_nothing_else():
    rows = _rows()
    assert [folder for folder, _ in rows][0] == "" and len(rows) == len(_folders())
    assert dict(rows) == _folders()


def _imports(path) -> set[str]:
    """The folders (or "" for the package's own modules) that a module imports from, at any
    depth below its folder (`cli/commands/`)."""
    found, here = set(), path.relative_to(PACKAGE).parent.parts
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            parts = [*here[: len(here) - (node.level - 1)], *(node.module or "").split(".")]
            parts = [p for p in parts if p] or [alias.name for alias in node.names][:1]
            target = parts[0] if parts else ""
            found.add(target if (PACKAGE / target / "__init__.py").is_file() else "")
    return found


def test_each_folder_imports_only_from_the_folders_before_it():
    order = [folder for folder, _ in _rows()]
    for folder in order:
        place = PACKAGE / folder if folder else PACKAGE
        for path in place.rglob("*.py") if folder else place.glob("*.py"):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            for target in _imports(path) - {folder}:
                assert order.index(target) < order.index(folder), (
                    f"{path.relative_to(REPO)} imports from {target or 'bertflow'}/, which "
                    "comes after it on docs/layout.md")
