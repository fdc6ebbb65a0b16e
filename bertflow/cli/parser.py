"""The `bertflow` command line's arguments; nothing heavy is imported: `--help` is instant."""

from __future__ import annotations

import argparse
import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .. import __version__
from ..config import FLOW_CEILINGS
from ..constants import (
    BEFORE,
    DEFAULT_BATCH_SIZE,
    DEFAULT_ENCODER_NAME,
    DEFAULT_MAX_LENGTH,
    DEFAULT_POOLING,
    DTYPES,
    HNSW_DEFAULTS,
    LINEAR_METHODS,
    METHODS,
    POOLINGS,
    TASKS,
)

__all__ = ["EXPORT_FORMATS", "build_parser", "upgrade"]

EXPORT_FORMATS = ("sentence-transformers", "onnx", "torch-export")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option with its default (where it has one worth showing); descriptions as is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if any(action.default is v for v in (None, False, argparse.SUPPRESS)) \
                or "%(default)" in text:
            return text
        return super()._get_help_string(action) or text


class _Refused(argparse.Action):
    """An option that means something else here: refused, saying what (its `const`)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        raise argparse.ArgumentError(self, self.const)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(run: Mapping[str, Callable[[argparse.Namespace], None]]) -> _Parser:
    """The parser of every command; a command's arguments carry `run[command]` as `run`."""
    parser = _Parser(prog="bertflow", description=_DESCRIPTION, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"bertflow {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a failure (or set BERTFLOW_DEBUG=1)")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (add, summary, description) in _COMMANDS.items():
        p = commands.add_parser(name, help=summary, description=description,
                                formatter_class=_Formatter)
        add(p)
        p.set_defaults(run=run[name])
    return parser


def upgrade(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """`argv` with the forms of the last release rewritten as today's, and a note for each:
    `eval --data DATA` is `eval sts DATA`, `eval --retrieval DIR` is `eval retrieval DIR`,
    eval's `--json PATH` is `--out PATH` (`--json` alone prints the rows), and fit's and
    eval's `--k K` is `--dims K`."""
    argv, notes = list(argv), []
    at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if at is None or argv[at] not in ("eval", "fit"):
        return argv, notes
    head, rest = argv[: at + 1], argv[at + 1 :]
    for i, arg in enumerate(rest):
        if arg == "--k" or arg.startswith("--k="):
            rest[i] = "--dims" + arg[3:]
            notes.append("`--k` is now `--dims` (the components whitening-k keeps, as an "
                         "index's --dims)")
    if argv[at] == "fit":
        return head + rest, notes
    if not rest or rest[0] not in ("sts", "retrieval", "-h", "--help"):
        for old, kind in (("--data", "sts"), ("--retrieval", "retrieval")):
            found = _take(rest, old)
            if found is not None:
                rest = [kind, found, *rest]
                notes.append(f"`eval {old} {found}` is now `eval {kind} {found}`")
                break
    for i, arg in enumerate(rest[:-1]):
        if arg == "--json" and not rest[i + 1].startswith("-"):
            rest[i] = "--out"
            notes.append(f"eval's `--json {rest[i + 1]}` is now `--out {rest[i + 1]}` "
                         "(`--json` alone prints the rows as JSON)")
    return head + rest, notes


def _take(args: list[str], option: str) -> str | None:
    """The value of `option` (`--x V` or `--x=V`), removed from `args`; None if absent."""
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            value = args[i + 1]
            del args[i : i + 2]
            return value
        if arg.startswith(option + "="):
            del args[i]
            return arg.split("=", 1)[1]
    return None


_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], str, str]] = {}


def _command(name: str, summary: str, description: str) -> Callable[[Any], Any]:
    """Register the function below as the one that adds command `name`'s options."""
    def register(add: Callable[[argparse.ArgumentParser], None]) -> Any:
        _COMMANDS[name] = (add, summary, textwrap.dedent(description).strip())
        return add

    return register


@_command("encode", "embed a corpus (one sentence per line, or BEIR's) into .npy", """
        Embed every line of CORPUS (of a BEIR corpus.jsonl: title and text) with a frozen
        encoder and a pooling into EMB.npy (float32, one row per line) and its sidecar
        EMB.meta.json; resumable, and across processes
        under torchrun. An encode interrupted at --out is neither continued nor discarded
        without --resume or --restart.""")
def _encode(p: argparse.ArgumentParser) -> None:
    p.add_argument("corpus", type=Path, help=_CORPUS_HELP)
    p.add_argument("--out", type=Path, required=True, help="EMB.npy (+ EMB.meta.json)")
    _encoder_options(p)
    interrupted = p.add_mutually_exclusive_group()
    interrupted.add_argument("--resume", action="store_true",
                             help="continue an interrupted encode of the same request where "
                                  "it stopped")
    interrupted.add_argument("--restart", action="store_true",
                             help="discard an interrupted encode at --out and start afresh")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--cache", type=Path, default=None, help=_CACHE_HELP + ", read and filled")
    cache.add_argument("--no-cache", action="store_true", help="neither read nor fill the cache")
    _quiet(p)


@_command("fit", "fit a flow head on a corpus or on embeddings", """
        Fit a Glow by maximum likelihood on the embeddings of CORPUS (encoded and cached) or
        of EMB.npy, and save it as a head folder that records its encoder and pooling. With
        --method whitening, whitening-k or abtt, fit that baseline in closed form instead, as
        a head of the same format.""")
def _fit(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, help="CORPUS.txt, or EMB.npy made by `bertflow encode`")
    p.add_argument("--out", type=Path, required=True, help="folder to write the head to")
    p.add_argument("--method", choices=("flow", *LINEAR_METHODS), default="flow",
                   help="the flow, or a closed-form baseline: BERT-whitening, whitening to "
                        "--dims components, all-but-the-top (--d directions)")
    _baseline_options(p)
    _encoder_options(p, f"the embeddings' sidecar's, else {_FOLDERS_POOLING}",
                     f"{_FOLDERS_MAX_LENGTH}; for a .npy, its sidecar's")
    p.add_argument("--cache", type=Path, default=None, help=_CACHE_HELP)
    g = _flow_arguments(p)
    g.add_argument("--logdir", type=Path, default=None,
                   help="write TensorBoard logs to a new subfolder TIME-seedN of this folder "
                        "(removed if the fit fails and cannot be resumed; a run resumed from "
                        "--checkpoint continues the subfolder the checkpoint names)")
    g.add_argument("--checkpoint", type=Path, default=None,
                   help="training state, saved each epoch; a file of its own: never an input "
                        "or output of the run, nor an existing file other than a checkpoint "
                        "of this same run")
    g.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint, a run of the same settings and data; a "
                        "larger --epochs extends it (from where it resumes, the learning rate "
                        "follows the cosine over the new total)")
    g.add_argument("--dev-sts", type=Path, default=None, metavar="DATA",
                   help="after each epoch, score the STS-B dev set of DATA (SentEval's layout: "
                        "DATA/STSBenchmark/sts-dev.csv), embedded like the training "
                        "embeddings, and print and log its Spearman")
    _quiet(g)


@_command("transform", "apply a head to sentences or embeddings", """
        Transform sentences (encoded with the head's encoder and pooling) or embeddings from
        `bertflow encode` with a head, into OUT.npy and a sidecar that records the head.""")
def _transform(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", type=Path, required=True, help=_HEAD_HELP)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--sentences", type=Path, help="text file, one sentence per line")
    source.add_argument("--embeddings", type=Path, help="EMB.npy made by `bertflow encode`")
    p.add_argument("--out", type=Path, required=True, help="OUT.npy (+ OUT.meta.json)")
    p.add_argument("--encoder", default=None, help=_ENCODER_OF_HEAD)
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="how --embeddings without a sidecar were pooled (checked against the "
                   "head)")
    p.add_argument("--encode-batch-size", dest="encode_batch_size", type=positive,
                   default=DEFAULT_BATCH_SIZE, help="sentences per encoder batch")
    p.add_argument("--cache", type=Path, default=None, help=_CACHE_HELP + " (--sentences)")
    _device_options(p)
    _quiet(p)


@_command("eval", "score STS tasks (eval sts) or a BEIR retrieval task (eval retrieval)", """
        `bertflow eval sts DATA` and `bertflow eval retrieval DIR`: a fitted head, or a method
        fit without labels, scored against human judgements. `bertflow eval sts --help` and
        `bertflow eval retrieval --help` show each one's options.""")
def _eval(p: argparse.ArgumentParser) -> None:
    kinds = p.add_subparsers(dest="eval_kind", required=True, parser_class=_Parser,
                             metavar="{sts,retrieval}")
    sts = kinds.add_parser("sts", formatter_class=_Formatter, help="Spearman on STS tasks",
                           description=textwrap.dedent("""
        Spearman correlation × 100 of cosine similarity with human scores on the STS tasks
        found in DATA (SentEval's layout), for a fitted head or for a method fit on each task's
        own sentences (no scores) or on text files.""").strip())
    sts.add_argument("data", type=Path, metavar="DATA", help="folder in SentEval's layout")
    sts.add_argument("--tasks", nargs="+", choices=TASKS, default=None,
                     help="STS tasks to score, where DATA has them (default: all)")
    _eval_options(sts, "'target' (each task's own sentences, no scores), text "
                  "files, or both: 'target FILE' fits each task on its own sentences and the "
                  "file's (default: target)")
    sts.set_defaults(retrieval=None, split=None, ignore_identical_ids=None, mteb=None)
    retrieval = kinds.add_parser(
        "retrieval", formatter_class=_Formatter, help="nDCG@10 and more on a BEIR task",
        description=textwrap.dedent("""
        A BEIR task's split: all documents ranked by cosine per query, scored as MTEB does
        with pytrec_eval (nDCG@10, MAP@100, MRR@10, recall@100; --mteb writes MTEB's result
        file with every measure at k 1, 3, 5, 10, 20, 100, 1000); the method never sees the
        qrels.""").strip())
    retrieval.add_argument("retrieval", type=Path, metavar="DIR",
                           help="a BEIR task's folder: corpus.jsonl, queries.jsonl, "
                           "qrels/SPLIT.tsv")
    retrieval.add_argument("--split", choices=("test", "train", "dev"), default=None,
                           help="the qrels scored (default: test)")
    retrieval.add_argument(
        "--ignore-identical-ids", action=argparse.BooleanOptionalAction, default=None,
        help="leave a document whose id is the query's out of its ranking (default: as MTEB "
        "does for the task: yes for arguana, quora, fiqa, msmarco and fever, no for the others)")
    retrieval.add_argument("--mteb", type=Path, default=None, metavar="FOLDER",
                           help="also write MTEB's result file of the task (TASK.json, MTEB's "
                           "task name) into this folder of a model's results")
    _eval_options(retrieval, "'corpus' (the documents), 'queries' (the split's), "
                  "text files, or several together (default: corpus)")
    retrieval.set_defaults(data=None, tasks=None)


def _eval_options(p: argparse.ArgumentParser, fit_on_help: str) -> None:
    """What `eval sts` and `eval retrieval` share: what is scored, and where the rows go."""
    which = p.add_mutually_exclusive_group()
    which.add_argument("--head", type=Path, help="score a fitted head (its encoder and pooling)")
    which.add_argument("--method", choices=METHODS, default=None,
                       help="the method fit here (default: flow)")
    p.add_argument("--fit-on", nargs="+", default=None, metavar="SOURCE", help=fit_on_help)
    _baseline_options(p)
    p.add_argument("--out", type=Path, default=None, metavar="ROWS.json",
                   help="also write the rows here")
    p.add_argument("--json", action="store_true", help="print the rows as JSON, not tables")
    _head_or_flow_options(p)


@_command("diagnose", "plot anisotropy before and after a flow", """
        PNG plots of SENTENCES' embeddings before and after a head (or a flow fit on them):
        singular-value spectrum, pair cosines, projection; of the encoder's input word
        embeddings: norms by token frequency, top two singular directions coloured by
        frequency, singular values; and, with --data, every method's alignment against
        uniformity on STS-B.""")
def _diagnose(p: argparse.ArgumentParser) -> None:
    p.add_argument("sentences", type=Path, help="text file, one sentence per line")
    p.add_argument("--out", type=Path, required=True, help="folder for the PNG plots")
    p.add_argument("--head", type=Path, default=None,
                   help="apply this head (default: fit a flow on the sentences)")
    p.add_argument("--corpus", type=Path, default=None,
                   help="text whose token frequencies to plot (default: the sentences)")
    p.add_argument("--data", type=Path, default=None,
                   help="folder in SentEval's layout: also plot alignment_uniformity.png, every "
                        "method fit on SENTENCES (the flow: --head, if given) placed by its "
                        "uniformity and alignment on the STS-B dev and test pairs (alignment: "
                        "those with gold ≥ 4); without it, that plot is left out")
    _head_or_flow_options(p)


@_command("export", "write a head for use without bertflow's CLI", """
        A sentence-transformers folder (encoder, pooling and head; load it with
        bertflow.export.pipeline.load_pipeline), a self-contained ONNX file, or a torch.export
        program.""")
def _export(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", type=Path, required=True, help=_HEAD_HELP)
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS, help="what to write")
    p.add_argument("--out", type=Path, required=True,
                   help="a folder (sentence-transformers), HEAD.onnx or HEAD.pt2")
    p.add_argument("--encoder", default=None,
                   help="encoder of a sentence-transformers pipeline (default: the head's)")
    p.add_argument("--normalize", action="store_true",
                   help="end the sentence-transformers pipeline with L2 normalisation")


@_command("index", "build a FAISS index of a corpus for search", """
        Encode CORPUS (one item per line, or a BEIR corpus.jsonl), transform it with a head,
        and write a FAISS index of unit vectors (inner product = cosine) and the items' ids
        (a BEIR document's _id, else its line) that `bertflow search` queries.""")
def _index(p: argparse.ArgumentParser) -> None:
    p.add_argument("corpus", type=Path, help=_CORPUS_HELP)
    p.add_argument("--out", type=Path, required=True, help="index folder")
    p.add_argument("--head", type=Path, default=None, help="transform with this head, its "
                   "encoder and pooling (default: raw pooled vectors)")
    _encoder_options(p, _HEADS_POOLING, _HEADS_MAX_LENGTH)
    p.add_argument("--kind", default="flat", help="flat (exact), hnsw, or a FAISS index_factory "
                   "string (IVF1024,PQ32; trained on a seeded sample of the corpus)")
    p.add_argument("--dims", type=positive, default=None,
                   help="keep this many principal components, for a smaller index (default: all)")
    g = p.add_argument_group("hnsw", "The graph of --kind hnsw (FAISS's names; recorded)")
    g.add_argument("--hnsw-m", type=_integer(2), default=None, metavar="M",
                   help=f"neighbours a node (default: {HNSW_DEFAULTS['M']})")
    g.add_argument("--ef-construction", type=positive, default=None, metavar="N",
                   help=f"candidates kept while building (default: "
                   f"{HNSW_DEFAULTS['ef_construction']})")
    g.add_argument("--ef-search", type=positive, default=None, metavar="N",
                   help=f"candidates kept while searching, saved with the index (default: "
                   f"{HNSW_DEFAULTS['ef_search']})")
    p.add_argument("--cache", type=Path, default=None, help=_CACHE_HELP)
    _quiet(p)


@_command("search", "query an index built by `bertflow index`", """
        The TOP nearest items of each query, by cosine after the index's head: rank, score,
        id (a BEIR document's _id, else the line of the corpus) and the item. --json prints
        one JSON object a query: its id, text and hits (id, score, item, line).""")
def _search(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", type=Path, required=True, help="folder made by `bertflow index`")
    queries = p.add_mutually_exclusive_group(required=True)
    queries.add_argument("--query", action="append", help="a query; repeat for several")
    queries.add_argument("--queries", type=Path, help="BEIR queries.jsonl, or one query a line")
    p.add_argument("--top", type=positive, default=10, help="hits per query")
    p.add_argument("--nprobe", type=positive, default=None,
                   help="inverted lists visited per query, IVF kinds (default: the index's)")
    p.add_argument("--ef-search", type=positive, default=None, metavar="N",
                   help="candidates kept while searching an HNSW graph (default: the index's)")
    p.add_argument("--k", action=_Refused, nargs="?", help=argparse.SUPPRESS,
                   const="hits per query are --top")
    p.add_argument("--encoder", default=None, help="encoder (default: the index's)")
    p.add_argument("--encode-batch-size", dest="encode_batch_size", type=positive,
                   default=DEFAULT_BATCH_SIZE, help="queries per encoder batch")
    p.add_argument("--cache", type=Path, default=None, help=_CACHE_HELP)
    _device_options(p)
    p.add_argument("--json", action="store_true", help="print JSON lines")
    _quiet(p)


@_command("info", "describe a head, or list the ready heads", """
        What a head is (encoder, pooling, flow, how it was fit). Without HEAD, the ready heads
        that come with bertflow, loadable by name.""")
def _info(p: argparse.ArgumentParser) -> None:
    p.add_argument("head", type=Path, nargs="?", default=None, help=_HEAD_HELP)
    p.add_argument("--json", action="store_true", help="print the head's config.json")


@_command("recipes", "print each pooling's recommended flow recipe", """
    The settings `bertflow fit` and `bertflow eval --method flow` start from, per pooling
    (bertflow.training.recipes): what comes before the flow, the flow, its training, and the kind of
    text the recipe was chosen on; where a recipe whitens, the one used instead when the
    embeddings the flow is fit on are already isotropic. An option given to those commands
    changes only itself.""")
def _recipes(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="print this pooling's recipe only")


_DESCRIPTION = """\
Isotropic sentence embeddings with a normalizing flow (BERT-flow): encode a corpus, fit a flow
head on it, and use the head to transform embeddings before cosine similarity, in STS
evaluation, plots, exports and search. `bertflow COMMAND --help` tells more."""
_HEAD_HELP = "a head folder, or the name of a ready head (`bertflow info` lists them)"
_ENCODER_OF_HEAD = ("encoder folder (default: the one the head records, checked against its "
                    "fingerprint)")
# an encoder folder's own sentence-transformers settings, where it has them, are the defaults
_FOLDERS_POOLING = f"the encoder folder's own (modules.json), else {DEFAULT_POOLING}"
_FOLDERS_MAX_LENGTH = (f"the encoder folder's own (sentence_bert_config.json), else "
                       f"{DEFAULT_MAX_LENGTH}")
_HEADS_POOLING = f"the head's, else {_FOLDERS_POOLING}"
_HEADS_MAX_LENGTH = f"the head's, else {_FOLDERS_MAX_LENGTH}"
_CORPUS_HELP = "text file of one sentence a line, or a BEIR corpus.jsonl (a file named *.jsonl)"
_CACHE_HELP = ("embedding cache folder (default: $BERTFLOW_CACHE/embeddings, else "
               "~/.cache/bertflow/embeddings)")


def _quiet(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--quiet", action="store_const", const=False, dest="progress",
                   help="no progress bars or epoch lines")


def _baseline_options(p: argparse.ArgumentParser) -> None:
    # the defaults are bertflow.heads.linear.default_k and default_d
    p.add_argument("--dims", dest="k", type=positive, default=None, metavar="K",
                   help="components kept by whitening-k (default: a third of the dimension); "
                        "--method whitening --dims K is whitening-k keeping K")
    p.add_argument("--d", type=natural, default=None,
                   help="directions removed by abtt (default: a hundredth of the dimension)")
    p.add_argument("--shrinkage", type=unit, default=None, metavar="ALPHA",
                   help="shrink whitening's covariance towards a multiple of the identity: "
                        "(1−α)Σ + α·tr Σ/n·I (default: 0)")


def _head_or_flow_options(p: argparse.ArgumentParser) -> None:
    """The encoder (the head's by default), the cache, and the flow fit without a head."""
    _encoder_options(p, _HEADS_POOLING, _HEADS_MAX_LENGTH)
    p.add_argument("--cache", type=Path, default=None, help=_CACHE_HELP)
    _quiet(_flow_arguments(p))


def _encoder_options(p: argparse.ArgumentParser, pooling_help: str = _FOLDERS_POOLING,
                     max_length_help: str = _FOLDERS_MAX_LENGTH) -> None:
    """The encoder's options; pooling and max length are None where not given."""
    p.add_argument("--encoder", default=None,
                   help=f"Hugging Face encoder folder (default: {DEFAULT_ENCODER_NAME}, which "
                        "comes with bertflow)")
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help=f"how token states become one vector (default: {pooling_help})")
    p.add_argument("--max-length", type=max_length_type, default=None,
                   help=f"tokens per sentence; longer sentences are truncated (default: "
                   f"{max_length_help})")
    p.add_argument("--encode-batch-size", dest="encode_batch_size", type=positive,
                   default=DEFAULT_BATCH_SIZE, help="sentences per encoder batch")
    _device_options(p)


def _device_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when present), cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="precision of the encoder (embeddings and files stay float32)")


def _flow_arguments(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
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
    g.add_argument("--seed", type=seed_type, default=None,
                   help="seeds the split, order and weights (default: 0)")
    g.add_argument("--epochs", type=positive, default=None,
                   help="passes over the data (default: the recipe's)")
    g.add_argument("--batch-size", type=positive, default=None,
                   help="embeddings per flow minibatch (default: the recipe's)")
    g.add_argument("--lr", type=positive_float, default=None,
                   help="Adam's learning rate, decayed along a cosine (default: the recipe's)")
    g.add_argument("--val-fraction", type=fraction, default=None,
                   help="held-out share of the rows, in [0, 1) (default: the recipe's)")
    g.add_argument("--patience", type=natural, default=None,
                   help="epochs without a better held-out NLL before stopping; 0 never stops "
                        "(default: the recipe's)")
    return g


def _typed(kind: type, wanted: str, holds: Callable[[Any], bool]) -> Callable[[str], Any]:
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


def _integer(low: int, high: int | None = None) -> Callable[[str], int]:
    bounds = f"at least {low}" if high is None else f"in [{low}, {high})"
    return _typed(int, f"an integer {bounds}", lambda v: low <= v and (high is None or v < high))


def ceiling(name: str) -> Callable[[str], int]:
    """The type of a flow architecture option: a positive integer up to its ceiling."""
    return _integer(1, FLOW_CEILINGS[name] + 1)


positive = _integer(1)
natural = _integer(0)
max_length_type = _integer(2)
seed_type = _integer(0, 2**32)
positive_float = _typed(float, "positive", lambda v: v > 0)
fraction = _typed(float, "in [0, 1)", lambda v: 0 <= v < 1)
unit = _typed(float, "in [0, 1]", lambda v: 0 <= v <= 1)
