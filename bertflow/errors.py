"""The one exception type bertflow raises for bad input, and a failure told in one line."""

__all__ = ["BertflowError", "BertflowWarning", "PeerError", "first_line", "one_line"]


class BertflowError(ValueError):
    """Bad input: a missing or malformed file, a mismatched head, non-finite values; its message
    is one line meant for the user, which the CLI prints before it exits non-zero."""


class BertflowWarning(UserWarning):
    """Something the user should know that changes no result: a slower path taken, a choice
    made near its threshold; the CLI prints it as one line."""


class PeerError(BertflowError):
    """Another process of the same torchrun job failed; it reports the error itself."""


def first_line(error: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type's name."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def one_line(error: Exception) -> str:
    """What a failure says in one line: bertflow's own message, an OS error with its file, or
    anything else with its kind and a pointer to --debug."""
    if isinstance(error, BertflowError):
        return str(error)
    if isinstance(error, OSError):
        name = f": {error.filename}" if error.filename else ""
        return f"{error.strerror or first_line(error)}{name}"
    return (f"unexpected {type(error).__name__}: {first_line(error)} (run with --debug for "
            "the traceback)")
