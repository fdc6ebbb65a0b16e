"""A Glow-style normalizing flow for vectors, built from nflows transforms."""

from __future__ import annotations

import math

import torch
from nflows.distributions import StandardNormal
from nflows.flows import Flow
from nflows.transforms import ActNorm as _NflowsActNorm
from nflows.transforms import (
    AdditiveCouplingTransform,
    AffineCouplingTransform,
    CompositeTransform,
    MultiscaleCompositeTransform,
    Permutation,
    ReversePermutation,
    Transform,
)
from torch import Tensor, nn

from ..config import FlowConfig
from ..storage.rows import Moments

__all__ = ["ActNorm", "AdditiveCoupling", "AffineCoupling", "Conditioner", "Glow",
           "InvertibleLinear", "StandardScaler", "bits_per_dim", "live_scale", "log_likelihood",
           "robust_std"]


class ActNorm(_NflowsActNorm):
    r"""$y = e^{s} \odot x + b$, set by the first training batch to give it zero mean and unit
    variance; a dead feature (`robust_std`) is centred, not scaled."""

    def _initialize(self, inputs: Tensor) -> None:
        with torch.no_grad():
            std = robust_std(inputs)
            self.log_scale.data = -torch.log(std)
            self.shift.data = -(inputs / std).mean(dim=0)
            self.initialized.data = torch.tensor(True, dtype=torch.bool)


def robust_std(x: Tensor) -> Tensor:
    """Per-feature standard deviation of the rows of `x`, dead features' set to 1 (`live_scale`)."""
    return live_scale(x.std(dim=0))


def live_scale(std: Tensor) -> Tensor:
    """`std` with dead features' set to 1: those below 1e-3 of the 90th percentile of all (of
    the largest, when nine features in ten are dead)."""
    reference = torch.quantile(std, 0.9)
    if reference == 0:
        reference = std.max()
    return torch.where(std < 1e-3 * reference, torch.ones_like(std), std)


class InvertibleLinear(Transform):
    r"""$y = W x$ with $W = L (U + \mathrm{diag}(e^{v}))$, Glow's LU-decomposed 1×1 convolution:
    $\log|\det W| = \sum_i v_i$; a fresh layer is the identity."""

    def __init__(self, features: int):
        super().__init__()
        self.features = features
        self.lower = nn.Parameter(torch.zeros(features, features))
        self.upper = nn.Parameter(torch.zeros(features, features))
        self.log_diag = nn.Parameter(torch.zeros(features))

    def _factors(self) -> tuple[Tensor, Tensor]:
        eye = torch.eye(self.features, dtype=self.lower.dtype, device=self.lower.device)
        lower = torch.tril(self.lower, -1) + eye
        upper = torch.triu(self.upper, 1) + torch.diag(self.log_diag.exp())
        return lower, upper

    def forward(self, inputs: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        lower, upper = self._factors()
        return inputs @ (lower @ upper).T, self.log_diag.sum().expand(inputs.shape[0])

    def inverse(self, inputs: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        lower, upper = self._factors()
        y = torch.linalg.solve_triangular(lower, inputs.T, upper=False, unitriangular=True)
        x = torch.linalg.solve_triangular(upper, y, upper=True)
        return x.T, -self.log_diag.sum().expand(inputs.shape[0])


class Conditioner(nn.Module):
    """The coupling network: Linear-ReLU-Linear-ReLU-Linear, the last layer zero at start."""

    def __init__(self, in_features: int, out_features: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, out_features))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, inputs: Tensor, context: Tensor | None = None) -> Tensor:
        return self.net(inputs)


class AdditiveCoupling(AdditiveCouplingTransform):
    r"""$y_B = x_B + t(x_A)$, $y_A = x_A$ (NICE); $\log|\det| = 0$."""


class AffineCoupling(AffineCouplingTransform):
    r"""$y_B = x_B \odot e^{\tanh s(x_A)} + t(x_A)$, $y_A = x_A$ (RealNVP, bounded log-scale)."""

    def _scale_and_shift(self, transform_params: Tensor) -> tuple[Tensor, Tensor]:
        n = self.num_transform_features
        return torch.tanh(transform_params[:, n:]).exp(), transform_params[:, :n]


class StandardScaler(Transform):
    r"""$y = (x - \mu) / \sigma$ per feature with fixed statistics."""

    def __init__(self, mean: Tensor, std: Tensor):
        super().__init__()
        self.register_buffer("mean", mean.detach().clone().float())
        self.register_buffer("std", std.detach().clone().float())

    @classmethod
    def from_moments(cls, stats: Moments) -> StandardScaler:
        """The per-feature means and standard deviations of `stats`, dead features' set to 1
        (`live_scale`)."""
        return cls(torch.from_numpy(stats.mean).float(),
                   live_scale(torch.from_numpy(stats.std).float()))

    def forward(self, inputs: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return (inputs - self.mean) / self.std, -self.std.log().sum().expand(inputs.shape[0])

    def inverse(self, inputs: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return inputs * self.std + self.mean, self.std.log().sum().expand(inputs.shape[0])


class Glow(Flow):
    r"""A Glow for $D$-dim vectors: `levels` × (`depth` × [ActNorm, mixing, coupling]), half
    of the features factored out to the base $N(0, I)$ after every level but the last."""

    def __init__(self, features: int, config: FlowConfig | None = None):
        config = config or FlowConfig()
        config.check(features)
        if config.levels == 1:
            transform = _level(features, config)
        else:
            transform = MultiscaleCompositeTransform(config.levels, split_dim=1)
            shape = (features,)  # add_transform gives the next level's, None after the last
            for i in range(config.levels):
                swap = config.factor_out == "second" and i < config.levels - 1
                shape = transform.add_transform(_level(shape[0], config, swap), shape)
        super().__init__(transform, StandardNormal([features]))
        self.features = features
        self.config = config

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x → (z, log|det ∂z/∂x|)."""
        return self._transform(x)

    def inverse(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """z → (x, log|det ∂x/∂z|)."""
        return self._transform.inverse(z)

    def sample(self, num_samples: int, generator: torch.Generator | None = None) -> Tensor:
        z = torch.randn(num_samples, self.features, generator=generator)
        return self.inverse(z.to(next(self.parameters()).device))[0]


def log_likelihood(z: Tensor, log_det: Tensor) -> Tensor:
    r"""$\log p(x) = \log N(z; 0, I) + \log|\det \partial z / \partial x|$ per row."""
    return -0.5 * (z**2).sum(-1) - 0.5 * z.shape[-1] * math.log(2 * math.pi) + log_det


def bits_per_dim(nll: float, dim: int) -> float:
    """An NLL per row in nats, as bits per dimension: ``nll / (dim ln 2)``."""
    return nll / (dim * math.log(2))


def _level(features: int, config: FlowConfig, swap: bool = False) -> CompositeTransform:
    coupling = AdditiveCoupling if config.coupling == "additive" else AffineCoupling
    steps: list[Transform] = []
    for k in range(config.depth):
        if config.linear == "lu":
            mixing: Transform = InvertibleLinear(features)
            mask = (torch.arange(features) + k) % 2  # even, then odd features
        else:
            # the reversal already swaps the halves from one step to the next
            mixing = ReversePermutation(features)
            mask = (torch.arange(features) >= features // 2).long()
        steps += [ActNorm(features), mixing,
                  coupling(mask, lambda i, o: Conditioner(i, o, config.hidden))]
    if swap:  # the last ⌈D/2⌉ features first: nflows' split factors out the first half
        steps.append(Permutation(torch.arange(features).roll(-(features // 2))))
    return CompositeTransform(steps)

