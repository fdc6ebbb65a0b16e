"""How isotropic embeddings are: cosines, spectrum, partition function, alignment, uniformity."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.special import logsumexp

from ..errors import BertflowError
from ..storage.rows import Rows, as_rows, blocks

__all__ = ["alignment", "condition_number", "effective_rank", "isotropy_measures", "mean_cosine",
           "mean_pair_cosine", "pair_cosines", "partition_isotropy", "singular_values",
           "uniformity"]


def pair_cosines(x: np.ndarray | torch.Tensor | Rows, pairs: int = 10000,
                 seed: int = 0) -> np.ndarray:
    """Cosine similarities of `pairs` random pairs of distinct rows of `x` (only those rows are
    read from `Rows` such as an `EmbeddingFile`)."""
    if x.shape[0] < 2:
        return np.full(0, np.nan)
    u, v = (_unit(_take(x, k)) for k in _random_pairs(x.shape[0], pairs, seed))
    return (u * v).sum(1).numpy()


def mean_pair_cosine(x: np.ndarray | torch.Tensor | Rows, pairs: int = 10000,
                     seed: int = 0) -> float:
    """Mean cosine of random pairs of distinct rows: near 0 for an isotropic cloud."""
    cosines = pair_cosines(x, pairs, seed)
    return float(cosines.mean()) if cosines.size else math.nan


def mean_cosine(x: np.ndarray | torch.Tensor | Rows) -> float:
    r"""The mean cosine over all pairs of distinct rows, exactly: with $u_i$ the unit rows (a
    zero row has cosine 0 with every row), $(\lVert \sum_i u_i \rVert^2 - \sum_i \lVert u_i
    \rVert^2) / (n(n-1))$, in one streamed pass in float64; the order of the rows changes it by
    rounding alone. NaN for fewer than two rows."""
    rows = as_rows(x)
    n = rows.shape[0]
    if n < 2:
        return math.nan
    total, squares = np.zeros(rows.shape[1]), 0.0
    for _, block in blocks(rows):
        block = block.astype(np.float64)
        norms = np.linalg.norm(block, axis=1, keepdims=True)
        u = np.divide(block, norms, out=np.zeros_like(block), where=norms > 0)
        total += u.sum(0)
        squares += float((u * u).sum())
    return float((total @ total - squares) / (n * (n - 1)))


def singular_values(x: np.ndarray) -> np.ndarray:
    """Singular values of the centred embeddings, largest first."""
    x = np.asarray(x, dtype=np.float64)
    return np.linalg.svd(x - x.mean(0), compute_uv=False)


def effective_rank(x: np.ndarray) -> float:
    r"""$\exp H(p)$, $p_i = \sigma_i / \sum_j \sigma_j$ over the centred embeddings' singular
    values (Roy & Vetterli, 2007); NaN when every row is the same."""
    s = singular_values(x)
    if not s.sum() > 0:
        return math.nan
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def condition_number(x: np.ndarray) -> float:
    """Largest over smallest singular value of the centred embeddings; inf if rank-deficient."""
    s = singular_values(x)
    if s[-1] <= s[0] * len(s) * np.finfo(np.float64).eps:
        return math.inf
    return float(s[0] / s[-1])


def partition_isotropy(x: np.ndarray) -> float:
    r"""$I(W) = \min_c Z(c) / \max_c Z(c)$ with $Z(c) = \sum_i \exp(c^\top w_i)$ (Mu &
    Viswanath, 2018), $c$ over the eigenvectors of $W^\top W$ with both signs, on unit rows so
    that methods of other output scales compare: 1 is isotropic, $1/e^2$ one direction."""
    w = np.asarray(x, dtype=np.float64)
    w = w / np.maximum(np.linalg.norm(w, axis=1, keepdims=True), 1e-12)
    _, _, directions = np.linalg.svd(w, full_matrices=False)
    projections = w @ directions.T
    log_z = logsumexp(np.concatenate([projections, -projections], axis=1), axis=0)
    return float(np.exp(log_z.min() - log_z.max()))


def isotropy_measures(x: np.ndarray) -> dict[str, float | None]:
    """The four measures of the embeddings alone reported beside every score; inf is None."""
    values = {"mean_cosine": mean_pair_cosine(x), "effective_rank": effective_rank(x),
              "condition_number": condition_number(x), "isotropy": partition_isotropy(x)}
    return {k: (v if math.isfinite(v) else None) for k, v in values.items()}


def alignment(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor,
              alpha: float = 2) -> float:
    r"""$\ell_\text{align} = \mathbb{E} \lVert f(x_i) - f(y_i) \rVert^\alpha$ over the pairs of
    rows of `x` and `y`, $f$ the L2 normalisation (Wang & Isola, 2020); NaN without pairs."""
    x, y = _tensor(x), _tensor(y)
    if x.shape != y.shape:
        raise BertflowError(f"alignment needs pairs of rows of one shape, got "
                            f"{tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] == 0:
        return math.nan
    return float((_unit(x) - _unit(y)).norm(dim=1).pow(alpha).mean())


def uniformity(x: np.ndarray | torch.Tensor, t: float = 2, pairs: int = 10000,
               seed: int = 0) -> float:
    r"""$\ell_\text{uniform} = \log \mathbb{E}_{u \ne v} \exp(-t \lVert f(u) - f(v) \rVert^2)$
    over every pair of distinct rows, or `pairs` random ones (Wang & Isola, 2020)."""
    x = _tensor(x)
    n = x.shape[0]
    if n < 2:
        return math.nan
    every = n * (n - 1) // 2 <= pairs
    i, j = torch.triu_indices(n, n, offset=1) if every else _random_pairs(n, pairs, seed)
    squared = (_unit(x[i]) - _unit(x[j])).pow(2).sum(1)
    return float(torch.logsumexp(-t * squared, 0) - math.log(len(squared)))


def _tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    return torch.from_numpy(np.array(x, dtype=np.float64))


def _take(x: np.ndarray | torch.Tensor | Rows, rows: torch.Tensor) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()[rows]
    if hasattr(x, "take") and hasattr(x, "read"):
        return torch.from_numpy(x.take(rows.numpy()))
    return torch.from_numpy(np.asarray(x)[rows.numpy()])


def _unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.double(), dim=1)


def _random_pairs(n: int, pairs: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    i = torch.randint(n, (pairs,), generator=g)
    j = (i + torch.randint(1, n, (pairs,), generator=g)) % n
    return i, j
