"""The `bertflow` command: parse arguments (`bertflow.cli.parser`), refuse those that cannot apply
before torch is imported (`bertflow.cli.checks` and each command's own `check`), run the command
(`bertflow.cli.commands`)."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import warnings
from typing import Any

from ..errors import BertflowWarning, PeerError, one_line
from .checks import check_inputs, check_options
from .commands import COMMANDS
from .parser import build_parser, upgrade

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    argv, notes = upgrade(sys.argv[1:] if argv is None else [str(a) for a in argv])
    for note in notes:
        print(f"bertflow: note: {note}; the old form goes in the next release", file=sys.stderr)
    args = build_parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = functools.partial(_show_warning, warnings.showwarning)
        return _main(args)


def _show_warning(show: Any, message: Warning | str, category: type[Warning], *args: Any,
                  **kwargs: Any) -> None:
    """bertflow's own warnings as one line on stderr; others as Python shows them."""
    if issubclass(category, BertflowWarning):
        print(f"bertflow: note: {message}", file=sys.stderr)
    else:
        show(message, category, *args, **kwargs)


def _main(args: argparse.Namespace) -> int:
    debug = args.debug or os.environ.get("BERTFLOW_DEBUG", "") not in ("", "0")
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1  # as `distributed.launched`
    try:
        check_options(args, launched)  # and the inputs, before torch is imported
        check_inputs(args)
        # oneDNN keeps memory for each matmul shape it has run (up to 1,024 of them), so an
        # encode's peak grew with the corpus's variety of batch shapes; unmeasurably slower off
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")
        if getattr(COMMANDS[args.command], "COMPUTES", True):  # else torch is not imported
            from ..runtime import distributed

            distributed.use_available_cpus()
            if launched:  # only commands that compute run under torchrun (check_options)
                args.device = distributed.join(args.device)
        args.run(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
    except PeerError:
        return 1  # the process that failed says why
    except KeyboardInterrupt:
        print("bertflow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of the output went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # every failure ends in one line, unless asked for the traceback
        if debug:
            raise
        where = f"[rank {os.environ.get('RANK', '?')}] " if launched else ""
        print(f"bertflow: error: {where}{one_line(e)}", file=sys.stderr)
        return 1
    finally:
        if launched:
            from ..runtime import distributed

            distributed.leave()
    return 0
