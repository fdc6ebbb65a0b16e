"""Head: the exported, self-describing transform applied to embeddings before scoring (a flow,
a linear map, or (fractional) whitening then a flow), and its name of the first releases,
FlowHead."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..constants import DEFAULT_BATCH_SIZE, POOLINGS
from ..encoders import st_api
from ..encoders.encoder import Encoder
from ..encoders.identity import EncoderId
from ..encoders.loading import resolve_encoder
from ..errors import BertflowError
from ..storage.files import check_finite
from ..storage.rows import Moments, Rows, as_rows, moments
from .flow import Glow, StandardScaler, log_likelihood
from .linear import LinearMap, estimate_shrinkage, fit_map, linear_options, spectral_gamma

__all__ = ["FlowHead", "Head", "training_rows"]



class Head(nn.Module):
    r"""A Glow after an optional scaler or whitening, $z = f(\mathrm{before}(x))$, or a linear
    map $z = (x - \mu) W$ (`fit_linear`), with what made its training embeddings (`encoder`,
    `pooling`, `max_length`) and how it was fit (`training_info`)."""

    def __init__(self, glow: Glow | None, standardize: StandardScaler | None = None, *,
                 linear: LinearMap | None = None, encoder: EncoderId | None = None,
                 pooling: str | None = None, max_length: int | None = None,
                 training_info: dict[str, Any] | None = None):
        super().__init__()
        if pooling is not None and pooling not in POOLINGS:
            raise BertflowError(f"unknown pooling {pooling!r}")
        if glow is None and linear is None:
            raise BertflowError("a head is a flow, a linear map, or whitening then a flow: "
                                "give glow, linear or both")
        if glow is not None and linear is not None and not linear.invertible:
            raise BertflowError(f"a flow may come after whitening or fractional whitening at "
                                f"full width, not {linear.method}")
        if linear is not None and standardize is not None:
            raise BertflowError("a linear map centres by itself; give no standardisation")
        self.glow = glow
        self.linear = linear
        self.standardize = standardize  # its tensors' name in the saved weights
        self.encoder = encoder
        self.pooling = pooling
        self.max_length = max_length
        self.training_info = training_info or {}

    @property
    def dim(self) -> int:
        """The width of the embeddings the head takes."""
        return self.glow.features if self.glow is not None else self.linear.features

    @property
    def out_dim(self) -> int:
        """The width of what it gives: `dim`, but k for whitening-k."""
        return self.glow.features if self.glow is not None else self.linear.out_features

    @property
    def method(self) -> str:
        """``flow``, or the linear map's: ``whitening``, ``whitening-k`` or ``abtt``."""
        return "flow" if self.glow is not None else self.linear.method

    @property
    def before(self) -> StandardScaler | LinearMap | None:
        """What a flow head applies before its Glow: its scaler, its whitening, or nothing."""
        return self.standardize if self.standardize is not None else self.linear

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Embeddings x → (latents z, log|det ∂z/∂x|); NaN for a linear map that projects."""
        log_det = x.new_zeros(x.shape[0])
        for step in (self.before, self.glow):  # a linear head's map is its `before`
            if step is not None:
                x, more = step(x)
                log_det = log_det + more
        return x, log_det

    def latents(self, x: Tensor) -> Tensor:
        """Embeddings x → latents z alone (what the exports compute: no log-determinant)."""
        if self.linear is not None:
            x = self.linear.map(x)
        elif self.standardize is not None:
            x = self.standardize(x)[0]
        return x if self.glow is None else self.glow(x)[0]

    def inverse(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Latents z → (embeddings x, log|det ∂x/∂z|)."""
        log_det = z.new_zeros(z.shape[0])
        for step in (self.glow, self.before):
            if step is not None:
                z, more = step.inverse(z)
                log_det = log_det + more
        return z, log_det

    def log_prob(self, x: Tensor | np.ndarray) -> Tensor | np.ndarray:
        """log p(x) in nats per row: a Tensor for a Tensor, an array (checked) for an array."""
        self._check_density()
        if isinstance(x, Tensor):
            return log_likelihood(*self(x))
        array = self._checked(x)
        with torch.no_grad():
            return self.eval().log_prob(torch.from_numpy(np.array(array, np.float32))).numpy()

    @torch.no_grad()
    def sample(self, num_samples: int, seed: int = 0) -> np.ndarray:
        """Draw embeddings from the fitted density, in the head's floating dtype."""
        self._check_density()
        z = torch.randn(num_samples, self.dim, generator=torch.Generator().manual_seed(seed))
        dtype = next(t.dtype for t in self.state_dict().values() if t.is_floating_point())
        return self.eval().inverse(z.to(dtype))[0].numpy()

    def _check_density(self) -> None:
        if self.linear is not None and not self.linear.invertible:
            raise BertflowError(f"a {self.method} head projects: it has no density")

    def check(self, dim: int | None = None, encoder: EncoderId | None = None,
              pooling: str | None = None, max_length: int | None = None) -> None:
        """Refuse embeddings this head was not fit for, naming both sides."""
        if dim is not None and dim != self.dim:
            theirs = f" from encoder {encoder}" if encoder is not None else ""
            raise BertflowError(f"head expects {self.dim}-d embeddings{self._origin()}, "
                                f"got {dim}-d embeddings{theirs}")
        mine = self.encoder
        if encoder is not None and mine is not None and encoder.fingerprint != mine.fingerprint:
            raise BertflowError(f"head was fit on embeddings from encoder {mine}, "
                                f"but these come from encoder {encoder}")
        if pooling is not None and self.pooling is not None and pooling != self.pooling:
            raise BertflowError(f"head was fit on {self.pooling} pooling, "
                                f"but these embeddings use {pooling} pooling")
        if max_length is not None and self.max_length is not None and max_length != self.max_length:
            raise BertflowError(f"head was fit on embeddings of at most {self.max_length} tokens, "
                                f"but these were cut at {max_length}")

    def settings(self, encoder: Encoder, pooling: str | None = None,
                 max_length: int | None = None) -> tuple[str, int]:
        """The pooling and max length to embed with on `encoder` (`check`ed): the head's,
        else those given, else the encoder's defaults (`Encoder.defaults`)."""
        chosen, length = encoder.defaults(self.pooling or pooling, self.max_length or max_length)
        self.check(dim=encoder.width(chosen), encoder=encoder.id, pooling=pooling)
        return chosen, length

    @torch.no_grad()
    def transform(self, x: np.ndarray | Tensor, batch_size: int = 8192) -> np.ndarray:
        """Map embeddings (rows, dim) to their latents, float32, checked first."""
        array = self._checked(x)
        self.eval()
        out = np.empty((array.shape[0], self.out_dim), dtype=np.float32)
        for start in range(0, array.shape[0], batch_size):
            block = torch.from_numpy(np.array(array[start : start + batch_size], np.float32))
            out[start : start + batch_size] = self.latents(block).numpy()
        bad = ~np.isfinite(out).all(axis=1)
        if bad.any():
            raise BertflowError(f"the head maps {int(bad.sum())} of {len(out)} embeddings to NaN "
                                f"or inf (first: row {int(np.argmax(bad))}): they lie far outside "
                                "the data it was fit on")
        return out

    def _checked(self, x: np.ndarray | Tensor) -> np.ndarray:
        array = x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)
        if array.ndim == 1:
            array = array[None]
        if array.ndim != 2 or array.shape[0] == 0:
            raise BertflowError(f"expected embeddings of shape (rows, dim), got {array.shape}")
        self.check(dim=array.shape[1])
        check_finite(array, "the embeddings")
        return array

    def encode(self, sentences: str | Sequence[str],
               encoder: Encoder | str | os.PathLike | None = None,
               batch_size: int = DEFAULT_BATCH_SIZE, progress: bool | None = None, *,
               convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               normalize_embeddings: bool = False, device: str | torch.device | None = None,
               **options: Any) -> Any:
        """Embed sentences with the head's pooling and `encoder` (default: the one it records),
        then transform them; it also takes sentence-transformers' `encode` options."""
        st_api.check_options(options, device)
        if self.pooling is None:
            raise BertflowError("this head does not record its pooling; encode, then transform")
        sentences, single = st_api.as_sentences(sentences)
        encoder = resolve_encoder(encoder, self.encoder, "auto" if device is None else device)
        x = encoder.encode(sentences, *self.settings(encoder), batch_size, progress,
                           device=device, **options)
        return st_api.convert(self.transform(x), single, convert_to_numpy, convert_to_tensor,
                              normalize_embeddings)

    # the width of what `encode` returns, by sentence-transformers' names (the second since v6)
    get_sentence_embedding_dimension = get_embedding_dimension = out_dim.fget
    similarity_fn_name = st_api.SIMILARITY_FN_NAME
    similarity = staticmethod(st_api.similarity)
    similarity_pairwise = staticmethod(st_api.similarity_pairwise)

    @classmethod
    def fit_linear(cls, x: np.ndarray | Tensor | Rows, method: str = "whitening", *,
                   k: int | None = None, d: int | None = None,
                   shrinkage: float | str | None = None, gamma: float | str | None = None,
                   corpus: dict[str, Any] | None = None, **origin: Any) -> Head:
        """A closed-form linear map as a head (`bertflow.heads.linear.fit_map`: its `method`,
        `k`, `d`, `shrinkage` and `gamma`), which its `training_info` records: the α or γ an
        estimator chose beside the estimator's name."""
        data, _, record = training_rows(x, corpus)
        options = linear_options(method, data.shape[1], k, d, shrinkage, gamma)
        chosen = {}
        if isinstance(shrinkage, str):  # the estimator's α, fit and recorded as given
            chosen = {"shrinkage_estimator": shrinkage}
            options["shrinkage"] = estimate_shrinkage(data, shrinkage)
        if isinstance(gamma, str):  # γ from the eigenspectrum, recorded as given
            chosen["gamma_estimator"] = gamma
            options["gamma"] = spectral_gamma(data, options.get("k"))
        linear = fit_map(data, method, **options, what="the training embeddings")
        training = {"corpus": record, "method": linear.method, "out_dim": linear.out_features,
                    **options, **chosen}
        return cls(None, linear=linear, training_info=training, **origin)

    def describe(self) -> dict[str, Any]:
        """Who this head is, for the records of what it produced."""
        return {"method": self.method, "encoder": self.encoder.to_dict() if self.encoder
                else None, "pooling": self.pooling, "dim": self.dim, "out_dim": self.out_dim,
                "max_length": self.max_length, "corpus": self.training_info.get("corpus")}

    def config(self) -> dict[str, Any]:
        """The JSON description saved beside the weights (`bertflow.heads.format`)."""
        from .format import head_config

        return head_config(self)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the head to folder `path` atomically, replacing only a head there."""
        from .format import save_head

        return save_head(self, path)

    def write(self, folder: Path, manifest: bool = True) -> None:
        """Write the head's files and manifest into an existing folder (`save`: atomically)."""
        from .format import write_head

        write_head(self, folder, manifest)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Head:
        """Rebuild a head from its folder, or a ready head by name; nothing is unpickled."""
        from .format import load_head

        return load_head(path)

    def check_finite(self, what: str = "the head") -> None:
        """Refuse weights that are not finite, or a scaler that divides by zero."""
        for name, tensor in self.state_dict().items():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise BertflowError(f"{what} holds non-finite weights ({name})")
        if self.standardize is not None and not (self.standardize.std > 0).all():
            count = int((self.standardize.std <= 0).sum())
            raise BertflowError(f"{what} has a standardisation with {count} standard "
                                "deviation(s) of 0: it would divide by zero")

    def _origin(self) -> str:
        parts = [f"encoder {self.encoder}"] if self.encoder is not None else []
        parts += [f"{self.pooling} pooling"] if self.pooling is not None else []
        return f" ({', '.join(parts)})" if parts else ""

    def extra_repr(self) -> str:
        return f"dim={self.dim}{self._origin()}"


def training_rows(x: np.ndarray | Tensor | Rows,
                   corpus: dict[str, Any] | None) -> tuple[Rows, Moments, dict[str, Any]]:
    """The rows to fit to (refused when too few or constant), their statistics, and the record
    of `corpus` (by default the embeddings' digest) with its size."""
    data = as_rows(x)
    if len(data.shape) != 2 or data.shape[0] < 3:
        raise BertflowError(f"need (rows ≥ 3, dim) embeddings to fit, got {data.shape}")
    stats = moments(data, what="the training embeddings")
    stats.check_varies("the training embeddings")
    corpus = corpus if corpus is not None else {"embeddings_sha256": stats.sha256}
    return data, stats, {**corpus, "size": int(data.shape[0])}


FlowHead = Head
"""`Head` by the name of the first releases, kept."""
