"""The `bertflow` command: its parser, the checks of its options, and a module per command."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, ("checks", "main"))
