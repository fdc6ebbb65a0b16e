"""The `bertflow` command: its parser, the checks of its options, and a module per command."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "checks": ("FLOW_FIELDS", "TRAIN_FIELDS", "check_inputs", "check_options", "check_paths"),
    "commands.export": ("EXPORT_FORMATS",),
    "main": ("build_parser", "main"),
})
