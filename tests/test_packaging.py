"""What `pip install` of a checkout brings: the package, the ready heads, the extras."""

import configparser
import subprocess
import sys
import zipfile

from .conftest import REPO


def test_the_wheel_carries_the_ready_heads(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--quiet", "-w", str(tmp_path), str(REPO)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    [wheel] = tmp_path.glob("bertflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for file in ("config.json", "model.safetensors", "manifest.json"):
        assert f"bertflow/heads/ready/minilm-first_last-wiki/{file}" in names
    assert "bertflow/constants.py" in names


def test_every_extra_the_readme_names_is_declared():
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    extras = set(config["options.extras_require"])
    assert {"st", "export", "retrieval", "plots", "demo", "dev"} <= extras
    assert "matplotlib" in config["options.extras_require"]["plots"]
    readme = (REPO / "README.md").read_text()
    assert 'pip install ".[st,export,retrieval,plots]"' in readme
