"""The one exception type bertflow raises for bad input."""

__all__ = ["BertflowError", "PeerError", "first_line"]


class BertflowError(ValueError):
    """Bad input: a missing or malformed file, a mismatched head, non-finite values.

    The message is one line meant for the user; the CLI prints it and exits non-zero.
    """


class PeerError(BertflowError):
    """Another process of the same torchrun job failed; it reports the error itself."""


def first_line(error: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type's name."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__
