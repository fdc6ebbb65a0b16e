"""Readers of public datasets: SentEval's STS tasks, BEIR retrieval tasks, the Lee corpus."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, (
    "beir", "lee", "sts",
))
