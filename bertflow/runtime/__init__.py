"""Where the code runs: devices and precision, processes under torchrun and their threads."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, (
    "devices", "distributed",
))
