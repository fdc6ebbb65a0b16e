"""The parser of `bertflow`: every command's arguments (`bertflow.cli.commands`), and the
forms of the last release rewritten as today's (`upgrade`)."""

from __future__ import annotations

from collections.abc import Sequence

from .. import __version__
from .commands import COMMANDS
from .options import Formatter, Parser

__all__ = ["build_parser", "upgrade"]


def build_parser() -> Parser:
    """The parser of every command; a command's arguments carry its module's `run` (and
    `check`, None where it has none)."""
    parser = Parser(prog="bertflow", description=_DESCRIPTION, formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=f"bertflow {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a failure (or set BERTFLOW_DEBUG=1)")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, module in COMMANDS.items():
        p = commands.add_parser(name, help=module.SUMMARY, description=module.DESCRIPTION,
                                formatter_class=Formatter)
        module.arguments(p)
        p.set_defaults(run=module.run, check=getattr(module, "check", None))
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
    if rest and rest[0] in ("sts", "retrieval", "-h", "--help"):
        return head + rest, notes  # today's form: its --json is a flag
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


_DESCRIPTION = """\
Isotropic sentence embeddings with a normalizing flow (BERT-flow): encode a corpus, fit a flow
head on it, and use the head to transform embeddings before cosine similarity, in STS
evaluation, plots, exports and search. `bertflow COMMAND --help` tells more."""
