"""Fitting a flow head: the trainer, recipes, checkpoints, TensorBoard logs and the fit job."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "checkpoint": ("Checkpoint", "CheckpointFile", "open_checkpoint"),
    "job": ("FitJob", "FittedHead", "run_fit"),
    "spec": ("MethodSpec",),
    "recipes": ("BEFORE", "CORPORA", "ISOTROPIC", "ISOTROPIC_RECIPES", "NEAR", "RECIPES", "Recipe",
                "choose", "close_call", "corpus_note", "recommended", "rule_note"),
    "tensorboard": ("RunLogs", "TensorBoard"),
    "trainer": ("RECORD", "History", "Hook", "TrainConfig", "TrainState", "fit", "fit_head",
                "nll_text", "split_indices"),
})
