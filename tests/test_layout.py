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


def _imports(path, folder: str) -> set[str]:
    """The folders (or "" for the package's own modules) that a module imports from."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            # from the package's own modules, level 1 is the package; from a folder's, level 2
            parts = [] if node.level == (2 if folder else 1) else [folder]
            parts += (node.module or "").split(".") if node.module else []
            names = [alias.name for alias in node.names] if not node.module else []
            target = parts[0] if parts else (names[0] if names else "")
            found.add(target if (PACKAGE / target / "__init__.py").is_file() else "")
    return found


def test_each_folder_imports_only_from_the_folders_before_it():
    order = [folder for folder, _ in _rows()]
    for folder in order:
        place = PACKAGE / folder if folder else PACKAGE
        for path in place.glob("*.py"):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            for target in _imports(path, folder) - {folder}:
                assert order.index(target) < order.index(folder), (
                    f"{path.relative_to(REPO)} imports from {target or 'bertflow'}/, which "
                    "comes after it on docs/layout.md")
