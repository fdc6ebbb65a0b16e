"""Fitting a flow head: the trainer, recipes, checkpoints, TensorBoard logs and the fit job."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, (
    "checkpoint", "job", "recipes", "spec", "tensorboard", "trainer",
))
