"""The checks of a command's options and paths, before torch is imported where they can be:
options that cannot apply together, missing inputs, outputs that overlap an input."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from ..constants import DEFAULT_BATCH_SIZE, LINEAR_OPTIONS
from ..errors import BertflowError

__all__ = ["FEEDBACK_FIELDS", "FLOW_FIELDS", "TRAIN_FIELDS", "check_inputs", "check_no_encoding",
           "check_options", "check_paths", "feedback_of", "fit_on_files", "flow_flags",
           "given_flags"]

FLOW_FIELDS = ("levels", "depth", "coupling", "hidden", "linear")
TRAIN_FIELDS = ("seed", "epochs", "batch_size", "lr", "val_fraction", "patience")
FEEDBACK_FIELDS = ("k", "beta", "weighted")  # `Feedback`'s, given as --feedback-FIELD
# The encoder's options, and the values allowed where nothing is encoded: the defaults, and
# what happens anyway (the CPU, where a flow trains; float32).
_WITHOUT_ENCODING = {"device": ("auto", "cpu"), "dtype": ("float32",),
                     "encode_batch_size": (DEFAULT_BATCH_SIZE,), "cache": (None,)}


def check_options(args: argparse.Namespace, launched: bool) -> None:
    """Refuse options that cannot apply together (`launched`: under torchrun)."""
    if launched and args.command not in ("encode", "fit", "index"):
        raise BertflowError(f"bertflow {args.command} runs in one process; under torchrun "
                            "only encode, fit and index split their work")
    method = getattr(args, "method", None) or "flow"
    given = flow_flags(args)
    if given and getattr(args, "head", None) is not None:
        raise BertflowError(f"{', '.join(given)} apply to a flow fit here, not to --head "
                            f"{args.head}, which is fit already")
    given += given_flags(args, ("checkpoint", "resume", "logdir", "dev_sts"))  # fit's
    if given and method != "flow":
        raise BertflowError(f"{', '.join(given)} apply to --method flow only")
    feedback_of(args, early=True)
    if getattr(args, "check", None) is not None:  # the command's own
        args.check(args, launched)
    for dest, flag in (("k", "--dims"), ("d", "--d"), ("shrinkage", "--shrinkage"),
                       ("gamma", "--gamma")):
        if getattr(args, dest, None) is not None and method not in LINEAR_OPTIONS[dest]:
            raise BertflowError(f"{flag} applies to --method {', '.join(LINEAR_OPTIONS[dest])}")


def feedback_of(args: argparse.Namespace, recorded: Any = None, early: bool = False,
                source: str | None = None) -> Any:
    """The `Feedback` the options ask for: --feedback-k, --feedback-beta and
    --feedback-weighted over `recorded` (what `source`, an index or a head, records), none
    with --no-feedback; `early`, before the index or head is read, any feedback stands in for
    it."""
    given = {name: getattr(args, f"feedback_{name}") for name in FEEDBACK_FIELDS
             if getattr(args, f"feedback_{name}", None) is not None}
    flags = ", ".join(f"--feedback-{name}" for name in given)
    if getattr(args, "no_feedback", False):
        if given:
            raise BertflowError(f"{flags} cannot apply with --no-feedback")
        return None
    if not given:
        return recorded
    from ..training.feedback import Feedback

    if early and any(getattr(args, owner, None) is not None for owner in ("index", "head")):
        recorded = Feedback(1)
    if "k" not in given and recorded is None:
        raise BertflowError(f"{flags} apply with --feedback-k" + (
            f" ({source} records no feedback)" if source else ""))
    return dataclasses.replace(recorded, **given) if recorded else Feedback(**given)


def fit_on_files(args: argparse.Namespace) -> list[str]:
    """The text files of --fit-on: not its words (target; corpus and queries with --retrieval)."""
    words = ("corpus", "queries") if getattr(args, "retrieval", None) is not None else ("target",)
    return [p for p in getattr(args, "fit_on", None) or [] if p not in words]


def flow_flags(args: argparse.Namespace) -> list[str]:
    """The flags of the flow and training options given, --no-isotropic among them."""
    given = given_flags(args, ("before", "isotropic", *FLOW_FIELDS, *TRAIN_FIELDS))
    return given + ["--no-isotropic"] * (getattr(args, "isotropic", None) is False)


def given_flags(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """The flags of options `names` given (neither None nor False)."""
    return [f"--{name.replace('_', '-')}" for name in names
            if getattr(args, name, None) not in (None, False)]


def check_no_encoding(args: argparse.Namespace, why: str,
                       options: tuple[str, ...] = tuple(_WITHOUT_ENCODING)) -> None:
    """Refuse the encoder's `options` given where nothing is encoded, as `why` says."""
    given = [f"--{name.replace('_', '-')} {getattr(args, name)}" for name in options
             if getattr(args, name, None) not in _WITHOUT_ENCODING[name]]
    if given:
        raise BertflowError(f"{' and '.join(given)} cannot apply: {why}")


# The files and folders a command reads, by argument: how a message names it, and what it must
# be (an existing file, a head folder or a ready head's name, a data or index folder).
_INPUTS = {"corpus": ("the corpus", "file"), "input": ("the input", "file"),
           "sentences": ("the sentences", "file"), "embeddings": ("--embeddings", "file"),
           "queries": ("--queries", "file"), "head": ("--head", "head"),
           "data": ("--data", "data folder"), "dev_sts": ("--dev-sts", "data folder"),
           "retrieval": ("--retrieval", "BEIR folder"),
           "index": ("--index", "index folder"), "encoder": ("--encoder", None)}


def check_inputs(args: argparse.Namespace) -> None:
    """Refuse a missing input before anything is imported that takes time to import."""
    from ..heads.catalog import head_folder

    given = [(dest, getattr(args, dest)) for dest in _INPUTS if getattr(args, dest, None)]
    given += [("input", p) for p in fit_on_files(args)]
    for dest, path in given:
        path, kind = Path(path), _INPUTS[dest][1]
        if kind == "file" and not path.is_file():
            raise BertflowError(f"{path} is not a file" if path.exists() else
                                f"no such file: {path}")
        if kind == "head":
            head_folder(path)
        elif kind is not None and kind != "file" and not path.is_dir():
            raise BertflowError(f"no {kind} at {path}")
    if getattr(args, "nprobe", None) is not None:  # a named kind (flat, hnsw) has no lists;
        from ..search.kinds import KINDS, no_lists  # a FAISS string's are known once read
        from ..storage.files import read_json

        kind = None
        with contextlib.suppress(BertflowError, AttributeError):  # else Index.load says what
            kind = read_json(args.index / "config.json").get("kind")
        if kind in KINDS:
            raise no_lists(kind)
    if getattr(args, "retrieval", None) is not None:
        for name in ("corpus.jsonl", "queries.jsonl", f"qrels/{args.split or 'test'}.tsv"):
            if not (args.retrieval / name).is_file():
                splits = sorted(p.stem for p in (args.retrieval / "qrels").glob("*.tsv"))
                raise BertflowError(f"no {name} in the BEIR folder {args.retrieval} (splits: "
                                    f"{', '.join(splits) or 'none'})")


def check_paths(args: argparse.Namespace, output: str = "out") -> None:
    """Refuse the output (argument `output`) where it is, holds or lies inside an input."""
    from ..embeddings.cache import EmbeddingCache
    from ..encoders.identity import recorded_folder
    from ..heads.catalog import head_folder
    from ..storage.files import check_outputs, read_json

    inputs = {name: Path(getattr(args, dest)) for dest, (name, _) in _INPUTS.items()
              if getattr(args, dest, None) is not None}
    if "--head" in inputs:
        inputs["--head"] = head_folder(inputs["--head"])
    if "--head" in inputs and "--encoder" not in inputs:
        with contextlib.suppress(BertflowError):  # the existing encoder folder it records
            record = read_json(inputs["--head"] / "config.json").get("encoder")
            if isinstance(record, dict):
                inputs["the head's encoder"] = recorded_folder(record.get("source"))
    inputs["--fit-on"] = fit_on_files(args)
    if hasattr(args, "cache") and not getattr(args, "no_cache", False):
        inputs["the embedding cache"] = EmbeddingCache(args.cache).root
    check_outputs({f"--{output}": getattr(args, output)}, inputs)
