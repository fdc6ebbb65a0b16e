"""Closed-form linear maps: the identity, centring, the mean direction projected out, BERT-whitening
(Su et al., 2021), whitening-k, fractional whitening, PCA and all-but-the-top; whitening's
covariance optionally shrunk towards a multiple of the identity, by a given α or one chosen from
the embeddings alone (Ledoit-Wolf, OAS or the held-out likelihood: scikit-learn's estimators)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..constants import GAMMA_ESTIMATORS, LINEAR_METHODS, LINEAR_OPTIONS, SHRINKAGE_ESTIMATORS
from ..errors import BertflowError
from ..storage.files import check_finite
from ..storage.rows import Rows, as_rows

__all__ = ["LINEAR_METHODS", "NO_VARIANCE", "LinearMap", "covariance",
           "default_d", "default_k", "estimate_shrinkage", "fit_map", "linear_method",
           "linear_options", "principal_directions", "spectral_gamma", "whitening_weight"]

_BLOCK = 8192
NO_VARIANCE = 1e-7  # a principal direction whose variance is below this share of the largest's
_NAMES = {"k": "k (components kept)", "d": "d (directions removed)", "shrinkage": "shrinkage",
          "gamma": "gamma (the whitening's power)"}


# the maps a flow may follow, at full width: they rescale every direction and drop none
BIJECTIONS = ("whitening", "fractional")


class LinearMap(nn.Module):
    r"""$z = (x - \mu)\, W$, $W$ (dim, out): a bijection for full whitening and fractional
    whitening at full width (`BIJECTIONS`); the others project."""

    def __init__(self, mean: Tensor, weight: Tensor, method: str):
        super().__init__()
        if method not in LINEAR_METHODS:
            raise BertflowError(f"unknown linear method {method!r}")
        if mean.ndim != 1 or weight.ndim != 2 or weight.shape[0] != mean.shape[0]:
            raise BertflowError(f"a linear map needs a (dim,) mean and a (dim, out) weight, "
                                f"got {tuple(mean.shape)} and {tuple(weight.shape)}")
        self.method = method
        # row-major float32 copies, as a loaded head holds them: both give the same bits
        for name, tensor in (("mean", mean), ("weight", weight)):
            self.register_buffer(name, tensor.detach().to(
                torch.float32, memory_format=torch.contiguous_format, copy=True))
        # constants: log|det W| computed here and after loading, W⁻¹ at the next `inverse`
        self.register_buffer("log_det", self._slogdet(), persistent=False)
        self.inverse_weight: Tensor | None = None  # float64, not a buffer: `.to` never rounds it
        self.register_load_state_dict_post_hook(LinearMap._loaded)

    @property
    def features(self) -> int:
        return int(self.mean.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[1])

    @property
    def invertible(self) -> bool:
        return self.method in BIJECTIONS and self.out_features == self.features

    def _slogdet(self) -> Tensor:
        if not self.invertible:
            return torch.tensor(math.nan)
        return torch.linalg.slogdet(self.weight.double())[1].float()

    @staticmethod
    def _loaded(module: LinearMap, incompatible_keys: Any) -> None:
        module.log_det, module.inverse_weight = module._slogdet(), None

    def map(self, x: Tensor) -> Tensor:
        """x → z alone, in the wider of the dtypes of x and of the map."""
        centred = x - self.mean
        return centred @ self.weight.to(centred.dtype)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x → (z, log|det W| per row; NaN when the map projects)."""
        z = self.map(x)
        return z, self.log_det.expand(x.shape[0]).to(z.dtype)

    def inverse(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """z → (x, log|det W⁻¹| per row), for a bijection only (W⁻¹ in float64)."""
        if not self.invertible:
            raise BertflowError(f"a {self.method} head projects: it has no inverse")
        if self.inverse_weight is None:
            self.inverse_weight = torch.linalg.inv(self.weight.double())
        dtype = torch.promote_types(z.dtype, self.weight.dtype)
        x = z.to(dtype) @ self.inverse_weight.to(z.device, dtype) + self.mean
        return x, (-self.log_det).expand(z.shape[0]).to(dtype)

    def extra_repr(self) -> str:
        return f"{self.method}, {self.features} → {self.out_features}"


def covariance(x: np.ndarray | Rows, what: str = "the embeddings") -> tuple[np.ndarray, np.ndarray]:
    """Mean and unbiased covariance (float64) of an array or `Rows`, read a block at a time."""
    rows = as_rows(x)
    n, dim = rows.shape
    if n < 2:
        raise BertflowError(f"need at least 2 rows to fit a linear map, got {n}")

    def blocks() -> Iterator[np.ndarray]:
        for start in range(0, n, _BLOCK):
            block = np.asarray(rows.read(start, start + _BLOCK), dtype=np.float64)
            check_finite(block, what, offset=start)
            yield block

    mean = sum(block.sum(0) for block in blocks()) / n
    scatter = np.zeros((dim, dim))
    for block in blocks():
        centred = block - mean
        scatter += centred.T @ centred
    return mean, scatter / (n - 1)


def principal_directions(cov: np.ndarray,
                         count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The top `count` eigenvalues (≥ 0, largest first) and eigenvectors of a covariance."""
    values, vectors = np.linalg.eigh(cov)
    order = np.argsort(values)[::-1][:count]
    return np.maximum(values[order], 0.0), vectors[:, order]


def whitening_weight(cov: np.ndarray, k: int | None = None, rows: int | None = None,
                     what: str = "the embeddings", shrinkage: float = 0.0,
                     gamma: float = 1.0) -> np.ndarray:
    r"""$W = U_k \Lambda_k^{-\gamma/2}$ from $\Sigma = U \Lambda U^\top$, keeping the top `k`
    components (default: all): whitening at $\gamma = 1$, else fractional whitening
    $\Sigma^{-\gamma/2}$ (up to a rotation, which no cosine sees). With `shrinkage` α above 0
    the eigenvalues are those of $\Sigma$ shrunk towards the identity scaled to its mean variance,
    $(1 - \alpha)\lambda_i + \alpha \operatorname{tr}\Sigma / n$, and the directions stay
    $\Sigma$'s, ranked by its own variances (at α = 1 the shrunk covariance is a multiple of I,
    whose eigenvectors say nothing); the shrunk covariance is full rank from 2 rows on. A
    direction without variance is scaled as the largest, so that full whitening stays
    invertible; whitening-k refuses to keep one."""
    dim = cov.shape[0]
    kept = dim if k is None else k
    if not 1 <= kept <= dim:
        raise BertflowError(f"whitening k={k} must be between 1 and the dimension {dim}")
    if rows is not None and rows <= kept and not shrinkage:
        raise BertflowError(f"whitening {what} to {kept} components needs at least {kept + 1} "
                            f"rows, got {rows} (whitening-k keeps fewer components, and "
                            "--shrinkage makes the covariance full rank)")
    values, vectors = principal_directions(cov, k)
    if shrinkage:
        values = (1 - shrinkage) * values + shrinkage * np.trace(cov) / dim
    live = values > NO_VARIANCE * values[0]
    if not live.any():
        raise BertflowError(f"{what} do not vary: there is nothing to whiten")
    if not live[-1] and k is not None:
        alive = int(live.sum())
        raise BertflowError(
            f"{what}: {dim - alive} of {dim} components have no variance (below "
            f"{NO_VARIANCE:g} of the largest's: constant or linearly dependent features); "
            f"whitening-k needs k ≤ {alive}, not {k}")
    scale = np.sqrt(np.where(live, values, values[0]))
    return vectors / (scale if gamma == 1 else scale**gamma)


def default_k(dim: int) -> int:
    """Components whitening-k keeps by default: a third (BERT-whitening's 256 of 768)."""
    return max(1, dim // 3)


def default_d(dim: int) -> int:
    """Directions all-but-the-top removes by default: a hundredth (Mu & Viswanath)."""
    return max(1, dim // 100)


def linear_method(method: str, k: int | None = None, d: int | None = None,
                  shrinkage: float | str | None = None, gamma: float | str | None = None) -> str:
    """`method` given its options (whitening with `k` is whitening-k); an option of another
    method, a `shrinkage` neither in [0, 1] nor an estimator's name, and a `gamma` neither in
    [0, 2] nor ``spectrum`` are refused."""
    for option, value in (("k", k), ("d", d), ("shrinkage", shrinkage), ("gamma", gamma)):
        if value is not None and method not in LINEAR_OPTIONS[option]:
            raise BertflowError(f"{_NAMES[option]} applies to {_listed(LINEAR_OPTIONS[option])}, "
                                f"not to {method}")
    if isinstance(shrinkage, str) and shrinkage not in SHRINKAGE_ESTIMATORS:
        raise BertflowError(f"shrinkage must be in [0, 1] or one of "
                            f"{', '.join(SHRINKAGE_ESTIMATORS)}, got {shrinkage!r}")
    if shrinkage is not None and not isinstance(shrinkage, str) and not 0 <= shrinkage <= 1:
        raise BertflowError(f"shrinkage must be in [0, 1], got {shrinkage}")
    if isinstance(gamma, str) and gamma not in GAMMA_ESTIMATORS:
        raise BertflowError(f"gamma must be in [0, 2] or one of {', '.join(GAMMA_ESTIMATORS)}, "
                            f"got {gamma!r}")
    if gamma is not None and not isinstance(gamma, str) and not 0 <= gamma <= 2:
        raise BertflowError(f"gamma must be in [0, 2], got {gamma}")
    return "whitening-k" if method == "whitening" and k is not None else method


def _listed(names: tuple[str, ...]) -> str:
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def linear_options(method: str, dim: int, k: int | None = None, d: int | None = None,
                   shrinkage: float | str | None = None,
                   gamma: float | str | None = None) -> dict[str, Any]:
    """The options of `method` on `dim`-d embeddings, defaults filled in: the `k` of
    whitening-k and PCA (a third), the `d` of abtt, fractional whitening's `gamma` (0.5), and
    those given (`shrinkage`, a fractional whitening's `k`)."""
    method = linear_method(method, k, d, shrinkage, gamma)
    defaults = {"whitening-k": {"k": default_k(dim)}, "pca": {"k": default_k(dim)},
                "abtt": {"d": default_d(dim)}, "fractional": {"gamma": 0.5}}.get(method, {})
    given = {key: value for key, value in (("k", k), ("d", d), ("shrinkage", shrinkage),
                                           ("gamma", gamma)) if value is not None}
    return {**defaults, **given}


def estimate_shrinkage(x: np.ndarray | Rows, estimator: str) -> float:
    """The shrinkage α that `estimator` chooses for the covariance of `x`, towards the same
    target as `whitening_weight`'s, with scikit-learn: Ledoit-Wolf, Chen et al.'s OAS, or
    ``likelihood``, the α of a grid (10⁻⁴ to 1) whose shrunk covariance gives held-out rows the
    highest Gaussian likelihood (3 folds, shuffled by a fixed seed)."""
    from sklearn.covariance import OAS, ShrunkCovariance, ledoit_wolf_shrinkage
    from sklearn.model_selection import GridSearchCV, KFold

    rows = as_rows(x)
    data = np.asarray(rows.read(0, rows.shape[0]), dtype=np.float64)
    if estimator == "ledoit-wolf":
        return float(ledoit_wolf_shrinkage(data))
    if estimator == "oas":
        return float(OAS().fit(data).shrinkage_)
    search = GridSearchCV(ShrunkCovariance(), {"shrinkage": np.logspace(-4, 0, 25)},
                          cv=KFold(3, shuffle=True, random_state=0))
    return float(search.fit(data).best_params_["shrinkage"])


def spectral_gamma(x: np.ndarray | Rows, k: int | None = None) -> float:
    r"""Fractional whitening's γ for the top `k` components of `x` (default: all), from the
    eigenspectrum alone: the mean over those components of the share of each one's variance
    that lies above the noise. The noise variance σ² is the median eigenvalue; a component is
    signal only above Marchenko and Pastur's edge for such noise in n rows of d dimensions,
    $\sigma^2 (1 + \sqrt{d/n})^2$, and its share is then $1 - \sigma^2 / \lambda$, else 0.
    Every kept component far above the noise gives γ near 1 (whitening), none gives 0 (a
    rotation: the raw cosines). Spectral tempering's idea, γ from the signal-to-noise ratio of
    the kept components (Li, Eustratiadis and Kanoulas, arXiv 2603.19339), in a rule of our
    own: not their published one."""
    return _spectral_gamma(covariance(x)[1], as_rows(x).shape[0], k)


def _spectral_gamma(cov: np.ndarray, rows: int, k: int | None) -> float:
    """`spectral_gamma` from the covariance of `rows` rows."""
    values, dim = principal_directions(cov)[0], cov.shape[0]
    noise = float(np.median(values))
    edge = noise * (1 + np.sqrt(dim / rows)) ** 2
    share = np.where(values > edge, 1 - noise / np.maximum(values, np.finfo(float).tiny), 0.0)
    return round(float(share[:dim if k is None else k].mean()), 4)


def fit_map(x: np.ndarray | Rows, method: str = "whitening", *, k: int | None = None,
            d: int | None = None, shrinkage: float | str | None = None,
            gamma: float | str | None = None, what: str = "the embeddings") -> LinearMap:
    """A `LinearMap` of `method` fit on embeddings `x` (`linear_options`): the identity, the
    mean removed (``center``), the mean's direction projected out (``no-mean-direction``),
    whitening, whitening-k and fractional whitening of the covariance shrunk by `shrinkage`
    (default 0: none; an estimator's name: the α it chooses) to the power `gamma` (``spectrum``:
    `spectral_gamma`'s), PCA to `k`, or abtt."""
    method = linear_method(method, k, d, shrinkage, gamma)
    if method not in LINEAR_METHODS:
        raise BertflowError(f"unknown linear method {method!r}; choose one of "
                            f"{', '.join(LINEAR_METHODS)}")
    rows, dim = as_rows(x).shape
    options = linear_options(method, dim, k, d, shrinkage, gamma)
    if method == "identity":
        return LinearMap(torch.zeros(dim, dtype=torch.float64), torch.eye(dim), method)
    mean, cov = covariance(x, what)
    weight = np.eye(dim)
    if method == "no-mean-direction":
        norm = np.linalg.norm(mean)
        if norm**2 <= NO_VARIANCE * np.trace(cov):  # a direction of rounding errors
            raise BertflowError(f"{what} have a zero mean: it has no direction to project out")
        weight, mean = weight - np.outer(mean / norm, mean / norm), np.zeros(dim)
    elif method == "abtt":
        d = options["d"]
        if not 0 <= d < dim:
            raise BertflowError(f"all-but-the-top d={d} must be in [0, dimension {dim})")
        top = principal_directions(cov, d)[1]
        weight = weight - top @ top.T  # I - U_d U_dᵀ: the top d directions removed
    elif method == "pca":
        if not 1 <= options["k"] <= dim:
            raise BertflowError(f"PCA k={options['k']} must be between 1 and the dimension {dim}")
        weight = principal_directions(cov, options["k"])[1]
    elif method != "center":
        alpha = options.get("shrinkage", 0.0)
        alpha = estimate_shrinkage(x, alpha) if isinstance(alpha, str) else alpha
        gamma = options.get("gamma", 1.0)
        gamma = _spectral_gamma(cov, rows, options.get("k")) if isinstance(gamma, str) else gamma
        weight = whitening_weight(cov, options.get("k"), rows, what, alpha, gamma)
    return LinearMap(torch.from_numpy(mean), torch.from_numpy(weight), method)
