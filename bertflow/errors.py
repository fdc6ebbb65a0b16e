"""The one exception type bertflow raises for bad input."""

__all__ = ["BertflowError"]


class BertflowError(ValueError):
    """Bad input: a missing or malformed file, a mismatched head, non-finite values.

    The message is one line meant for the user; the CLI prints it and exits non-zero.
    """
