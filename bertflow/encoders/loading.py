"""Loading an encoder from a local folder, refused unless it is one whole bidirectional text
encoder; no code of the folder ever runs."""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..constants import DEFAULT_BATCH_SIZE, DEFAULT_POOLING
from ..errors import BertflowError, first_line
from ..runtime.devices import resolve_device, resolve_dtype
from ..storage.files import read_json
from .encoder import Encoder
from .identity import EncoderId, locate, recorded_location
from .settings import read_settings

__all__ = ["check_architecture", "encode", "load_encoder", "resolve_encoder"]


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
        _check_size(transformers, config, source, name_or_path)
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
    return Encoder(model, tokenizer, name, device, dtype, address, read_settings(source))


def _check_size(transformers: Any, config: Any, source: str,
                name: str | os.PathLike | None) -> None:
    """Refuse a config.json that asks for far more weights than the folder's weights files
    hold (at 2 bytes a weight, float16's, with a factor 2 and 1 MB to spare), before the model
    is built: transformers would draw the rest at random, tens of GB for a config of hidden
    65,536. Counted on the meta device, where nothing is allocated; the pooler is left out."""
    try:
        with torch.device("meta"):
            model = transformers.AutoModel.from_config(config)
    except Exception:  # a kind that cannot be built there: its weights are checked once loaded
        return
    wanted = sum(p.numel() for key, p in model.named_parameters() if not key.startswith("pooler."))
    held = sum(f.stat().st_size for pattern in ("model*.safetensors", "pytorch_model*.bin")
               for f in Path(source).glob(pattern))
    if 2 * wanted > 2 * held + (1 << 20):
        raise BertflowError(f"encoder {name}: its config.json asks for {wanted:,} weights, its "
                            f"weights files hold {held:,} bytes: a config.json from another "
                            "model, or a half-downloaded folder")


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
        raise BertflowError(f"the encoder at {recorded.source} has changed since (its weights, "
                            f"config or tokenizer): it is {loaded.id}, not {recorded}")
    return loaded


def encode(sentences: Sequence[str], encoder: Encoder | str | os.PathLike | None = None,
           pooling: str | Sequence[str] = DEFAULT_POOLING, max_length: int = 128,
           batch_size: int = DEFAULT_BATCH_SIZE, progress: bool | None = None,
           device: str | torch.device | None = "auto",
           dtype: str | torch.dtype | None = "float32") -> np.ndarray | dict[str, np.ndarray]:
    """Embed sentences with `encoder` (an Encoder, a folder, an id or None for the default)."""
    encoder = resolve_encoder(encoder, None, device, dtype)
    return encoder.encode(sentences, pooling, max_length, batch_size, progress)
