"""MkDocs hooks and a Griffe extension for the site, read from the sources (nothing of bertflow is
imported): the front page is README.md itself, the API page lists the public names of
`bertflow/__init__.py` (so the reference follows the package as names move), signatures show
the values of bertflow's constants, and maths is MathML, rendered by the browser."""

import ast
import html
import posixpath
import re
from pathlib import Path

import griffe
from latex2mathml.converter import convert

MARK = "<!-- the public names of bertflow/__init__.py, filled in by docs/hooks.py -->"
README = "<!-- README.md, filled in by docs/hooks.py -->"
LINK = re.compile(r"\]\(([^)\s:#]+)")  # a relative link's path (no web address, no bare anchor)
MATHS = re.compile(r'<(span|div) class="arithmatex">\\[(\[](.*?)\\[)\]]</\1>', re.DOTALL)


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


def readme(root: Path) -> str:
    """README.md with its links, relative to the repository, made relative to docs/."""
    text = (root / "README.md").read_text(encoding="utf-8")
    return LINK.sub(lambda m: "](" + posixpath.relpath(m.group(1), "docs"), text)


def on_page_markdown(markdown: str, page, config, files) -> str:
    root = Path(config.config_file_path).parent
    if README in markdown:
        return markdown.replace(README, readme(root))
    if MARK not in markdown:
        return markdown
    names = public_names(root / "bertflow" / "__init__.py")
    if not names:
        raise ValueError(f"no public names found in {root / 'bertflow' / '__init__.py'}")
    rows = [f"| [`{name}`][{path}] | `{path.rpartition('.')[0]}` |"
            for name, path in sorted(names.items(), key=lambda item: item[0].lower())]
    return markdown.replace(MARK, "\n".join(["| name | defined in |", "|---|---|", *rows]))


def on_page_content(content: str, page, config, files) -> str:
    """Each formula pymdownx.arithmatex kept aside (`$...$`, `$$...$$`) as MathML."""
    return MATHS.sub(lambda m: convert(html.unescape(m.group(2)),
                                       display="block" if m.group(1) == "div" else "inline"),
                     content)


class ConstantValues(griffe.Extension):
    """A default or an attribute's value that names a constant of bertflow holding a str, int,
    float or bool, or a tuple of them, is shown as that value (`pooling='first_last'`, not
    `pooling=DEFAULT_POOLING`)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        for obj in _objects(pkg):
            if obj.is_function:
                for parameter in obj.parameters:
                    parameter.default = _value(pkg, parameter.default)
            elif obj.is_attribute:
                obj.value = _value(pkg, obj.value)


def _objects(obj: griffe.Object):
    for member in obj.members.values():
        if not member.is_alias:
            yield member
            yield from _objects(member)


def _value(pkg: griffe.Module, expression):
    if not isinstance(expression, griffe.ExprName | griffe.ExprAttribute):
        return expression
    path = expression.canonical_path
    if not path.startswith(f"{pkg.path}."):
        return expression
    try:
        constant = pkg.modules_collection.get_member(path)
        value = ast.literal_eval(str(constant.value))
    except (KeyError, AttributeError, ValueError, SyntaxError):
        return expression
    return repr(value) if _plain(value) else expression


def _plain(value) -> bool:
    """A str, int, float or bool, or a tuple of them."""
    if type(value) is tuple:
        return all(map(_plain, value))
    return type(value) in (str, int, float, bool)
