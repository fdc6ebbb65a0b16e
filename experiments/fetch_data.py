"""Fetch the evaluation data from its public sources into a new folder, every file checked.

    python experiments/fetch_data.py DEST [--mirror DIR]

`make data` runs this where `$BERTFLOW_DATA` (default ../shared/data) is missing, then links the
checkout's `data/` to it. Each file comes from the public repository and commit (or release) in
`SOURCES`, is cut or converted as its row says, and must then have the recorded sha256: a source
that changed, or a conversion that no longer gives the same bytes, stops the fetch with the name
of the file instead of leaving different data behind. The files go into DEST.fetching, which
becomes DEST only when every one is there and checked. `--mirror DIR` reads each address from
DIR/<host>/<path> instead of the network (a local copy, or a machine without the network).
Standard library only: it runs before any environment is set up.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import urllib.request
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

GITHUB = "https://raw.githubusercontent.com"
SENTEVAL = f"{GITHUB}/yan-soares/research_embeddings_fine_tuning/045c5e94572a60c6bd7173e152c897f6b694c5a8/data/downstream"  # noqa: E501
MTEB = f"{GITHUB}/embeddings-benchmark/results/f4cc6c8b365a3c779dbc708d6affe0b0355b2ddf/results/sentence-transformers__all-MiniLM-L6-v2/8b3219a92973c328a8e22fadcfa821b5dc75636a"  # noqa: E501
BEIR = "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/scifact.zip"
SIMCSE = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/wiki1m_for_simcse.txt"  # noqa: E501
SCIFACT = f"{GITHUB}/Josh1108/MixtureRetrievers/deff166fb97ffb7d627327e1b473cc2aa9b8cd78/data/scifact"  # noqa: E501
QUERIES = f"{GITHUB}/Kirloxious/CSI4107_Assignment2/640c17fd9b4a27f3962d702351016bb677d74305/scifact/queries.jsonl"  # noqa: E501

# (path in the data folder, address, how the file is made from what the address gives, sha256)
# how: "" as is; "lines N" its first N lines; "corpus MEMBER" that member of a zip, each record
# rewritten as {"_id", "title", "text"} (BEIR's release adds an empty "metadata")
SOURCES = [
    ("STSBenchmark/sts-train.csv", f"{SENTEVAL}/STS/STSBenchmark/sts-train.csv", "",
     "6466868d4b49a575530554224fe2e7d8cc03e83e1f326c90e561b81bf5031fec"),
    ("STSBenchmark/sts-dev.csv", f"{SENTEVAL}/STS/STSBenchmark/sts-dev.csv", "",
     "fd3e4e429f32e352c7c7c76aea5c3383ee95eb98e482796b34e4e7b88a8392f3"),
    ("STSBenchmark/sts-test.csv", f"{SENTEVAL}/STS/STSBenchmark/sts-test.csv", "",
     "4cde2a19c9b7232c9ce92a89e5afd99805c8f66ba432a7824e0a5bad1a0a0ea0"),
    ("STSBenchmark/LICENSE.txt", f"{SENTEVAL}/STS/STSBenchmark/LICENSE.txt", "",
     "3dfc3217395f8c5dd05c5f8995f25fe2f8fd258e6dd770b3de480749caee8c70"),
    ("SICK/SICK_train.txt", f"{SENTEVAL}/SICK/SICK_train.txt", "",
     "d07bdb73963dda1b2012f4d78c24044cd9503b1109218a518a481616973cf960"),
    ("SICK/SICK_trial.txt", f"{SENTEVAL}/SICK/SICK_trial.txt", "",
     "0d0786bd8671a0a70614f2f890b8ab24b3c24d1ccb624bcca87618091fbe4f11"),
    ("SICK/SICK_test_annotated.txt", f"{SENTEVAL}/SICK/SICK_test_annotated.txt", "",
     "4c9aa1bb3c5bbf732520fe35b23c121739472a38eb47e7d5336e6df51896be02"),
    ("unlabeled/wiki-sample.txt", SIMCSE, "lines 11913",
     "626175d8bf7d77e323f6d74bed023563abe2123b1b7990ccfcd958880ea71f5b"),
    *((f"unlabeled/snli/{name}", f"{SENTEVAL}/SNLI/{name}", "", sha) for name, sha in [
        ("s1.dev", "28a398b5478b10b4b851d4bb5b2e5767171519add6586015ed50b9436df11d00"),
        ("s2.dev", "a8c59709630b64ba103f7784c0cb7104a6baf23234562487264d9634714f5d2b"),
        ("s1.test", "62cb8107dc3c56a4376e5e521842be24e0d61c92c346b94917da2bbf2a47d8be"),
        ("s2.test", "1174f3ad30a3c30fc0f9eeffc1b3b6a79e0514026c5a658968a8e2a324b311a1"),
        ("labels.dev", "d164d72435c3289fe53cb01e983f7c06e104bf192c0cae9caf2e99bf2e15f974"),
        ("labels.test", "e25c363e5cc70d5494d6e6555d8053eced22dca836e0f03067530eaad3d4f5f5")]),
    ("beir/scifact/corpus.jsonl", BEIR, "corpus scifact/corpus.jsonl",
     "ae39e2b331413acd6c58c262e3d2c1bf2b4afb5407ccfa6d06dd3f06e5da1f28"),
    ("beir/scifact/queries.jsonl", QUERIES, "",
     "8ff84a7c903f722981cd8d595c022660140c51867b27608a6d4910db86080313"),
    ("beir/scifact/qrels/test.tsv", f"{SCIFACT}/qrels/test.tsv", "",
     "0864bb985e0ca2367ba217977e72004d549054b2b06666ed9d4825ac7c21284c"),
    ("beir/scifact/qrels/train.tsv", f"{SCIFACT}/qrels/train.tsv", "",
     "a53f2114831916c096b6c37d9e54da68cef4efdcdbd5ed46533601af972acf1d"),
    ("beir/reference/SciFact.json", f"{MTEB}/SciFact.json", "",
     "60d6ff20c97a785790956a2d868a4e49599b7eefbdde70d43b08d2c62e2e670d"),
    ("beir/reference/STSBenchmark.json", f"{MTEB}/STSBenchmark.json", "",
     "03439eee944ce46f5b518713a0c6a6197fe057b1aaff75e2ad96450d936c72c8"),
]


def _open(address: str, mirror: Path | None):
    """A binary stream of `address`, from the network or from `mirror`/<host>/<path>."""
    if mirror is None:
        return urllib.request.urlopen(address, timeout=60)  # noqa: S310 (https addresses above)
    parts = urlsplit(address)
    return (mirror / parts.netloc / parts.path.lstrip("/")).open("rb")


def made(address: str, how: str, mirror: Path | None) -> bytes:
    """The bytes of one data file: what `address` gives, cut or converted as `how` says."""
    kind, _, argument = how.partition(" ")
    with _open(address, mirror) as stream:
        if kind == "lines":  # the head of a large file: read only as far as it needs
            lines = []
            while len(lines) < int(argument) and (line := stream.readline()):
                lines.append(line)
            return b"".join(lines)
        raw = stream.read()
    if kind == "corpus":
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            records = archive.read(argument).decode("utf-8").splitlines()
        kept = ({k: json.loads(r)[k] for k in ("_id", "title", "text")} for r in records if r)
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept).encode("utf-8")
    return raw


def fetch(dest: Path, mirror: Path | None = None) -> None:
    """Every file of `SOURCES` into the new folder `dest`, checked, or nothing at all."""
    if dest.exists():
        raise SystemExit(f"{dest} exists; not replacing it")
    work = dest.with_name(dest.name + ".fetching")
    shutil.rmtree(work, ignore_errors=True)
    try:
        for path, address, how, sha256 in SOURCES:
            data = made(address, how, mirror)
            if hashlib.sha256(data).hexdigest() != sha256:
                raise SystemExit(f"{path}: what {address} gives now ({len(data):,} bytes) is "
                                 f"not the file the results used (its sha256 differs); nothing "
                                 f"written to {dest}")
            (work / path).parent.mkdir(parents=True, exist_ok=True)
            (work / path).write_bytes(data)
            print(f"{path}: {len(data):,} bytes, checked")
        work.rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("dest", type=Path, help="the data folder to make (must not exist)")
    options.add_argument("--mirror", type=Path, default=None,
                         help="read each address from DIR/<host>/<path> instead of the network")
    args = options.parse_args()
    try:
        fetch(args.dest, args.mirror)
    except OSError as e:
        sys.exit(f"fetching the data into {args.dest} failed: {e}")
    print(f"wrote {args.dest}: {len(SOURCES)} files, each checked by sha256")


if __name__ == "__main__":
    main()
