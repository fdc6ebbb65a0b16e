"""The methods compared without labels, and the STS and retrieval harnesses and diagnostics that
score them."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, (
    "diagnose", "methods", "retrieval", "sts",
))
