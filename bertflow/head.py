"""FlowHead: the exported, self-describing transform applied to embeddings before scoring."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save
from torch import Tensor, nn

from . import __version__
from .constants import BEFORE
from .encoder import (
    DEFAULT_BATCH_SIZE,
    POOLINGS,
    Encoder,
    EncoderId,
    check_max_length,
    check_pooling,
    resolve_encoder,
)
from .errors import BertflowError, first_line
from .files import check_finite, sha256_file, write_json
from .flow import FlowConfig, Glow, StandardScaler, log_likelihood
from .folders import HEAD_FOLDER, head_folder, ready_heads, verify_checksums
from .linear import LINEAR_METHODS, LinearMap, fit_map
from .rows import Moments, Rows, as_rows, moments
from .st_api import (
    SIMILARITY_FN_NAME,
    as_sentences,
    check_options,
    convert,
    output_options,
    similarity,
    similarity_pairwise,
)
from .train import TrainConfig, fit

__all__ = ["FORMAT", "FORMAT_VERSION", "FlowHead", "check_destination", "corpus_digest",
           "nll_text", "ready_heads"]

FORMAT = HEAD_FOLDER.kind
FORMAT_VERSION = HEAD_FOLDER.version  # 2: a manifest.json covers config.json too; 1 still loads
_CONFIG, _WEIGHTS = HEAD_FOLDER.files


class FlowHead(nn.Module):
    r"""Standardisation (optional) followed by a Glow: $z = f(\,(x - \mu) / \sigma\,)$; or,
    fit by `fit_linear`, a closed-form linear map $z = (x - \mu) W$ (whitening, whitening-k,
    all-but-the-top: `method`), the baselines as heads.

    `standardize` is the first step, a `StandardScaler` of the training embeddings' statistics
    (None: the Glow takes the embeddings as they are). The head carries what it needs to be
    used safely: the embedding dimension, the `encoder`, `pooling` and `max_length` that made
    its training embeddings, and how it was fit (`training_info`, the "training" of its
    config; the keyword's old name, `training`, is still taken). `save` writes `config.json`,
    `model.safetensors` and their manifest; `load` rebuilds the head from those files alone.
    """

    def __init__(
        self,
        glow: Glow | None,
        standardize: StandardScaler | None = None,
        *,
        linear: LinearMap | None = None,
        encoder: EncoderId | None = None,
        pooling: str | None = None,
        max_length: int | None = None,
        training_info: dict[str, Any] | None = None,
        training: dict[str, Any] | None = None,
    ):
        super().__init__()
        if pooling is not None and pooling not in POOLINGS:
            raise BertflowError(f"unknown pooling {pooling!r}")
        if glow is None and linear is None:
            raise BertflowError("a head is a flow, a linear map, or whitening then a flow: "
                                "give glow, linear or both")
        if glow is not None and linear is not None and not linear.invertible:
            raise BertflowError(f"a flow may come after full whitening, not {linear.method}")
        if linear is not None and standardize is not None:
            raise BertflowError("a linear map centres by itself; give no standardisation")
        self.glow = glow
        self.linear = linear
        self.standardize = standardize
        self.encoder = encoder
        self.pooling = pooling
        self.max_length = max_length
        self.training_info = training_info or training or {}  # `training`: its old name

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
        """What a flow head applies before its Glow: its standardisation, its whitening, or
        nothing."""
        return self.standardize if self.standardize is not None else self.linear

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Embeddings x → (latents z, log|det ∂z/∂x|), the standardisation included (NaN for
        a linear map that projects)."""
        if self.glow is None:
            return self.linear(x)
        log_det = x.new_zeros(x.shape[0])
        if self.before is not None:
            x, log_det = self.before(x)
        z, flow_log_det = self.glow(x)
        return z, log_det + flow_log_det

    def latents(self, x: Tensor) -> Tensor:
        """Embeddings x → latents z alone, no log-determinant (what the exported graphs
        compute: a whitening's determinant has no ONNX operator)."""
        if self.linear is not None:
            x = self.linear.map(x)
        elif self.standardize is not None:
            x = self.standardize(x)[0]
        return x if self.glow is None else self.glow(x)[0]

    def inverse(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Latents z → (embeddings x, log|det ∂x/∂z|)."""
        if self.glow is None:
            return self.linear.inverse(z)
        x, log_det = self.glow.inverse(z)
        if self.before is not None:
            x, more = self.before.inverse(x)
            log_det = log_det + more
        return x, log_det

    def log_prob(self, x: Tensor | np.ndarray) -> Tensor | np.ndarray:
        """log p(x) in embedding space (nats), per row: the flow's density with the
        standardisation's Jacobian included. A Tensor gives a Tensor (differentiable); an
        array gives an array, checked for dimension and finiteness. A linear head that projects
        (whitening-k, all-but-the-top) has no density."""
        if self.linear is not None and not self.linear.invertible:
            raise BertflowError(f"a {self.method} head projects: it has no density")
        if isinstance(x, Tensor):
            z, log_det = self(x)
            return log_likelihood(z, log_det)
        array = self._checked(x)
        with torch.no_grad():
            return self.eval().log_prob(torch.from_numpy(np.array(array, np.float32))).numpy()

    @torch.no_grad()
    def sample(self, num_samples: int, seed: int = 0) -> np.ndarray:
        """Draw embeddings from the fitted density, in the head's floating dtype."""
        if self.linear is not None and not self.linear.invertible:
            raise BertflowError(f"a {self.method} head projects: it has no density to sample")
        z = torch.randn(num_samples, self.dim, generator=torch.Generator().manual_seed(seed))
        dtype = next(t.dtype for t in self.state_dict().values() if t.is_floating_point())
        return self.eval().inverse(z.to(dtype))[0].numpy()

    def check(
        self,
        dim: int | None = None,
        encoder: EncoderId | None = None,
        pooling: str | None = None,
    ) -> None:
        """Refuse embeddings this head was not fit for, naming both sides."""
        if dim is not None and dim != self.dim:
            raise BertflowError(
                f"head expects {self.dim}-d embeddings{self._origin()}, got {dim}-d embeddings"
            )
        mine = self.encoder
        if encoder is not None and mine is not None and encoder.fingerprint != mine.fingerprint:
            raise BertflowError(
                f"head was fit on embeddings from encoder {self.encoder}, "
                f"but these come from encoder {encoder}"
            )
        if pooling is not None and self.pooling is not None and pooling != self.pooling:
            raise BertflowError(
                f"head was fit on {self.pooling} pooling, "
                f"but these embeddings use {pooling} pooling"
            )

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
            raise BertflowError(
                f"the head maps {int(bad.sum())} of {len(out)} embeddings to NaN or inf "
                f"(first: row {int(np.argmax(bad))}): they lie far outside the data it was fit on"
            )
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

    def encode(
        self,
        sentences: str | Sequence[str],
        encoder: Encoder | str | os.PathLike | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress: bool | None = None,
        *,
        device: str | torch.device | None = None,
        **options: Any,
    ) -> Any:
        """Embed sentences with this head's pooling and transform them, after checking that
        `encoder` (default: the one the head records, else the package's default encoder) is
        the one the head was fit on.

        `options` are sentence-transformers' `encode` options, as `Encoder.encode` takes them
        (`show_progress_bar`; `convert_to_numpy`, `convert_to_tensor`; one string gives one
        vector; `normalize_embeddings`, applied after the head; other keywords, such as
        MTEB's, ignored). `device` is where the encoder runs (an encoder given by name is
        loaded there); the head itself runs on the CPU."""
        check_options(options, device)
        if self.pooling is None:
            raise BertflowError("this head does not record its pooling; encode, then transform")
        output = output_options(options)
        sentences, single = as_sentences(sentences)
        encoder = resolve_encoder(encoder, self.encoder, "auto" if device is None else device)
        self.check(dim=encoder.width(self.pooling), encoder=encoder.id)
        x = encoder.encode(sentences, self.pooling, self.max_length or 128, batch_size, progress,
                           device=device, **options)
        return convert(self.transform(x), single, **output)

    def get_sentence_embedding_dimension(self) -> int:
        """The width of what `encode` returns: the head's output dimension
        (sentence-transformers' name for it)."""
        return self.out_dim

    get_embedding_dimension = get_sentence_embedding_dimension  # its name since version 6
    similarity_fn_name = SIMILARITY_FN_NAME

    def similarity(self, embeddings1: Any, embeddings2: Any) -> Tensor:
        """Cosine similarity of every row of `embeddings1` with every row of `embeddings2`
        (latents from `encode`): a (n1, n2) tensor, as sentence-transformers' `similarity`
        gives."""
        return similarity(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> Tensor:
        """Cosine similarity of each row of `embeddings1` with the same row of `embeddings2`."""
        return similarity_pairwise(embeddings1, embeddings2)

    @classmethod
    def fit(
        cls,
        x: np.ndarray | Tensor | Rows,
        *,
        encoder: EncoderId | None = None,
        pooling: str | None = None,
        max_length: int | None = None,
        flow: FlowConfig = FlowConfig(),
        train: TrainConfig = TrainConfig(),
        before: str = "standardize",
        corpus: dict[str, Any] | None = None,
        standardize: bool | None = None,
        **training: Any,
    ) -> FlowHead:
        """Fit a head to embeddings `x` (rows, dim): an array, or `Rows` such as an
        `EmbeddingFile`, which is read a block at a time and never held whole (the
        standardisation statistics are streamed too). `before` says what comes before the
        Glow: ``"standardize"``, a `StandardScaler` of the data's statistics; ``"whiten"``,
        the data's full whitening (`linear.fit_map`), the flow starting from the whitened
        embeddings; ``"none"``, nothing (`standardize=False`, the older spelling, means
        ``"none"``). `encoder`, `pooling` and `max_length`
        (what made `x`) and `corpus` (what it was made from) are recorded in the head.

        `training` goes to `bertflow.train.fit`: `writer` (TensorBoard's `SummaryWriter`),
        `state` (a `TrainState` to resume), `on_epoch_end`, `measure` and `progress`.
        `head.history` holds the epochs."""
        before = _check_before(before, standardize)
        data, stats = _training_rows(x)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(train.seed)
            glow = Glow(data.shape[1], flow)
        scaler, white = _before(data, stats, before)
        head = cls(glow, scaler, linear=white, encoder=encoder, pooling=pooling,
                   max_length=max_length)
        head.history = fit(head, data, train, **training)
        best = head.history.best
        head.training_info = {
            "corpus": _corpus_record(corpus, stats, data),
            "seed": train.seed,
            "config": train.to_dict(),
            "epochs_run": len(head.history.epochs),
            "best_epoch": head.history.best_epoch,
            "train_nll": best.get("train_nll"),
            "val_nll": best.get("val_nll"),
            "val_bits_per_dim": best.get("val_bits_per_dim"),
        }
        return head

    @classmethod
    def fit_linear(
        cls,
        x: np.ndarray | Tensor | Rows,
        method: str = "whitening",
        *,
        k: int | None = None,
        d: int | None = None,
        corpus: dict[str, Any] | None = None,
        **origin: Any,
    ) -> FlowHead:
        """A baseline as a head, fit in closed form on embeddings `x` (an array or `Rows`, read
        a block at a time): ``whitening``, ``whitening-k`` (keeping `k` components, default
        `linear.default_k` of the width; whitening given `k` is whitening-k) or ``abtt``
        (removing `d` directions, default `linear.default_d`); see `linear.fit_map`.
        `origin` (`encoder`, `pooling`, `max_length`) and `corpus` are recorded as by `fit`."""
        data, stats = _training_rows(x)
        linear = fit_map(data, method, k=k, d=d, what="the training embeddings")
        training = {"corpus": _corpus_record(corpus, stats, data), "method": linear.method,
                    "out_dim": linear.out_features}
        return cls(None, linear=linear, training_info=training, **origin)

    def summary(self) -> str:
        """What the head computes, in one line."""
        if self.glow is None:
            return f"{self.method}, a linear map {self.dim} → {self.out_dim}"
        c = self.glow.config
        return (f"{'whitening, then a ' if self.linear is not None else ''}Glow: {c.levels} "
                f"levels × depth {c.depth}, {c.coupling} coupling, width {c.hidden}, "
                f"{c.linear} mixing")

    def tagline(self) -> str:
        """Its encoder, pooling, width and training corpus size, in one line."""
        return (f"{self.encoder.name if self.encoder else '?'}, {self.pooling} pooling, "
                f"{self.dim}-d, fit on {self.training_info['corpus'].get('size')} sentences")

    def details(self) -> list[tuple[str, str]]:
        """What the head is, as labelled rows: dimensions, encoder, pooling, what it computes,
        its size, and how it was fit (corpus, seed, epochs, held-out NLL)."""
        training = self.training_info
        corpus = training.get("corpus") if isinstance(training.get("corpus"), dict) else {}
        digest = corpus_digest(corpus) or "?"
        return [
            ("dim", str(self.dim) if self.out_dim == self.dim
             else f"{self.dim} → {self.out_dim}"),
            ("encoder", str(self.encoder) if self.encoder else "unknown"),
            ("pooling", self.pooling or "unknown"),
            ("max length", str(self.max_length)),
            ("method", self.summary()),
            ("standardize", "yes" if self.standardize is not None
             else "no, whitened" if self.glow is not None and self.linear is not None else "no"),
            ("parameters", f"{sum(t.numel() for t in self.state_dict().values()):,}"),
            ("corpus", f"{corpus.get('size', '?')} rows, sha256 {digest[:16]}"),
            ("seed", str(training.get("seed"))),
            ("epochs", f"best {training.get('best_epoch')} of {training.get('epochs_run')}"),
            ("val NLL", nll_text(training) or "unknown"),
        ]

    def describe(self) -> dict[str, Any]:
        """Who this head is, for the records of what it produced: its method, encoder,
        pooling, dimensions, max length and training corpus."""
        return {"method": self.method, "encoder": self.encoder.to_dict() if self.encoder
                else None, "pooling": self.pooling, "dim": self.dim, "out_dim": self.out_dim,
                "max_length": self.max_length, "corpus": self.training_info.get("corpus")}

    def config(self) -> dict[str, Any]:
        """The JSON description saved beside the weights."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "bertflow_version": __version__,
            "dim": self.dim,
            "encoder": self.encoder.to_dict() if self.encoder else None,
            "pooling": self.pooling,
            "max_length": self.max_length,
            "method": self.method,
            "flow": self.glow.config.to_dict() if self.glow is not None else None,
            "linear": ({"tensors": ["linear.mean", "linear.weight"],
                        "out_dim": self.out_dim} if self.linear is not None else None),
            "standardize": (
                {"tensors": ["standardize.mean", "standardize.std"]} if self.standardize else None
            ),
            "training": self.training_info,
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write the head to folder `path` atomically: a crash leaves the old head intact. An
        existing `path` is replaced only if it is a head and holds nothing else."""
        return HEAD_FOLDER.write(path, self.write)

    def write(self, folder: Path) -> None:
        """Write `config.json`, `model.safetensors` and their manifest into an existing folder
        (not atomic by itself: `save` calls it on a fresh folder that it then swaps in)."""
        self.check_finite()
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        data = save(tensors, metadata={"format": FORMAT})
        with open(folder / _WEIGHTS, "wb") as f:
            f.write(data)
        config = self.config()
        config["weights"] = {"file": _WEIGHTS, "sha256": sha256_file(folder / _WEIGHTS)}
        write_json(folder / _CONFIG, config)
        HEAD_FOLDER.write_manifest(folder)

    @classmethod
    def load(cls, path: str | os.PathLike) -> FlowHead:
        """Rebuild a head from `config.json` and `model.safetensors`; nothing is unpickled.

        Every file is checked against the folder's manifest (heads of format 1 have none: their
        weights are checked against the config), the config against the weights file's header
        before anything is built, and the weights for finite values and a usable
        standardisation."""
        path = head_folder(path)
        config, _ = HEAD_FOLDER.read(path)
        saved = _SavedHead.parse(path, config)
        file = path / saved.weights
        verify_checksums(path, {saved.weights: saved.checksum})
        saved.check_header(file)
        try:
            tensors = load_file(str(file))
        except Exception as e:
            raise BertflowError(f"{file} is not a valid safetensors file ({e})") from None
        head = saved.build(cls)
        try:
            head.load_state_dict(tensors, strict=True)
        except RuntimeError as e:
            detail = str(e).strip().splitlines()[1:2] or [first_line(e)]
            raise BertflowError(f"{file} does not fit its config: {detail[0].strip()}") from None
        head.check_finite(f"{file}")
        return head.eval()

    def check_finite(self, what: str = "the head") -> None:
        """Refuse weights that are not finite, or a standardisation that divides by zero."""
        for name, tensor in self.state_dict().items():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise BertflowError(f"{what} holds non-finite weights ({name})")
        if self.standardize is not None and not (self.standardize.std > 0).all():
            count = int((self.standardize.std <= 0).sum())
            raise BertflowError(f"{what} has a standardisation with {count} standard "
                                "deviation(s) of 0: it would divide by zero")

    def _origin(self) -> str:
        parts = []
        if self.encoder is not None:
            parts.append(f"encoder {self.encoder}")
        if self.pooling is not None:
            parts.append(f"{self.pooling} pooling")
        return f" ({', '.join(parts)})" if parts else ""

    def extra_repr(self) -> str:
        return f"dim={self.dim}{self._origin()}"


def check_destination(path: str | os.PathLike) -> Path:
    """`path` if a head may be written there: absent, empty, or a head and nothing else."""
    return HEAD_FOLDER.check_destination(path)


def corpus_digest(corpus: dict[str, Any]) -> str | None:
    """The sha256 a head's training record gives for its corpus: of the text, of the
    embeddings file, or of the embeddings given directly."""
    return next((str(corpus[k]) for k in ("sha256", "npy_sha256", "embeddings_sha256")
                 if k in corpus), None)


def nll_text(record: dict[str, Any]) -> str | None:
    """A record's held-out NLL in nats and bits per dimension, as text; None without one."""
    nll, bits = record.get("val_nll"), record.get("val_bits_per_dim")
    if not isinstance(nll, (int, float)) or not isinstance(bits, (int, float)):
        return None
    return f"{nll:.3f} nats ({bits:.4f} bits/dim)"


def _check_before(before: str, standardize: bool | None) -> str:
    """`FlowHead.fit`'s `before`, with the older `standardize` flag folded in."""
    if before not in BEFORE:
        raise BertflowError(f"before must be one of {', '.join(BEFORE)}, not {before!r}")
    if standardize is None:
        return before
    if before != "standardize":
        raise BertflowError("give what comes before the flow once: before, not standardize too")
    return "standardize" if standardize else "none"


def _before(data: Rows, stats: Moments,
            before: str) -> tuple[StandardScaler | None, LinearMap | None]:
    """What comes before a Glow fit to `data` (`before`): its whitening, its standardisation,
    or nothing."""
    if before == "whiten":
        return None, fit_map(data, "whitening", what="the training embeddings")
    if before == "standardize":
        return StandardScaler.from_moments(torch.from_numpy(stats.mean).float(),
                                           torch.from_numpy(stats.std).float()), None
    return None, None


def _training_rows(x: np.ndarray | Tensor | Rows) -> tuple[Rows, Moments]:
    """The rows to fit a head to, and their statistics: refused when too few or constant."""
    data = as_rows(x)
    if len(data.shape) != 2 or data.shape[0] < 3:
        raise BertflowError(f"need (rows ≥ 3, dim) embeddings to fit, got {data.shape}")
    stats = moments(data, what="the training embeddings")
    stats.check_varies("the training embeddings")
    return data, stats


def _corpus_record(corpus: dict[str, Any] | None, stats: Moments, data: Rows) -> dict[str, Any]:
    """What a head records of its training data: `corpus` (by default the digest of the
    embeddings) and its size."""
    corpus = corpus if corpus is not None else {"embeddings_sha256": stats.sha256}
    return {**corpus, "size": int(data.shape[0])}


@dataclass(frozen=True)
class _SavedHead:
    """What a head's `config.json` says it is, checked field by field before anything is
    built."""

    dim: int
    method: str
    flow: FlowConfig | None
    out_dim: int | None
    encoder: EncoderId | None
    pooling: str | None
    max_length: int | None
    standardized: bool
    whitened: bool
    training: dict[str, Any]
    weights: str
    checksum: str

    @classmethod
    def parse(cls, path: Path, config: dict[str, Any]) -> _SavedHead:
        try:
            weights = config["weights"]
            file, checksum = path / str(weights["file"]), str(weights["sha256"])
            method = config.get("method", "flow")  # heads before linear ones are flows
            if method == "flow":
                # heads saved before `factor_out` existed factor out the first half
                flow = FlowConfig.from_dict({"factor_out": "first", **config["flow"]})
                out_dim = None
            elif method in LINEAR_METHODS:
                flow, out_dim = None, int(config["linear"]["out_dim"])
            else:
                raise ValueError(f"unknown method {method!r}")
            dim = int(config["dim"])
            encoder = EncoderId.from_dict(config["encoder"]) if config["encoder"] else None
            pooling, max_length = config["pooling"], config["max_length"]
            if pooling is not None:
                check_pooling(pooling)
            if max_length is not None:
                check_max_length(max_length)
            standardized = bool(config["standardize"])
            whitened = flow is not None and bool(config.get("linear"))
            training = config.get("training") or {}
            if not isinstance(training, dict) or file.parent != path or dim < 1:
                raise ValueError("bad training record, weights file or dim")
        except (KeyError, TypeError, ValueError) as e:
            problem = f"{type(e).__name__}: {first_line(e)}"
            raise BertflowError(f"{path / _CONFIG} is malformed ({problem})") from None
        return cls(dim, method, flow, out_dim, encoder, pooling, max_length, standardized,
                   whitened, training, file.name, checksum)

    def check_header(self, file: Path) -> None:
        if self.flow is not None:
            _check_weights_header(file, self.dim, self.flow, self.standardized,
                                  self.whitened)
        else:
            _check_linear_header(file, self.dim, self.out_dim, self.standardized)

    def build(self, cls: type[FlowHead]) -> FlowHead:
        """A head of this shape with placeholder weights, to load the saved ones into."""
        dim = self.dim
        scaler = StandardScaler(torch.zeros(dim), torch.ones(dim)) if self.standardized else None
        linear = None
        if self.flow is None:
            linear = LinearMap(torch.zeros(dim), torch.zeros(dim, self.out_dim), self.method)
        elif self.whitened:
            linear = LinearMap(torch.zeros(dim), torch.eye(dim), "whitening")
        return cls(Glow(dim, self.flow) if self.flow is not None else None, scaler,
                   linear=linear, encoder=self.encoder, pooling=self.pooling,
                   max_length=self.max_length, training_info=self.training)


def _header(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    try:
        with safe_open(str(file), framework="pt") as f:
            return {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype())
                    for name in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except Exception as e:
        raise BertflowError(f"{file} is not a valid safetensors file ({first_line(e)})") \
            from None


def _check_linear_header(file: Path, dim: int, out_dim: int, standardized: bool) -> None:
    """The tensors a linear head's config promises, against the weights file's header."""
    wanted = {"linear.mean": ((dim,), "F32"), "linear.weight": ((dim, out_dim), "F32")}
    found = _header(file)
    if standardized or found != wanted:
        raise BertflowError(f"{file} does not fit its config: it holds "
                            f"{', '.join(f'{k} {list(v[0])}' for k, v in found.items())}, the "
                            f"config a ({dim}, {out_dim}) linear map")


def _check_weights_header(file: Path, dim: int, flow: FlowConfig, standardized: bool,
                          whitened: bool = False) -> None:
    """Check the config's dimension, number of flow steps, conditioner width,
    standardisation and whitening against the tensors the weights file's header lists, before
    a flow of that size is built (the full shapes are checked when the weights are loaded)."""
    header = _header(file)
    shifts = [shape for name, (shape, _) in header.items() if name.endswith(".shift")]
    widths = {shape[0] for name, (shape, _) in header.items() if name.endswith(".net.0.weight")}
    mean = header.get("standardize.mean", ((), ""))[0]
    problems = []
    if len(shifts) != flow.levels * flow.depth:
        problems.append(f"{len(shifts)} flow steps, not levels × depth = "
                        f"{flow.levels * flow.depth}")
    if shifts and max(shifts) != (dim,):
        problems.append(f"{max(shifts)[0] if max(shifts) else 0}-d inputs, not {dim}-d")
    if widths and widths != {flow.hidden}:
        problems.append(f"conditioners of width {sorted(widths)[0]}, not {flow.hidden}")
    if standardized != ("standardize.mean" in header) or (standardized and mean != (dim,)):
        problems.append("another standardisation")
    if whitened != ("linear.weight" in header) or (
            whitened and header["linear.weight"][0] != (dim, dim)):
        problems.append("another whitening")
    kinds = sorted({dtype for _, dtype in header.values()} - {"F32", "I64", "BOOL"})
    if kinds:
        problems.append(f"tensors of type {', '.join(kinds)}")
    if problems:
        raise BertflowError(f"{file} does not fit its config: it holds {problems[0]}")
