"""Every shell and Python block of README.md and docs/*.md runs as written, each on its own in a
fresh clone of the repository (its tracked files), as a newcomer would paste it there: with the
installed package on the PATH, the embedding cache beside it, and, where a block reads `data/`,
after the README's `make data`. Where a block shows a result, the result is checked too (`CHECKS`).

Blocks fenced as ```sh or ```python are run; ```text blocks are templates (several machines,
a GPU) or output, and are not. Every relative link of these pages names a file of the
repository, and every anchor a heading of it."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, data_dir

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[str, int, str, str]]:
    """(page, line, kind, code) of each block to run; one shown on two pages runs once."""
    blocks, seen = [], set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            kind, code = m.groups()
            if code not in seen:
                seen.add(code)
                blocks.append((page.relative_to(REPO).as_posix(),
                               text[: m.start()].count("\n") + 1, kind, code))
    return blocks


BLOCKS = _blocks()
SKIP_LOCAL = {"make demo", "make test"}  # the set-up commands: CI runs them as such
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _search_finds_the_noori(out: str) -> None:
    """The query paraphrases line 985 of the corpus (its id): it is the first hit, well ahead."""
    hits = [(float(score), int(line)) for score, line in
            re.findall(r"^\s+\d+\s+(-?[\d.]+)\s+(\d+)\s", out, re.MULTILINE)]
    assert len(hits) >= 2 and hits[0][1] == 985, hits
    assert hits[0][0] > 0.5 and hits[0][0] - hits[1][0] > 0.15, hits


def _paraphrase_beats_unrelated(out: str) -> None:
    found = re.search(r"paraphrase (-?[\d.]+), unrelated (-?[\d.]+)", out)
    assert found, out
    paraphrase, unrelated = map(float, found.groups())
    assert paraphrase > 0.7 and unrelated < 0.3, (paraphrase, unrelated)


def _guitar_finds_guitar(out: str) -> None:
    assert out.strip().splitlines()[-1] == "A man is playing a guitar. 1", out


def _beir_queries_find_their_documents(out: str) -> None:
    """search --json: each query's top hit is the document its qrels judge; eval scores the
    head (first_last pooling, its own) at 100 on every measure."""
    hits = {row["id"]: row["hits"][0]["id"] for row in map(json.loads, re.findall(
        r"^\{.*\}$", out, re.MULTILINE))}
    assert hits == {"q1": "d1", "q2": "d2"}, out
    row = [cell.strip() for cell in out.strip().splitlines()[-1].split("|")]
    assert row[2:4] == ["first_last", "flow"] and row[7:11] == ["100.00"] * 4, out


DOG_COSINE = 0.69  # "Where can dogs run?" and "Dogs need to run in a park." after the ready head


def _ids_and_own_faiss(out: str) -> None:
    first, second = out.strip().splitlines()[-2:]
    assert first == "d1 A guitar has six nylon strings.", out
    found, score = second.split()
    assert found == "d2" and abs(float(score) - DOG_COSINE) <= 0.01, out


def _pipeline_finds_the_dogs(out: str) -> None:
    """The exported pipeline gives the cosine the README's FAISS block gives."""
    found = re.fullmatch(r"Dogs need to run in a park\. (-?[\d.]+)", out.strip().splitlines()[-1])
    assert found and abs(float(found.group(1)) - DOG_COSINE) <= 0.01, out


# a string that marks a block -> the check of its standard output
CHECKS = {
    'search --index corpus-index --query "An instrument like a guitar': _search_finds_the_noori,
    'print(f"paraphrase {s[0, 1]:.2f}': _paraphrase_beats_unrelated,
    'search(["A man plays guitar."], k=2)': _guitar_finds_guitar,
    "--queries tiny/queries.jsonl --top 1 --json": _beir_queries_find_their_documents,
    "own = faiss.IndexFlatIP(": _ids_and_own_faiss,
    'model.similarity(model.encode(["Where can dogs run?"])': _pipeline_finds_the_dogs,
}


def test_the_pages_have_blocks_to_run():
    kinds = {kind for page, _, kind, _ in BLOCKS if page == "README.md"}
    assert kinds == {"sh", "python"} and len(BLOCKS) >= 12
    for mark in CHECKS:  # a check whose block changed would otherwise pass unseen
        assert any(mark in code for *_, code in BLOCKS), mark


def test_the_readme_is_a_front_page():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


def _anchors(page: Path) -> set[str]:
    """GitHub's (and MkDocs') ids of a page's headings."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    titles = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in titles}


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_every_link_resolves(page):
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target} names no file"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{page.name}: {target} names no heading"


def test_the_api_reference_covers_the_public_names():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    import bertflow

    names = hooks.public_names(REPO / "bertflow" / "__init__.py")
    assert set(names) == set(bertflow.__all__) - {"__version__"}
    for name, path in names.items():  # each path the reference renders is where the name is
        module, _, attribute = path.rpartition(".")
        assert getattr(importlib.import_module(module), attribute) is getattr(bertflow, name)
    assert hooks.MARK in (REPO / "docs" / "api.md").read_text(encoding="utf-8")


def _fresh_clone(folder: Path, data: bool) -> Path:
    """The repository's tracked files in `folder`, as a clone has them; with `data`, after the
    README's `make data` (data/ linked to the data folder)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        source, copy = REPO / name, folder / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # as git keeps a link: the link itself
            copy.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, copy)
    if data:
        subprocess.run(["make", "--no-print-directory", "data",
                        f"BERTFLOW_DATA={data_dir().resolve()}"], cwd=folder, check=True,
                       capture_output=True)
    return folder


@pytest.mark.integration
@pytest.mark.parametrize("page, line, kind, code", BLOCKS,
                         ids=[f"{b[0]}:{b[1]}" for b in BLOCKS])
def test_block_runs_as_written(tmp_path, page, line, kind, code):
    if kind == "sh" and any(command in code for command in SKIP_LOCAL):
        pytest.skip("the set-up commands run as CI itself")
    needed = [data_dir() / path for path in re.findall(r"\bdata/([\w./-]*)", code)]
    if not all(path.exists() for path in needed):
        pytest.skip(f"needs the data folder ({data_dir()})")
    checkout = _fresh_clone(tmp_path / "bertflow", data=bool(needed))
    binaries = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{binaries}{os.pathsep}{os.environ['PATH']}",
           "BERTFLOW_CACHE": str(tmp_path / ".cache"), "PYTHONPATH": str(REPO),
           "MPLBACKEND": "Agg"}
    command = ["bash", "-euo", "pipefail", "-c", code] if kind == "sh" else [
        sys.executable, "-c", code]
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, (f"{page} line {line} ({kind}) failed:\n{code}\n"
                                  f"--- stderr ---\n{done.stderr[-4000:]}")
    for mark, check in CHECKS.items():
        if mark in code:
            check(done.stdout)
