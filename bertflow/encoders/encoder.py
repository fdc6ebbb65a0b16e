"""A frozen BERT-family encoder: sentences in, pooled float32 embeddings out, through the
fused forward where it computes the model exactly and the model's own forward elsewhere."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..constants import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_LENGTH,
    DEFAULT_POOLING,
    POOLINGS,
    PROGRESS_FROM,
)
from ..errors import BertflowError, BertflowWarning, first_line
from ..runtime.devices import resolve_device, resolve_dtype
from . import st_api
from .batches import (
    check_batch_size,
    check_max_length,
    clipped,
    release_free_memory,
    token_batches,
)
from .fused import PROBE_TOLERANCE, fused_encoder, state_gap
from .identity import EncoderId, fingerprint
from .pooling import LAYERS, check_pooling, pool
from .quantized import CALIBRATION
from .settings import FolderSettings

__all__ = ["CHUNK_SIZE", "CLIP", "Encoder"]

CHUNK_SIZE = 8192  # sentences tokenised together, then encoded a batch at a time
CLIP = 2  # sentences are clipped at this many times max_length × the longest vocabulary entry
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what the encoder is given
# the load-time probe: a batch of about 40, 25 and 5 tokens, so with padding
_PROBE = ("The old lighthouse keeper climbed the narrow spiral stairs every evening at dusk, "
          "carrying a lamp, a notebook and a flask of tea, and wrote down the colour of the sea "
          "and the ships he saw.",
          "A man is playing a guitar in the park while two children dance and a dog sleeps "
          "under the bench.",
          "Rain again today.")


class Encoder:
    """A frozen Hugging Face encoder and tokenizer on `device` in `dtype`; embeddings are float32
    and the identity (`identity.fingerprint`: of the float32 weights, the config and the
    tokenizer) depends on neither."""

    def __init__(self, model: Any, tokenizer: Any, name: str,
                 device: str | torch.device | None = "auto",
                 dtype: str | torch.dtype | None = "float32", source: str | None = None,
                 settings: FolderSettings | None = None):
        self.settings = settings or FolderSettings()  # its folder's own (`defaults`)
        self._said = False
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        model = model.eval().requires_grad_(False).float()
        self.id = EncoderId(name, fingerprint(model, tokenizer), source)
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "right"
        inputs, own = self._probe()
        self.num_layers = len(own) - 1
        self.fused = fused_encoder(self.model, self.dtype, inputs, own, name, self._calibration)
        if self.fused is None and self.dtype == torch.int8:
            raise BertflowError(f"encoder {name} ({getattr(self.model.config, 'model_type', '?')})"
                                ": dtype int8 runs only in bertflow's fused forward, which this "
                                "kind has not; use bfloat16 or float32")

    def _calibration(self) -> list[dict[str, torch.Tensor]]:
        """int8's calibration text (`quantized.CALIBRATION`), a sentence a batch, unpadded."""
        length = min(128, self.max_tokens or 128)
        return [{k: v.to(self.device) for k, v in self.tokenize(
                    [text], length, return_tensors="pt").items() if k in _INPUTS}
                for text in CALIBRATION]

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
        """The transformer's dtype by name: float32, bfloat16, float16 or int8 (its projections;
        `quantized`)."""
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

    def defaults(self, pooling: str | None = None, max_length: int | None = None
                 ) -> tuple[str, int]:
        """`pooling` and `max_length`, each where None the encoder folder's own
        sentence-transformers setting (`settings`: modules.json's pooling,
        sentence_bert_config.json's max_seq_length, within `max_tokens`), else first_last and
        128. The first time a setting of the folder applies, or one it has cannot, a note says
        so."""
        own, used, unused = self.settings, [], self.settings.unused if pooling is None else None
        if pooling is None:
            pooling = own.pooling or DEFAULT_POOLING
            used += [f"{pooling} pooling"] * (own.pooling is not None)
        if max_length is None:
            max_length = min(own.max_length, self.max_tokens or own.max_length) \
                if own.max_length else DEFAULT_MAX_LENGTH
            used += [f"max length {max_length}"] * (own.max_length is not None)
        if not self._said and (used or unused):
            self._said = True
            said = [f"{' and '.join(used)}: the encoder folder's own sentence-transformers "
                    "settings (--pooling and --max-length choose others)"] if used else []
            said += [f"{unused}: {DEFAULT_POOLING} pooling"] if unused else []
            warnings.warn(f"{self.id.name}: {'; '.join(said)}", BertflowWarning, stacklevel=2)
        return pooling, max_length

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
        """Token ids and masks, truncated to `max_length`; `kwargs` go to the tokenizer. A
        sentence longer than `CLIP` times `max_length` times the longest vocabulary entry is
        `clipped` first, to the same tokens."""
        max_length = self.check_max_length(max_length)

        def enough(text: str) -> bool:  # the tokens of `text` reach `max_length`
            kept = self.tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
            return len(kept) >= max_length

        width = CLIP * max_length * self._longest_entry
        return self.tokenizer([clipped(s, width, enough) for s in sentences], truncation=True,
                              return_special_tokens_mask=True, max_length=max_length, **kwargs)

    @functools.cached_property
    def _longest_entry(self) -> int:
        return max(map(len, self.tokenizer.get_vocab()), default=1)

    def states(self, batch: dict[str, torch.Tensor], poolings: Collection[str] = POOLINGS,
               ) -> tuple[tuple[torch.Tensor | None, ...] | None, torch.Tensor | None]:
        """The float32 hidden states and word embeddings `pool` reads for `poolings`, else None."""
        keep = {layer for p in poolings for layer in LAYERS[check_pooling(p)]}
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
