"""A frozen BERT-family encoder, loaded from a local folder, and sentence pooling."""

from __future__ import annotations

import os
import pickle
import re
import warnings
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from . import st_api
from .batches import check_batch_size, check_max_length, release_free_memory, token_batches
from .constants import DEFAULT_BATCH_SIZE, DEFAULT_POOLING, DTYPES, POOLINGS, PROGRESS_FROM
from .encoder_id import EncoderId, fingerprint, locate, recorded_location
from .errors import BertflowError, BertflowWarning, first_line
from .files import read_json
from .forward import PROBE_TOLERANCE, fused_encoder, state_gap

__all__ = ["CHUNK_SIZE", "Encoder", "check_architecture", "check_pooling", "encode",
           "load_encoder", "pool", "resolve_device", "resolve_dtype", "resolve_encoder"]

CHUNK_SIZE = 8192  # sentences tokenised together, then encoded a batch at a time
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what the encoder is given
# the load-time probe: a batch of about 40, 25 and 5 tokens, so with padding
_PROBE = ("The old lighthouse keeper climbed the narrow spiral stairs every evening at dusk, "
          "carrying a lamp, a notebook and a flask of tea, and wrote down the colour of the sea "
          "and the ships he saw.",
          "A man is playing a guitar in the park while two children dance and a dog sleeps "
          "under the bench.",
          "Rain again today.")


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """A device from ``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``, if there."""
    name = "auto" if device is None else str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"(cpu|cuda)(:\d+)?", name):
        raise BertflowError(f"unknown device {name!r}; choose auto, cpu, cuda or cuda:N")
    resolved = torch.device(name)
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


# the hidden states each pooling reads (1: the first Transformer layer, -1: the last)
_LAYERS = {"cls": {-1}, "mean": {-1}, "first_last": {1, -1}, "last2": {-2, -1}, "static": set()}


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise BertflowError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    return pooling


def pool(hidden_states: Sequence[torch.Tensor] | None, word_embeddings: torch.Tensor | None,
         attention_mask: torch.Tensor, special_tokens_mask: torch.Tensor,
         pooling: str) -> torch.Tensor:
    r"""Sentence vectors from one batch, $m$ the attention mask, $h^{(l)}$ layer $l$'s output:
    ``cls`` $h^{(L)}_0$; ``mean`` $\sum_t m_t h^{(L)}_t / \sum_t m_t$; ``first_last`` and
    ``last2`` the masked mean of $(h^{(1)} + h^{(L)}) / 2$ and of $(h^{(L-1)} + h^{(L)}) / 2$;
    ``static`` that of the input word embeddings alone (no position embedding, no LayerNorm),
    special tokens excluded."""
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
        if pooling == "cls":
            return hidden_states[-1][:, 0]
        first, *other = (hidden_states[layer] for layer in sorted(_LAYERS[pooling]))
        tokens = (first + other[0]) / 2 if other else first
    weights = mask.unsqueeze(-1).to(tokens.dtype)
    return (tokens * weights).sum(1) / weights.sum(1).clamp(min=1)


class Encoder:
    """A frozen Hugging Face encoder and tokenizer on `device` in `dtype`; embeddings are float32
    and the identity (of the float32 weights) depends on neither."""

    def __init__(self, model: Any, tokenizer: Any, name: str,
                 device: str | torch.device | None = "auto",
                 dtype: str | torch.dtype | None = "float32", source: str | None = None):
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        model = model.eval().requires_grad_(False).float()
        self.id = EncoderId(name, fingerprint(model), source)
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "right"
        inputs, own = self._probe()
        self.num_layers = len(own) - 1
        self.fused = fused_encoder(self.model, self.dtype, inputs, own, name)

    def _probe(self) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
        """A padded batch of `_PROBE` and the model's own float32 hidden states for it. A model
        that cannot run on text alone, whose states are not one vector a token, or whose
        forward changes the model itself (BigBird's block-sparse attention turns itself off
        for good after a short input) is refused; one whose states at a sentence's tokens
        change with the batch's padding (ConvBERT's convolutions, YOSO's attention) is run on
        unpadded batches (`unpadded`), which is said once."""
        kind = getattr(self.model.config, "model_type", "unknown")
        length = min(64, self.max_tokens or 64)
        batch = self.tokenize(_PROBE, length, padding=True, return_tensors="pt")
        inputs = {k: batch[k].to(self.device) for k in _INPUTS if k in batch}
        try:
            states = self._own_states(inputs)
            rows = [self._own_states({k: v[i : i + 1, : int(inputs["attention_mask"][i].sum())]
                                      for k, v in inputs.items()})
                    for i in range(len(_PROBE))]
            again = self._own_states(inputs)
        except Exception as e:
            raise BertflowError(f"encoder {self.id.name} ({kind}) cannot embed text alone: "
                                f"{type(e).__name__}: {first_line(e)}") from None
        shape = (*inputs["input_ids"].shape, self.dim)
        if len(states) < 2 or any(tuple(h.shape) != shape for h in states):
            raise BertflowError(f"encoder {self.id.name} ({kind}): its hidden states are not "
                                "one vector of its hidden size a token, as pooling reads them")
        if not state_gap(again, states, inputs["attention_mask"]) <= PROBE_TOLERANCE:
            hint = (' (set "attention_type": "original_full" in its config.json)'
                    if hasattr(self.model.config, "attention_type") else "")
            raise BertflowError(f"encoder {self.id.name} ({kind}): its forward changes the "
                                "model itself (a batch gave other hidden states after shorter "
                                "inputs), so a sentence's vector would depend on what was "
                                f"encoded before it{hint}")
        self.unpadded = not all(
            state_gap([h[i : i + 1, : row[0].shape[1]] for h in states], row,
                      inputs["attention_mask"][i : i + 1, : row[0].shape[1]]) <= PROBE_TOLERANCE
            for i, row in enumerate(rows))
        if self.unpadded:
            warnings.warn(f"encoder {self.id.name} ({kind}): its hidden states at a sentence's "
                          "tokens change with the padding of its batch; sentences are encoded "
                          "in batches of one length, unpadded", BertflowWarning, stacklevel=3)
        return inputs, states

    def _own_states(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        with torch.inference_mode():
            own = self.model(**inputs, output_hidden_states=True, return_dict=True)
        return _cut(own.hidden_states, inputs["input_ids"])

    @property
    def dim(self) -> int:
        """The width of the hidden states $h^{(l)}$: that of every pooling but ``static``."""
        hidden = getattr(self.model.config, "hidden_size", None)
        return int(hidden) if isinstance(hidden, int) else self.embedding_dim

    @property
    def embedding_dim(self) -> int:
        """The width of the input word embeddings: that of ``static`` pooling."""
        return int(self.model.get_input_embeddings().embedding_dim)

    def width(self, pooling: str = DEFAULT_POOLING) -> int:
        """The width of `pooling`'s embeddings."""
        return self.embedding_dim if check_pooling(pooling) == "static" else self.dim

    @property
    def precision(self) -> str:
        """The transformer's dtype by name: float32, bfloat16 or float16."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def max_tokens(self) -> int | None:
        """The lower of the tokenizer's limit and the model's positions; None if neither. Kinds
        that number positions after the padding id (RoBERTa, MPNet: their position embedding
        has that padding index) have that many fewer."""
        positions = getattr(self.model.config, "max_position_embeddings", None)
        table = getattr(getattr(self.model, "embeddings", None), "position_embeddings", None)
        offset = getattr(table, "padding_idx", None)
        if isinstance(positions, int) and isinstance(offset, int):
            positions -= offset + 1
        limits = (getattr(self.tokenizer, "model_max_length", None), positions)
        return min((n for n in limits if isinstance(n, int) and 0 < n < 1_000_000), default=None)

    def check_max_length(self, max_length: Any) -> int:
        """`max_length`, refused above `max_tokens`."""
        check_max_length(max_length)
        if self.max_tokens is not None and max_length > self.max_tokens:
            raise BertflowError(f"max_length {max_length} is more than encoder {self.id.name} "
                                f"takes: at most {self.max_tokens} tokens")
        return max_length

    def __repr__(self) -> str:
        return f"Encoder({self.id}, dim={self.dim}, {self.device}, {self.precision})"

    def encode(self, sentences: str | Sequence[str], pooling: str | Sequence[str] = DEFAULT_POOLING,
               max_length: int = 128, batch_size: int = DEFAULT_BATCH_SIZE,
               progress: bool | None = None, *, show_progress_bar: bool | None = None,
               convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               normalize_embeddings: bool = False, device: str | torch.device | None = None,
               **kwargs: Any) -> Any:
        """Embed `sentences` (float32) with one pooling or several (a dict, one forward pass);
        it also takes sentence-transformers' options (`st_api`)."""
        st_api.check_options(kwargs, device)
        poolings = [check_pooling(p) for p in ([pooling] if isinstance(pooling, str) else pooling)]
        if not poolings:
            raise BertflowError("expected at least one pooling")
        sentences, single = st_api.as_sentences(sentences)
        if device is not None:
            self.to(device)
        progress = progress if show_progress_bar is None else show_progress_bar
        out = {p: np.empty((len(sentences), self.width(p)), dtype=np.float32) for p in poolings}
        show = len(sentences) >= PROGRESS_FROM if progress is None else progress
        with tqdm(total=len(sentences), desc="encoding", unit="sent", disable=not show) as bar:
            for start in range(0, len(sentences), CHUNK_SIZE):
                chunk = sentences[start : start + CHUNK_SIZE]
                for p, vectors in self.encode_chunk(chunk, poolings, max_length, batch_size,
                                                    bar.update).items():
                    out[p][start : start + len(chunk)] = vectors
        options = (single, convert_to_numpy, convert_to_tensor, normalize_embeddings)
        if isinstance(pooling, str):
            return st_api.convert(out[pooling], *options)
        return {p: st_api.convert(x, *options) for p, x in out.items()}

    def to(self, device: str | torch.device) -> Encoder:
        """Move to `device`, refused where it is missing or cannot run this dtype."""
        target = resolve_device(device)
        resolve_dtype(self.dtype, target)
        self.model.to(target)
        if self.fused is not None:
            self.fused.to(target)
        self.device = target
        return self

    get_sentence_embedding_dimension = width
    get_embedding_dimension = width  # sentence-transformers' name since version 6
    similarity_fn_name = st_api.SIMILARITY_FN_NAME
    similarity = staticmethod(st_api.similarity)
    similarity_pairwise = staticmethod(st_api.similarity_pairwise)

    def encode_chunk(self, sentences: Sequence[str], poolings: Sequence[str], max_length: int,
                     batch_size: int, advance: Callable | None = None) -> dict[str, np.ndarray]:
        """Embed one chunk with each of `poolings`, calling `advance` with each batch's size;
        its working memory then goes back to the system, so memory stays flat."""
        out = self._encode_chunk(sentences, poolings, max_length, batch_size, advance)
        release_free_memory()
        return out

    @torch.inference_mode()
    def _encode_chunk(self, sentences: Sequence[str], poolings: Sequence[str], max_length: int,
                      batch_size: int, advance: Callable | None) -> dict[str, np.ndarray]:
        check_batch_size(batch_size)
        out = {p: torch.empty(len(sentences), self.width(p), device=self.device)
               for p in poolings}
        for rows, batch in token_batches(lambda part: self.tokenize(part, max_length), sentences,
                                         self.tokenizer.pad_token_id, self.max_tokens, batch_size,
                                         unpadded=self.unpadded):
            if self.device.type == "cuda":
                batch = {k: v.pin_memory().to(self.device, non_blocking=True)
                         for k, v in batch.items()}
            hidden, words = self.states(batch, poolings)
            index = torch.from_numpy(rows).to(self.device)
            for p in poolings:
                out[p][index] = pool(hidden, words, batch["attention_mask"],
                                     batch["special_tokens_mask"], p)
            if advance is not None:
                advance(len(rows))
        return {p: vectors.cpu().numpy() for p, vectors in out.items()}

    def tokenize(self, sentences: Sequence[str], max_length: int, **kwargs: Any) -> Any:
        """Token ids and masks, truncated to `max_length`; `kwargs` go to the tokenizer."""
        return self.tokenizer(list(sentences), truncation=True, return_special_tokens_mask=True,
                              max_length=self.check_max_length(max_length), **kwargs)

    def states(self, batch: dict[str, torch.Tensor], poolings: Collection[str] = POOLINGS,
               ) -> tuple[tuple[torch.Tensor | None, ...] | None, torch.Tensor | None]:
        """The float32 hidden states and word embeddings `pool` reads for `poolings`, else None."""
        keep = {layer for p in poolings for layer in _LAYERS[check_pooling(p)]}
        hidden = words = None
        inputs = {k: batch[k] for k in _INPUTS if k in batch}
        if keep and self.fused is not None:
            hidden = self.fused(**inputs, keep=keep)
        elif keep:
            low = self.dtype != torch.float32
            with torch.autocast(self.device.type, dtype=self.dtype, enabled=low):
                if keep == {-1}:  # the model keeps no other layer
                    last = self.model(**inputs, return_dict=True).last_hidden_state
                    hidden = (*[None] * self.num_layers, *_cut([last], inputs["input_ids"]))
                else:
                    outputs = self.model(**inputs, output_hidden_states=True, return_dict=True)
                    hidden = _cut(outputs.hidden_states, inputs["input_ids"])
        if "static" in poolings:
            words = self.model.get_input_embeddings()(batch["input_ids"]).float()
        return hidden, words


def _cut(states: Sequence[torch.Tensor], input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`states` in float32 at the input's positions: kinds that pad the input to a multiple of
    a block (BigBird) return the padded positions after them in every layer but the last."""
    return tuple(h[:, : input_ids.shape[1]].float() for h in states)


def load_encoder(name_or_path: str | os.PathLike | None = None,
                 device: str | torch.device | None = "auto",
                 dtype: str | torch.dtype | None = "float32") -> Encoder:
    """Load an encoder from a folder (None: all-MiniLM-L6-v2) onto `device`; a folder whose
    config, weights and tokenizer do not make one whole model is refused."""
    resolve_dtype(dtype, resolve_device(device))  # refuse before loading anything
    import huggingface_hub
    import transformers

    huggingface_hub.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    source, name, address = locate(name_or_path)
    if not os.path.isfile(os.path.join(source, "config.json")):
        raise BertflowError(f"encoder {name_or_path} has no config.json: not a model folder, or "
                            "a half-downloaded one")
    # the kind is read from the file before transformers reads it: no Python file of the folder
    # is ever imported, and nothing is asked on stdin (trust_remote_code is False throughout)
    raw = read_json(os.path.join(source, "config.json"))
    _check_kind(raw.get("model_type"), raw.get("architectures"), name_or_path)
    local = {"local_files_only": True, "trust_remote_code": False}
    try:
        config = transformers.AutoConfig.from_pretrained(source, **local)
        check_architecture(config, name_or_path)
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, **local)
        model, loaded = transformers.AutoModel.from_pretrained(
            source, **local, output_loading_info=True, ignore_mismatched_sizes=True)
    except BertflowError:
        raise
    except Exception as e:  # a truncated or pickled weights file fails deep in the loaders
        detail = f"{type(e).__name__}: {first_line(e)}"
        if isinstance(e, pickle.UnpicklingError):
            detail = "a weights file that holds more than tensors, or a damaged one (not unpickled)"
        raise BertflowError(f"cannot load encoder {name_or_path} as a folder: {detail}") from None
    _check_weights(model, loaded, name_or_path)
    _check_tokenizer(tokenizer, config, name_or_path)
    return Encoder(model, tokenizer, name, device, dtype, address)


def _check_tokenizer(tokenizer: Any, config: Any, name: str | os.PathLike | None) -> None:
    """Refuse a tokenizer that cannot run, or that knows under half the model's vocabulary (a
    folder without its vocabulary loads one of special tokens alone, which reads every word as
    unknown)."""
    lacking = "a half-downloaded folder, or one without its tokenizer files"
    try:
        tokenizer(["a probe sentence"], truncation=True, max_length=8)
    except Exception as e:
        raise BertflowError(f"encoder {name}: its tokenizer cannot run ({first_line(e)}): "
                            f"{lacking}") from None
    vocabulary = getattr(config, "vocab_size", None)
    if isinstance(vocabulary, int) and len(tokenizer) < vocabulary / 2:
        raise BertflowError(f"encoder {name}: its tokenizer knows {len(tokenizer)} tokens, its "
                            f"model {vocabulary}: {lacking}")


def _check_weights(model: Any, loaded: dict[str, Any], name: str | os.PathLike | None) -> None:
    """Refuse weights that do not fill the model config.json describes (a tensor missing, of
    another shape, or a layer the config has no place for): such a model would run on random
    weights. Only a missing pooler is allowed (bertflow never reads it); it is zeroed, so that
    the encoder's fingerprint is the same at every load."""
    prefix = f"{getattr(model, 'base_model_prefix', '')}."

    def own_names(keys: Any) -> list[str]:  # older transformers name some keys as the file does
        return sorted(key.removeprefix(prefix) for key in keys or ())

    mismatched = sorted(loaded.get("mismatched_keys") or ())
    if mismatched:
        key, found, wanted = mismatched[0]
        raise BertflowError(f"encoder {name}: its weights do not fit its config.json: {key} is "
                            f"{tuple(found)} in the weights, {tuple(wanted)} in the model "
                            f"({len(mismatched)} such tensors)")
    missing = own_names(loaded.get("missing_keys"))
    lacking = [key for key in missing if not key.startswith("pooler.")]
    if lacking:
        raise BertflowError(f"encoder {name}: its weights lack {len(lacking)} tensors that its "
                            f"config.json asks for ({lacking[0]}, ...): a half-downloaded folder, "
                            "or a config.json from another model")
    own = {child for child, _ in model.named_children()}
    buffers = {buffer for buffer, _ in model.named_buffers()}
    extra = [key for key in own_names(loaded.get("unexpected_keys"))
             if key.split(".")[0] in own and key not in buffers]
    if extra:
        raise BertflowError(f"encoder {name}: its weights hold {len(extra)} tensors that its "
                            f"config.json has no place for ({extra[0]}, ...): a config.json "
                            "from another model")
    with torch.no_grad():
        for key in missing:
            model.get_parameter(key).zero_()


def check_architecture(config: Any, name: str | os.PathLike | None) -> None:
    """Refuse a model that is not a bidirectional text encoder: one whose kind transformers
    pairs with a masked-language-model head (BERT, RoBERTa, MPNet, ...), used as an encoder,
    with at least one Transformer layer."""
    kind, architectures = (getattr(config, key, None) for key in ("model_type", "architectures"))
    _check_kind(kind, architectures, name, _encoder_decoder(config))
    if getattr(config, "is_decoder", False):
        raise BertflowError(f"encoder {name} is a {kind} model ({_named(architectures)}) set to "
                            f"run as a decoder (is_decoder: true in its config.json): {_SUPPORTED}")
    if getattr(config, "num_hidden_layers", None) == 0:
        raise BertflowError(f"encoder {name} has no Transformer layers (num_hidden_layers: 0 in "
                            "its config.json)")


_SUPPORTED = ("bertflow pools the hidden states of a bidirectional text encoder (BERT, RoBERTa, "
              "MPNet, DistilBERT, ... : a kind with a masked-language-model head)")


def _named(architectures: Any) -> str:
    names = architectures if isinstance(architectures, list) else []
    return ", ".join(str(a) for a in names) or "no architectures named"


def _check_kind(kind: Any, architectures: Any, name: str | os.PathLike | None,
                encoder_decoder: bool = False) -> None:
    """Refuse a `kind` (config.json's model_type) that transformers does not pair with a
    masked-language-model head, or an encoder-decoder."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    if not isinstance(kind, str) or not kind:
        raise BertflowError(f"encoder {name}: its config.json names no model_type (the kind of "
                            f"model): {_SUPPORTED}")
    if kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES or encoder_decoder:
        raise BertflowError(f"encoder {name} is a {kind} model ({_named(architectures)}): "
                            f"{_SUPPORTED}, not a decoder-only, encoder-decoder or vision model")


def _encoder_decoder(config: Any) -> bool:
    """Whether `config` describes an encoder-decoder, by its own flag or by its kind's default
    (a BART folder that says otherwise is still one)."""
    try:
        default = type(config)().is_encoder_decoder
    except Exception:  # a config class that needs arguments: its own flag decides
        default = False
    return bool(getattr(config, "is_encoder_decoder", False) or default)


def resolve_encoder(encoder: Encoder | str | os.PathLike | None,
                    recorded: EncoderId | None = None, device: str | torch.device | None = "auto",
                    dtype: str | torch.dtype | None = "float32") -> Encoder:
    """`encoder`, or loaded from the folder or id it names; when None, the one `recorded` names
    (checked to have the same weights still), else the default."""
    if isinstance(encoder, Encoder):
        return encoder
    if encoder is not None or recorded is None:
        return load_encoder(encoder, device, dtype)
    loaded = load_encoder(recorded_location(recorded), device, dtype)
    if loaded.id.fingerprint != recorded.fingerprint:
        raise BertflowError(f"the encoder at {recorded.source} has changed since: its weights "
                            f"are {loaded.id}, not {recorded}")
    return loaded


def encode(sentences: Sequence[str], encoder: Encoder | str | os.PathLike | None = None,
           pooling: str | Sequence[str] = DEFAULT_POOLING, max_length: int = 128,
           batch_size: int = DEFAULT_BATCH_SIZE, progress: bool | None = None,
           device: str | torch.device | None = "auto",
           dtype: str | torch.dtype | None = "float32") -> np.ndarray | dict[str, np.ndarray]:
    """Embed sentences with `encoder` (an Encoder, a folder, an id or None for the default)."""
    encoder = resolve_encoder(encoder, None, device, dtype)
    return encoder.encode(sentences, pooling, max_length, batch_size, progress)
