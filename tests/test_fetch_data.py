"""experiments/fetch_data.py against a local copy of each public source: the data folder it
makes is the one the results used, byte for byte, and a source that changed leaves nothing."""

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from .conftest import REPO, data_dir

sys.path.insert(0, str(REPO / "experiments"))
import fetch_data  # noqa: E402

pytestmark = pytest.mark.skipif(not (data_dir() / "beir" / "scifact").is_dir(),
                                reason=f"needs the data folder ({data_dir()})")


def _mirror(root: Path) -> Path:
    """What each address gives, as the public sources hold it, made from the data folder: the
    whole SimCSE file is longer than the sample, BEIR's zip has the corpus with "metadata"."""
    for path, address, how, _ in fetch_data.SOURCES:
        parts = urlsplit(address)
        copy = root / parts.netloc / parts.path.lstrip("/")
        copy.parent.mkdir(parents=True, exist_ok=True)
        data = (data_dir() / path).read_bytes()
        if how.startswith("lines"):
            data += b"A sentence past the sample.\nAnd one more.\n"
        elif how.startswith("corpus"):
            records = [{**json.loads(line), "metadata": {}} for line in data.splitlines()]
            packed = io.BytesIO()
            with zipfile.ZipFile(packed, "w") as archive:
                archive.writestr("scifact/queries.jsonl", "not this member\n")
                archive.writestr(how.split()[1], "".join(json.dumps(r) + "\n" for r in records))
            data = packed.getvalue()
        copy.write_bytes(data)
    return root


def _fetch(dest: Path, mirror: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "experiments" / "fetch_data.py"),
                           str(dest), "--mirror", str(mirror)], capture_output=True, text=True)


def test_fetch_makes_the_data_folder_byte_for_byte(tmp_path):
    done = _fetch(tmp_path / "data", _mirror(tmp_path / "mirror"))
    assert done.returncode == 0, done.stderr
    for path, *_ in fetch_data.SOURCES:
        assert (tmp_path / "data" / path).read_bytes() == (data_dir() / path).read_bytes(), path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "mirror"]
    again = _fetch(tmp_path / "data", tmp_path / "mirror")  # never over a folder that exists
    assert again.returncode != 0 and "exists; not replacing it" in again.stderr


def test_a_source_that_changed_stops_the_fetch_and_leaves_nothing(tmp_path):
    mirror = _mirror(tmp_path / "mirror")
    path, address, *_ = next(s for s in fetch_data.SOURCES if s[0].endswith("qrels/test.tsv"))
    changed = mirror / urlsplit(address).netloc / urlsplit(address).path.lstrip("/")
    changed.write_bytes(changed.read_bytes() + b"1\t4983\t1\n")  # a row more
    done = _fetch(tmp_path / "data", mirror)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and path in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mirror"]
