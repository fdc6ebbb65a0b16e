"""The names the library and its command line share (poolings, precisions, methods, tasks) and
their defaults, in a module that imports nothing heavy, so that `bertflow --help` is instant."""

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_ENCODER_NAME", "DEFAULT_MAX_LENGTH", "DEFAULT_POOLING",
           "DTYPES", "FEEDBACK_BETA", "GAMMA_ESTIMATORS", "LINEAR_METHODS", "LINEAR_OPTIONS",
           "METHODS", "POOLINGS", "PROGRESS_FROM", "PROXY_KINDS", "SHRINKAGE_ESTIMATORS", "TASKS"]

POOLINGS = ("cls", "mean", "first_last", "last2", "static")
DEFAULT_POOLING = "first_last"
DEFAULT_ENCODER_NAME = "all-MiniLM-L6-v2"
DTYPES = ("float32", "bfloat16", "float16", "int8")
DEFAULT_BATCH_SIZE = 32  # sentences per encoder batch
DEFAULT_MAX_LENGTH = 128  # tokens
PROGRESS_FROM = 500  # sentences: encoding at least this many shows a progress bar
BEFORE = ("standardize", "whiten", "none")  # what a flow head applies before its Glow
# those a head can be, besides a flow: closed-form linear maps (`bertflow.heads.linear`)
LINEAR_METHODS = ("identity", "center", "no-mean-direction", "whitening", "whitening-k",
                  "fractional", "pca", "abtt")
METHODS = ("raw", "standardize", *LINEAR_METHODS, "flow")
PROXY_KINDS = ("retrieval", "sts")  # the label-free tasks a head is chosen on (`fit --for`)
# the linear methods each option applies to: components kept, directions removed (abtt), the
# covariance's shrinkage (α, or an estimator of `SHRINKAGE_ESTIMATORS`), the whitening's power
LINEAR_OPTIONS = {"k": ("whitening", "whitening-k", "fractional", "pca"), "d": ("abtt",),
                  "shrinkage": ("whitening", "whitening-k", "fractional"),
                  "gamma": ("fractional",)}
SHRINKAGE_ESTIMATORS = ("ledoit-wolf", "oas", "likelihood")
GAMMA_ESTIMATORS = ("spectrum",)  # fractional whitening's γ chosen from the eigenspectrum
TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R")
# how far pseudo-relevance feedback moves a query towards its first hits (its β)
FEEDBACK_BETA = 0.5
# `hnsw`'s graph: neighbours a node (FAISS's M; 2M on the ground layer), candidates kept while
# it is built (efConstruction) and while it is searched (efSearch); FAISS's defaults but M
HNSW_DEFAULTS = {"M": 32, "ef_construction": 40, "ef_search": 16}
