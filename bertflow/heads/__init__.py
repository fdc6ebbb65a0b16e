"""What is applied to embeddings before cosine: the Glow, linear maps, the head module and its
format, density scores, and the heads that come with bertflow."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "catalog": ("head_folder", "ready_heads"),
    "density": ("auroc", "novelty", "typicality"),
    "flow": ("ActNorm", "AdditiveCoupling", "AffineCoupling", "Conditioner", "FlowConfig", "Glow",
             "InvertibleLinear", "StandardScaler", "bits_per_dim", "live_scale", "log_likelihood",
             "robust_std"),
    "format": ("CONFIG", "FORMAT", "FORMAT_VERSION", "WEIGHTS", "head_config", "load_head",
               "save_head", "write_head"),
    "head": ("FlowHead", "Head", "training_rows"),
    "linear": ("LINEAR_METHODS", "NO_VARIANCE", "LinearMap", "covariance", "default_d",
               "default_k", "fit_map", "linear_method", "linear_options", "principal_directions",
               "shrunk", "whitening_weight"),
})
