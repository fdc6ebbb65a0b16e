"""FlowHead: the exported, self-describing transform applied to embeddings before scoring."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save
from torch import Tensor, nn

from . import __version__
from .encoder import (
    DEFAULT_BATCH_SIZE,
    POOLINGS,
    Encoder,
    EncoderId,
    check_max_length,
    check_pooling,
    load_encoder,
)
from .errors import BertflowError, first_line
from .files import check_finite, read_json, sha256_file, write_json
from .flow import FlowConfig, Glow, Standardize, standard_normal_log_prob
from .folders import check_destination as check_folder
from .folders import legacy_files, verify_folder, write_folder, write_manifest
from .train import Rows, SummaryWriter, TrainConfig, TrainState, as_rows, fit, moments

__all__ = ["FORMAT", "FORMAT_VERSION", "FlowHead", "check_destination"]

FORMAT = "bertflow-head"
FORMAT_VERSION = 2  # 2: a manifest.json covers config.json too; 1 (no manifest) still loads
_CONFIG, _WEIGHTS = "config.json", "model.safetensors"
_legacy_files = legacy_files(_CONFIG, FORMAT, {_CONFIG, _WEIGHTS})  # format-1 heads


class FlowHead(nn.Module):
    r"""Standardisation (optional) followed by a Glow: $z = f(\,(x - \mu) / \sigma\,)$.

    Carries what it needs to be used safely: the embedding dimension, the encoder and pooling
    that made its training embeddings, and how it was trained. `save` writes `config.json` and
    `model.safetensors`; `load` rebuilds the head from those two files alone.
    """

    def __init__(
        self,
        glow: Glow,
        standardize: Standardize | None = None,
        *,
        encoder: EncoderId | None = None,
        pooling: str | None = None,
        max_length: int | None = None,
        training: dict[str, Any] | None = None,
    ):
        super().__init__()
        if pooling is not None and pooling not in POOLINGS:
            raise BertflowError(f"unknown pooling {pooling!r}")
        self.glow = glow
        self.standardize = standardize
        self.encoder = encoder
        self.pooling = pooling
        self.max_length = max_length
        self.training_info = training or {}

    @property
    def dim(self) -> int:
        return self.glow.features

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Embeddings x → (latents z, log|det ∂z/∂x|), the standardisation included."""
        log_det = x.new_zeros(x.shape[0])
        if self.standardize is not None:
            x, log_det = self.standardize(x)
        z, flow_log_det = self.glow(x)
        return z, log_det + flow_log_det

    def inverse(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Latents z → (embeddings x, log|det ∂x/∂z|)."""
        x, log_det = self.glow.inverse(z)
        if self.standardize is not None:
            x, more = self.standardize.inverse(x)
            log_det = log_det + more
        return x, log_det

    def log_prob(self, x: Tensor | np.ndarray) -> Tensor | np.ndarray:
        """log p(x) in embedding space (nats), per row: the flow's density with the
        standardisation's Jacobian included. A Tensor gives a Tensor (differentiable); an
        array gives an array, checked for dimension and finiteness."""
        if isinstance(x, Tensor):
            z, log_det = self(x)
            return standard_normal_log_prob(z) + log_det
        array = self._checked(x)
        with torch.no_grad():
            return self.eval().log_prob(torch.from_numpy(np.array(array, np.float32))).numpy()

    @torch.no_grad()
    def sample(self, num_samples: int, seed: int = 0) -> np.ndarray:
        """Draw embeddings from the fitted density."""
        z = torch.randn(num_samples, self.dim, generator=torch.Generator().manual_seed(seed))
        return self.eval().inverse(z)[0].numpy()

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
        out = np.empty((array.shape[0], self.dim), dtype=np.float32)
        for start in range(0, array.shape[0], batch_size):
            block = torch.from_numpy(np.array(array[start : start + batch_size], np.float32))
            out[start : start + batch_size] = self(block)[0].numpy()
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
        sentences: Sequence[str],
        encoder: Encoder | str | os.PathLike | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress: bool | None = None,
    ) -> np.ndarray:
        """Embed sentences with this head's pooling and transform them, after checking that
        `encoder` (default: the package's default encoder) is the one the head was fit on."""
        if self.pooling is None:
            raise BertflowError("this head does not record its pooling; encode, then transform")
        if not isinstance(encoder, Encoder):
            encoder = load_encoder(encoder)
        self.check(dim=encoder.width(self.pooling), encoder=encoder.id)
        x = encoder.encode(sentences, self.pooling, self.max_length or 128, batch_size, progress)
        assert isinstance(x, np.ndarray)
        return self.transform(x)

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
        standardize: bool = True,
        corpus: dict[str, Any] | None = None,
        writer: SummaryWriter | None = None,
        state: TrainState | None = None,
        on_epoch_end: Callable[[TrainState], None] | None = None,
        progress: bool = False,
    ) -> FlowHead:
        """Fit a head to embeddings `x` (rows, dim): an array, or `Rows` such as an
        `EmbeddingFile`, which is read a block at a time and never held whole (the
        standardisation statistics are streamed too). `head.history` holds the epochs."""
        data = as_rows(x)
        if len(data.shape) != 2 or data.shape[0] < 3:
            raise BertflowError(f"need (rows ≥ 3, dim) embeddings to fit, got {data.shape}")
        stats = moments(data, what="the training embeddings")
        stats.check_varies("the training embeddings")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(train.seed)
            glow = Glow(data.shape[1], flow)
        scaler = None
        if standardize:
            scaler = Standardize.from_moments(torch.from_numpy(stats.mean).float(),
                                              torch.from_numpy(stats.std).float())
        if corpus is None:
            corpus = {"embeddings_sha256": stats.sha256}
        head = cls(glow, scaler, encoder=encoder, pooling=pooling, max_length=max_length)
        history = fit(
            head, data, train, state=state, writer=writer, on_epoch_end=on_epoch_end,
            progress=progress,
        )
        head.history = history
        best = history.best
        head.training_info = {
            "corpus": {**corpus, "size": int(data.shape[0])},
            "seed": train.seed,
            "config": train.to_dict(),
            "epochs_run": len(history.epochs),
            "best_epoch": history.best_epoch,
            "train_nll": best.get("train_nll"),
            "val_nll": best.get("val_nll"),
            "val_bits_per_dim": best.get("val_bits_per_dim"),
        }
        return head

    def describe(self) -> dict[str, Any]:
        """Who this head is, for the records of what it produced: its encoder, pooling,
        dimension, max length and training corpus."""
        return {"encoder": self.encoder.to_dict() if self.encoder else None,
                "pooling": self.pooling, "dim": self.dim, "max_length": self.max_length,
                "corpus": self.training_info.get("corpus")}

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
            "flow": self.glow.config.to_dict(),
            "standardize": (
                {"tensors": ["standardize.mean", "standardize.std"]} if self.standardize else None
            ),
            "training": self.training_info,
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write the head to folder `path` atomically: a crash leaves the old head intact. An
        existing `path` is replaced only if it is a head and holds nothing else."""
        return write_folder(path, FORMAT, self.write, legacy=_legacy_files)

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
        write_manifest(folder, FORMAT)

    @classmethod
    def load(cls, path: str | os.PathLike) -> FlowHead:
        """Rebuild a head from `config.json` and `model.safetensors`; nothing is unpickled.

        Every file is checked against the folder's manifest (heads of format 1 have none: their
        weights are checked against the config), the config against the weights file's header
        before anything is built, and the weights for finite values and a usable
        standardisation."""
        path = Path(path)
        if not path.is_dir():
            raise BertflowError(f"no flow head folder at {path}")
        manifest = verify_folder(path, FORMAT)
        config = read_json(path / _CONFIG)
        if config.get("format") != FORMAT:
            raise BertflowError(f"{path / _CONFIG} is not a bertflow head config")
        version = config.get("format_version")
        if version not in (1, FORMAT_VERSION):
            raise BertflowError(
                f"{path} has head format version {version}; "
                f"this bertflow reads versions 1 to {FORMAT_VERSION}"
            )
        if version != 1 and manifest is None:
            raise BertflowError(f"{path} has no manifest.json: the head is incomplete or altered")
        try:
            weights = config["weights"]
            file = path / str(weights["file"])
            checksum = str(weights["sha256"])
            dim, flow = int(config["dim"]), FlowConfig.from_dict(config["flow"])
            encoder = EncoderId.from_dict(config["encoder"]) if config["encoder"] else None
            pooling, max_length = config["pooling"], config["max_length"]
            if pooling is not None:
                check_pooling(pooling)
            if max_length is not None:
                check_max_length(max_length)
            standardized = bool(config["standardize"])
            training = config.get("training") or {}
            if not isinstance(training, dict) or file.parent != path or dim < 1:
                raise ValueError("bad training record, weights file or dim")
        except (KeyError, TypeError, ValueError) as e:
            problem = f"{type(e).__name__}: {first_line(e)}"
            raise BertflowError(f"{path / _CONFIG} is malformed ({problem})") from None
        if not file.is_file():
            raise BertflowError(f"{path} has no weights file {file.name}")
        if sha256_file(file) != checksum:
            raise BertflowError(
                f"{file} does not match the checksum in its config: altered or truncated"
            )
        _check_weights_header(file, dim, flow, standardized)
        try:
            tensors = load_file(str(file))
        except Exception as e:
            raise BertflowError(f"{file} is not a valid safetensors file ({e})") from None
        scaler = None
        if standardized:
            scaler = Standardize(torch.zeros(dim), torch.ones(dim))
        head = cls(
            Glow(dim, flow),
            scaler,
            encoder=encoder,
            pooling=pooling,
            max_length=max_length,
            training=training,
        )
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
    return check_folder(path, FORMAT, _legacy_files)


def _check_weights_header(file: Path, dim: int, flow: FlowConfig, standardized: bool) -> None:
    """Check the config's dimension, number of flow steps, conditioner width and
    standardisation against the tensors the weights file's header lists, before a flow of that
    size is built (the full shapes are checked when the weights are loaded)."""
    try:
        with safe_open(str(file), framework="pt") as f:
            header = {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype())
                      for name in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except Exception as e:
        raise BertflowError(f"{file} is not a valid safetensors file ({first_line(e)})") \
            from None
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
    kinds = sorted({dtype for _, dtype in header.values()} - {"F32", "I64", "BOOL"})
    if kinds:
        problems.append(f"tensors of type {', '.join(kinds)}")
    if problems:
        raise BertflowError(f"{file} does not fit its config: it holds {problems[0]}")
