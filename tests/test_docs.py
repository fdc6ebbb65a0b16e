"""The documentation site as `make docs` builds it (the one test that builds it): README.md is
its front page, the API reference is a page per folder of docs/layout.md in its order with every
module on it, each heading names what holds it (`Head.encode`), defaults are values, maths is
MathML, and no build file (the hooks, the templates) is in the site."""

import html
import re
import subprocess
import sys

import yaml

from .conftest import REPO
from .test_layout import _rows

HEADING = re.compile(r'<h\d id="([^"]+)" class="doc doc-heading">\s*<span class="doc '
                     r'doc-object-name doc-(\w+)-name">([^<]*)</span>')
SIGNATURE = re.compile(r'<div class="doc-signature[^"]*">(.*?)</div>', re.DOTALL)


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_the_site_builds_with_the_readme_and_a_reference_page_per_folder(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(REPO / "mkdocs.yml"), "-d", str(site)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert not [p.name for p in site.rglob("*") if p.suffix in (".py", ".jinja")]

    front = (site / "index.html").read_text(encoding="utf-8")
    title = (REPO / "README.md").read_text(encoding="utf-8").splitlines()[0].removeprefix("# ")
    assert f">{html.escape(title, quote=False)}</h1>" in front
    assert 'href="docs/' not in front and 'href="cli/#data"' in front

    folders = [folder or "bertflow" for folder, _ in _rows()]
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    reference = next(entry["API reference"] for entry in nav if "API reference" in entry)
    assert reference == ["api.md", *(f"api/{folder}.md" for folder in folders)]
    maths = 0
    for (folder, modules), name in zip(_rows(), folders, strict=True):
        page = (site / "api" / name / "index.html").read_text(encoding="utf-8")
        headings = HEADING.findall(page)
        ids = {path for path, _, _ in headings}
        package = f"bertflow.{folder}." if folder else "bertflow."
        assert {package + module for module in modules} <= ids, name
        for path, kind, text in headings:  # a module by its path, the rest by their holder
            assert text == (path if kind == "module" else ".".join(path.split(".")[-2:]))
        texts = [text for _, _, text in headings]
        assert len(set(texts)) == len(texts), name
        for signature in SIGNATURE.findall(page):  # a constant's value, not its name
            assert not re.search(r"=\s*[A-Z][A-Z0-9_]+\b", _text(signature)), _text(signature)
        prose = _text(re.sub(r"<code>.*?</code>", "", page, flags=re.DOTALL))
        assert not re.search(r"\$[^$\n]+\$", prose), name
        maths += page.count("<math ")
    assert maths and "Head.encode" in {t for *_, t in HEADING.findall(
        (site / "api" / "heads" / "index.html").read_text(encoding="utf-8"))}
