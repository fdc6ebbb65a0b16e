"""MkDocs hook: the API page lists the public names of `bertflow/__init__.py`, read from its
source (nothing is imported), so the reference follows the package as names move."""

import ast
from pathlib import Path

MARK = "<!-- the public names of bertflow/__init__.py, filled in by docs/hooks.py -->"


def public_names(init: Path) -> dict[str, str]:
    """Each public name of the package -> the dotted path it is defined at."""
    where: dict[str, str] = {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id in ("_WHERE", "_MODULES"):
            value = ast.literal_eval(node.value)
            if target.id == "_WHERE":
                where.update({name: f"bertflow.{module}.{name}" for module, names in value.items()
                              for name in names})
            else:  # public name: module
                where.update({name: f"bertflow.{module}" for name, module in value.items()})
    return {name: path for name, path in where.items() if not name.startswith("_")}


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARK not in markdown:
        return markdown
    init = Path(config.config_file_path).parent / "bertflow" / "__init__.py"
    names = public_names(init)
    if not names:
        raise ValueError(f"no public names found in {init}")
    blocks = [f"::: {names[name]}\n    options:\n      show_root_full_path: false"
              for name in sorted(names, key=str.lower)]
    return markdown.replace(MARK, "\n\n".join(blocks))
