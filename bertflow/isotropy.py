"""How isotropic a set of embeddings is: cosines, spectrum, and the partition function."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.special import logsumexp

__all__ = [
    "condition_number",
    "effective_rank",
    "isotropy_measures",
    "mean_pair_cosine",
    "pair_cosines",
    "partition_isotropy",
    "singular_values",
]


def pair_cosines(x: np.ndarray | torch.Tensor, pairs: int = 10000, seed: int = 0) -> np.ndarray:
    """Cosine similarities of `pairs` random pairs of distinct rows of `x`."""
    if not isinstance(x, torch.Tensor):
        x = torch.from_numpy(np.array(x, dtype=np.float64))
    n = x.shape[0]
    if n < 2:
        return np.full(0, np.nan)
    g = torch.Generator().manual_seed(seed)
    i = torch.randint(n, (pairs,), generator=g)
    j = (i + torch.randint(1, n, (pairs,), generator=g)) % n
    x = x.detach().cpu()
    u, v = (torch.nn.functional.normalize(x[k].double(), dim=1) for k in (i, j))
    return (u * v).sum(1).numpy()


def mean_pair_cosine(x: np.ndarray | torch.Tensor, pairs: int = 10000, seed: int = 0) -> float:
    """Mean cosine of random pairs of distinct rows: near 0 for an isotropic cloud, near 1
    when every vector points the same way."""
    cosines = pair_cosines(x, pairs, seed)
    return float(cosines.mean()) if cosines.size else math.nan


def singular_values(x: np.ndarray) -> np.ndarray:
    """Singular values of the centred embeddings, largest first."""
    x = np.asarray(x, dtype=np.float64)
    return np.linalg.svd(x - x.mean(0), compute_uv=False)


def effective_rank(x: np.ndarray) -> float:
    r"""$\exp H(p)$ with $p_i = \sigma_i / \sum_j \sigma_j$ over the centred embeddings'
    singular values (Roy & Vetterli, 2007): the number of directions the data really uses;
    NaN when every row is the same."""
    s = singular_values(x)
    if not s.sum() > 0:
        return math.nan
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def condition_number(x: np.ndarray) -> float:
    """Largest over smallest singular value of the centred embeddings; inf when they are
    rank-deficient to float64 precision."""
    s = singular_values(x)
    if s[-1] <= s[0] * len(s) * np.finfo(np.float64).eps:
        return math.inf
    return float(s[0] / s[-1])


def partition_isotropy(x: np.ndarray) -> float:
    r"""$I(W) = \min_c Z(c) / \max_c Z(c)$ with $Z(c) = \sum_i \exp(c^\top w_i)$ (Mu &
    Viswanath, 2018), $c$ ranging over the eigenvectors of $W^\top W$ with both signs
    ($Z(c) \ne Z(-c)$), on L2-normalised rows so that methods with different output scales
    compare, as cosine does. 1 is perfectly isotropic; on unit vectors every vector pointing
    one way, $u$, gives $Z(u) = n e$ and $Z(-u) = n / e$, so $I = 1/e^2$."""
    w = np.asarray(x, dtype=np.float64)
    w = w / np.maximum(np.linalg.norm(w, axis=1, keepdims=True), 1e-12)
    _, _, directions = np.linalg.svd(w, full_matrices=False)
    projections = w @ directions.T
    log_z = logsumexp(np.concatenate([projections, -projections], axis=1), axis=0)
    return float(np.exp(log_z.min() - log_z.max()))


def isotropy_measures(x: np.ndarray) -> dict[str, float | None]:
    """The four measures reported beside every score; an infinite value becomes None."""
    values = {
        "mean_cosine": mean_pair_cosine(x),
        "effective_rank": effective_rank(x),
        "condition_number": condition_number(x),
        "isotropy": partition_isotropy(x),
    }
    return {k: (v if math.isfinite(v) else None) for k, v in values.items()}
