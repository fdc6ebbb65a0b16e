"""The options several commands share, their types and how `--help` shows them."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from ..config import FLOW_CEILINGS
from ..constants import (
    BEFORE,
    DEFAULT_BATCH_SIZE,
    DEFAULT_ENCODER_NAME,
    DEFAULT_MAX_LENGTH,
    DEFAULT_POOLING,
    DTYPES,
    FEEDBACK_BETA,
    GAMMA_ESTIMATORS,
    POOLINGS,
    SHRINKAGE_ESTIMATORS,
)

__all__ = ["CACHE_HELP", "CORPUS_HELP", "HEAD_HELP", "Formatter", "Parser", "Refused",
           "baseline_options", "ceiling", "device_options", "encoder_options", "feedback_options",
           "flow_arguments", "head_or_flow_options", "integer", "positive", "quiet", "typed"]


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option with its default (where it has one worth showing); descriptions as is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action)  # says the default unless the help does


class Refused(argparse.Action):
    """An option that means something else here: refused, saying what (its `const`)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        raise argparse.ArgumentError(self, self.const)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


HEAD_HELP = "a head folder, or the name of a ready head (`bertflow info` lists them)"
CORPUS_HELP = "text file of one sentence a line, or a BEIR corpus.jsonl (a file named *.jsonl)"
CACHE_HELP = ("embedding cache folder (default: $BERTFLOW_CACHE/embeddings, else "
              "~/.cache/bertflow/embeddings)")


def quiet(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--quiet", action="store_const", const=False, dest="progress",
                   help="no progress bars or epoch lines")


def baseline_options(p: argparse.ArgumentParser) -> None:
    # the defaults are bertflow.heads.linear.default_k, default_d and linear_options'
    p.add_argument("--dims", dest="k", type=positive, default=None, metavar="K",
                   help="components kept by whitening-k and pca (default: a third of the "
                        "dimension), and by fractional (default: all); --method whitening "
                        "--dims K is whitening-k keeping K")
    p.add_argument("--d", type=natural, default=None,
                   help="directions removed by abtt (default: a hundredth of the dimension)")
    p.add_argument("--shrinkage", type=value_or_estimator("α", 1, SHRINKAGE_ESTIMATORS),
                   default=None, metavar="ALPHA",
                   help="shrink the covariance of whitening, whitening-k and fractional towards "
                        "a multiple of the identity, (1−α)Σ + α·tr Σ/n·I: α in [0, 1], or "
                        f"{', '.join(SHRINKAGE_ESTIMATORS)} to let that estimator choose α "
                        "from the embeddings (default: 0)")
    p.add_argument("--gamma", type=value_or_estimator("γ", 2, GAMMA_ESTIMATORS), default=None,
                   help="fractional's power: the covariance to −γ/2, γ in [0, 2], 1 being "
                        "whitening, or spectrum to choose γ from the eigenspectrum: the share "
                        "of the kept components' variance above the noise (default: 0.5)")


def feedback_options(p: argparse.ArgumentParser, recorded: str | None = None) -> None:
    """Pseudo-relevance feedback (`bertflow.training.feedback`, which checks it); none by
    default, or the feedback that `recorded` (the index, the head) records, where it records
    one (--no-feedback: none)."""
    default = f"{recorded}, where it records one, else none" if recorded else "none"
    g = p.add_argument_group(
        "feedback", "Vector pseudo-relevance feedback: each query q̂ searched again as "
        "normalise(q̂ + β · the mean unit vector of its first search's top K), after the head "
        f"(default: {default})")
    g.add_argument("--feedback-k", type=int, default=None, metavar="K",
                   help="feed back the top K documents of the first search, K ≥ 1")
    g.add_argument("--feedback-beta", type=float, default=None, metavar="BETA",
                   help=f"β ≥ 0, how far the query moves (with --feedback-k: {FEEDBACK_BETA})")
    g.add_argument("--feedback-weighted", action=argparse.BooleanOptionalAction, default=None,
                   help="weigh each document by its cosine (negative ones by 0)")
    if recorded:
        g.add_argument("--no-feedback", action="store_true",
                       help=f"a plain search, whatever feedback {recorded} records")


def head_or_flow_options(p: argparse.ArgumentParser) -> None:
    """The encoder (the head's by default), the cache, and the flow fit without a head."""
    encoder_options(p, "the head's, else ")
    p.add_argument("--cache", type=Path, default=None, help=CACHE_HELP)
    quiet(flow_arguments(p))


def encoder_options(p: argparse.ArgumentParser, first: str = "") -> None:
    """The encoder's options; pooling and max length are None where not given, and default to
    `first` (the head's, the sidecar's), else the encoder folder's own, else bertflow's."""
    p.add_argument("--encoder", default=None,
                   help=f"Hugging Face encoder folder (default: {DEFAULT_ENCODER_NAME}, which "
                        "comes with bertflow)")
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help=f"how token states become one vector (default: {first}the encoder "
                        f"folder's own (modules.json), else {DEFAULT_POOLING})")
    p.add_argument("--max-length", type=integer(2), default=None,
                   help=f"tokens per sentence; longer sentences are truncated (default: {first}the "
                        f"encoder folder's own (sentence_bert_config.json), else "
                        f"{DEFAULT_MAX_LENGTH})")
    p.add_argument("--encode-batch-size", dest="encode_batch_size", type=positive,
                   default=DEFAULT_BATCH_SIZE, help="sentences per encoder batch")
    device_options(p)


def device_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="precision of the encoder (embeddings and files stay float32); int8: "
                        "its projections, on the CPU (docs/performance.md)")


def flow_arguments(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    g = p.add_argument_group("flow", "Options left unset take the recommended recipe's "
                             "values for the pooling (`bertflow recipes` prints them).")
    g.add_argument("--before", choices=BEFORE, default=None,
                   help="what comes before the flow: per-feature standardisation, full "
                        "whitening, or nothing")
    g.add_argument("--isotropic", action=argparse.BooleanOptionalAction, default=None,
                   help="start from the pooling's recipe for isotropic embeddings (or, with "
                        "--no-isotropic, the other), not the one chosen by the fit embeddings' "
                        "mean pair cosine (cls)")
    g.add_argument("--levels", type=ceiling("levels"), default=None,
                   help="levels of the multi-scale Glow (half the features leave after each)")
    g.add_argument("--depth", type=ceiling("depth"), default=None,
                   help="steps per level (ActNorm, mixing, coupling)")
    g.add_argument("--coupling", choices=("additive", "affine"), default=None,
                   help="coupling layer")
    g.add_argument("--hidden", type=ceiling("hidden"), default=None, help="conditioner width")
    g.add_argument("--linear", choices=("reverse", "lu"), default=None,
                   help="mixing layer: fixed reversal (as released) or learned LU")
    g = p.add_argument_group("training")
    g.add_argument("--seed", type=integer(0, 2**32), default=None,
                   help="seeds the split, order and weights (default: 0)")
    g.add_argument("--epochs", type=positive, default=None,
                   help="passes over the data (default: the recipe's)")
    g.add_argument("--batch-size", type=positive, default=None,
                   help="embeddings per flow minibatch (default: the recipe's)")
    g.add_argument("--lr", type=typed(float, "positive", lambda v: v > 0), default=None,
                   help="Adam's learning rate, decayed along a cosine (default: the recipe's)")
    g.add_argument("--val-fraction", type=fraction, default=None,
                   help="held-out share of the rows, in [0, 1) (default: the recipe's)")
    g.add_argument("--patience", type=natural, default=None,
                   help="epochs without a better held-out NLL before stopping; 0 never stops "
                        "(default: the recipe's)")
    return g


def typed(kind: type, wanted: str, holds: Callable[[Any], bool]) -> Callable[[str], Any]:
    """An argument type: the text as `kind` (int or float), finite and such that `holds`."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            noun = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if not holds(value):
            got = value if kind is int else text
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {got}")
        return value

    return parse


def integer(low: int, high: int | None = None) -> Callable[[str], int]:
    bounds = f"at least {low}" if high is None else f"in [{low}, {high})"
    return typed(int, f"an integer {bounds}", lambda v: low <= v and (high is None or v < high))


def ceiling(name: str) -> Callable[[str], int]:
    """The type of a flow architecture option: a positive integer up to its ceiling."""
    return integer(1, FLOW_CEILINGS[name] + 1)


positive, natural = integer(1), integer(0)
fraction = typed(float, "in [0, 1)", lambda v: 0 <= v < 1)


def value_or_estimator(symbol: str, high: float,
                       estimators: tuple[str, ...]) -> Callable[[str], float | str]:
    """The type of an option taking a value in [0, `high`] or the name of one of `estimators`,
    which chooses the value (`symbol` names it in the error)."""
    in_range = typed(float, f"in [0, {high:g}]", lambda v: 0 <= v <= high)

    def parse(text: str) -> float | str:
        if text in estimators:
            return text
        try:
            float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {symbol} in [0, {high:g}] or one of {', '.join(estimators)}, got "
                f"{text!r}") from None
        return in_range(text)

    return parse
