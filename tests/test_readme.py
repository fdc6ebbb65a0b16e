"""Every shell and Python block of the README runs as written, each on its own in a fresh
folder, as a newcomer would paste it: with the installed package on the PATH, the embedding
cache in that folder, and (where a block says so) the STS data in `data/`, SentEval's layout.

Blocks fenced as ```sh or ```python are run; ```text blocks are templates (several machines,
a GPU) and are not."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, data_dir

BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.MULTILINE | re.DOTALL)
BLOCKS = [(kind, code, REPO.joinpath("README.md").read_text()[: m.start()].count("\n") + 1)
          for m in BLOCK.finditer(REPO.joinpath("README.md").read_text())
          for kind, code in [m.groups()]]
SKIP_LOCAL = {"make demo", "make test"}  # the set-up commands: CI runs them as such


def test_the_readme_has_blocks_to_run():
    kinds = {kind for kind, _, _ in BLOCKS}
    assert kinds == {"sh", "python"} and len(BLOCKS) >= 8


@pytest.mark.integration
@pytest.mark.parametrize("kind, code, line", BLOCKS, ids=[f"line-{b[2]}" for b in BLOCKS])
def test_readme_block_runs_as_written(tmp_path, kind, code, line):
    if kind == "sh" and any(command in code for command in SKIP_LOCAL):
        pytest.skip("the set-up commands run as CI itself")
    if "data/" in code:
        if not (data_dir() / "STSBenchmark").is_dir():
            pytest.skip(f"needs the STS data folder ({data_dir()})")
        (tmp_path / "data").symlink_to(data_dir().resolve(), target_is_directory=True)
    binaries = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{binaries}{os.pathsep}{os.environ['PATH']}",
           "BERTFLOW_CACHE": str(tmp_path / ".cache"), "PYTHONPATH": str(REPO),
           "MPLBACKEND": "Agg"}
    command = ["bash", "-euo", "pipefail", "-c", code] if kind == "sh" else [
        sys.executable, "-c", code]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, (f"README.md line {line} ({kind}) failed:\n{code}\n"
                                  f"--- stderr ---\n{done.stderr[-4000:]}")
