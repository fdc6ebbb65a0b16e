"""The `bertflow` command: its parser, the checks of its options, and what each command runs."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "checks": ("FLOW_FIELDS", "TRAIN_FIELDS", "check_inputs", "check_options", "check_paths"),
    "main": ("build_parser", "main"),
    "parser": ("EXPORT_FORMATS",),
})
