"""The flow head inside a sentence-transformers pipeline: encoder → pooling → head → Normalize.
`load_pipeline` loads a saved one without `trust_remote_code`."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from ..constants import DEFAULT_MAX_LENGTH, DEFAULT_POOLING, POOLINGS
from ..encoders.batches import check_max_length
from ..encoders.encoder import Encoder
from ..encoders.identity import EncoderId
from ..encoders.loading import load_encoder, resolve_encoder
from ..encoders.pooling import check_pooling, pool
from ..errors import BertflowError, first_line
from ..heads.head import Head
from ..storage.artifacts import PIPELINE_FOLDER
from ..storage.files import read_json
from .card import model_card

try:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import InputModule, Module, Normalize
    from sentence_transformers.util.misc import import_module_class
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("bertflow.export.pipeline needs sentence-transformers>=6: "
                      "pip install 'bertflow[st]'") from e

__all__ = ["EncoderModule", "HeadModule", "PoolingModule", "build_pipeline", "load_pipeline",
           "save_pipeline"]


class EncoderModule(InputModule):
    """A frozen Hugging Face encoder as a sentence-transformers input module."""

    config_file_name = "bertflow_encoder.json"
    config_keys = ["name", "max_length"]

    def __init__(self, encoder: Encoder | str | os.PathLike,
                 max_length: int = DEFAULT_MAX_LENGTH, name: str | None = None):
        super().__init__()
        if not isinstance(encoder, Encoder):
            encoder = load_encoder(encoder)
            if name is not None:
                encoder.id = EncoderId(name, encoder.id.fingerprint)
        if encoder.unpadded:
            raise BertflowError(f"encoder {encoder.id.name}: its hidden states change with the "
                                "padding a sentence-transformers pipeline adds to a batch; embed "
                                "with bertflow instead (bertflow encode, Head.encode)")
        self.encoder = encoder
        self.name = encoder.id.name  # saved in its config
        self.model = encoder.model  # registered, so .to(device) moves it
        self.fused = encoder.fused  # the same, for the fused forward's own weights
        self.tokenizer = encoder.tokenizer
        self.max_length = check_max_length(max_length)
        self.pooling: str | None = None  # set by the PoolingModule: what `forward` must compute

    @property
    def max_seq_length(self) -> int:
        return self.max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self.max_length = check_max_length(value)

    def preprocess(self, inputs: Sequence[Any], prompt: str | None = None,
                   **kwargs: Any) -> dict[str, Tensor]:
        if any(not isinstance(text, str) for text in inputs):
            raise BertflowError("a bertflow pipeline embeds text only")
        texts = [prompt + t for t in inputs] if prompt else list(inputs)
        return dict(self.encoder.tokenize(texts, self.max_length, padding=True,
                                          return_tensors="pt"))

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        hidden, words = self.encoder.states(features, [self.pooling] if self.pooling else POOLINGS)
        if hidden is not None:
            features["all_layer_embeddings"] = hidden
            features["token_embeddings"] = hidden[-1]
        features["word_embeddings"] = words
        return features

    def get_embedding_dimension(self) -> int:
        return self.encoder.width(self.pooling) if self.pooling else self.encoder.dim

    def save(self, output_path: str, *args: Any, **kwargs: Any) -> None:
        self.model.save_pretrained(output_path, safe_serialization=True)
        self.tokenizer.save_pretrained(output_path)
        self.save_config(output_path)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs: Any) -> EncoderModule:
        path = Path(model_name_or_path) / subfolder
        return cls(path, **_required_config(cls, path))


class PoolingModule(Module):
    """Any bertflow pooling as a pipeline module (the same `bertflow.pool` as `encode`)."""

    config_file_name = "config.json"
    config_keys = ["pooling"]

    def __init__(self, pooling: str = DEFAULT_POOLING):
        super().__init__()
        self.pooling = check_pooling(pooling)

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        features["sentence_embedding"] = pool(
            features.get("all_layer_embeddings"), features.get("word_embeddings"),
            features["attention_mask"], features["special_tokens_mask"], self.pooling)
        return features

    def on_model_ready(self, model: Any) -> None:
        # the encoder then computes only what this pooling reads
        if isinstance(model[0], EncoderModule):
            model[0].pooling = self.pooling

    def save(self, output_path: str, *args: Any, **kwargs: Any) -> None:
        self.save_config(output_path)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs: Any) -> PoolingModule:
        return cls(**_required_config(cls, Path(model_name_or_path) / subfolder))


class HeadModule(Module):
    """A `Head` as a pipeline module; it refuses an encoder or pooling other than its own."""

    def __init__(self, head: Head):
        super().__init__()
        self.head = head.eval()

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        x = features["sentence_embedding"]
        features["sentence_embedding"] = self.head.latents(x.float()).to(x.dtype)
        return features

    def on_model_ready(self, model: Any) -> None:
        encoder = next((m for m in model if isinstance(m, EncoderModule)), None)
        pooling = next((m.pooling for m in model if isinstance(m, PoolingModule)), None)
        if encoder is None:
            return self.head.check(pooling=pooling)
        wanted = self.head.settings(encoder.encoder, pooling, encoder.max_length)[1]
        if wanted != encoder.max_length:  # the head records one
            raise BertflowError(f"the head was fit on embeddings of at most {wanted} tokens; "
                                f"the pipeline's encoder truncates at {encoder.max_length}")

    def get_embedding_dimension(self) -> int:
        return self.head.out_dim

    def save(self, output_path: str, *args: Any, **kwargs: Any) -> None:
        self.head.write(Path(output_path))  # save_pipeline makes the whole folder atomic

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs: Any) -> HeadModule:
        return cls(Head.load(Path(model_name_or_path) / subfolder))


def build_pipeline(head: Head | str | os.PathLike, encoder: Encoder | str | os.PathLike
                   | None = None, normalize: bool = False) -> SentenceTransformer:
    """A SentenceTransformer: `encoder` (default: the head's) → pooling → head → [Normalize]."""
    if not isinstance(head, Head):
        head = Head.load(head)
    if head.pooling is None:
        raise BertflowError("this head does not record its pooling; cannot build a pipeline")
    encoder = resolve_encoder(encoder, head.encoder)
    pooling, max_length = head.settings(encoder)
    modules = [EncoderModule(encoder, max_length), PoolingModule(pooling),
               HeadModule(head), *([Normalize()] if normalize else [])]
    return SentenceTransformer(modules=modules, device="cpu")  # HeadModule checks the head


def save_pipeline(model: SentenceTransformer, path: str | os.PathLike) -> Path:
    """Save a `build_pipeline` pipeline to folder `path` atomically, with a model card."""
    encoder = next((m for m in model if isinstance(m, EncoderModule)), None)
    head = next((m.head for m in model if isinstance(m, HeadModule)), None)
    if encoder is None or head is None:
        raise BertflowError("not a bertflow pipeline: it has no EncoderModule or HeadModule")
    card = model_card(head, encoder.encoder, encoder.max_length,
                      any(isinstance(m, Normalize) for m in model), Path(path).name)

    def fill(tmp: Path) -> None:
        model.save(str(tmp), create_model_card=False)
        (tmp / "README.md").write_text(card, encoding="utf-8")

    return PIPELINE_FOLDER.write(path, fill)


def load_pipeline(path: str | os.PathLike, device: str = "cpu") -> SentenceTransformer:
    """Rebuild a saved pipeline from bertflow's and sentence-transformers' module classes only."""
    path = Path(path)
    PIPELINE_FOLDER.verify(path)  # a pipeline saved by `save_pipeline`; others have no manifest
    try:
        entries = json.loads((path / "modules.json").read_text(encoding="utf-8"))
        refs = [(str(e["type"]), str(e.get("path", ""))) for e in entries]
    except FileNotFoundError:
        raise BertflowError(f"{path} has no modules.json; not a sentence-transformers folder") \
            from None
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise BertflowError(f"{path / 'modules.json'} is malformed ({first_line(e)})") from None
    if not refs:
        raise BertflowError(f"{path / 'modules.json'} lists no modules")
    ours = {f"{__name__}.{c.__name__}": c for c in (EncoderModule, PoolingModule, HeadModule)}
    modules = []
    for ref, subfolder in refs:
        if ".." in Path(subfolder).parts or Path(subfolder).is_absolute():
            raise BertflowError(f"{path / 'modules.json'} points outside the folder: {subfolder}")
        if ref not in ours and not ref.startswith("sentence_transformers."):
            raise BertflowError(f"{path} uses module class {ref}, which is neither bertflow's "
                                "nor sentence-transformers'; load it with SentenceTransformer")
        try:
            module_class = ours.get(ref) or import_module_class(ref)
            if not (isinstance(module_class, type) and issubclass(module_class, Module)):
                raise TypeError(f"{ref} is not a sentence-transformers module")
            modules.append(module_class.load(str(path), subfolder=subfolder))
        except BertflowError:
            raise
        except Exception as e:  # whatever a module's loader raises, say which module failed
            raise BertflowError(f"{path}: cannot load module {ref} from "
                                f"'{subfolder or '.'}' ({type(e).__name__}: {first_line(e)})") \
                from None
    return SentenceTransformer(modules=modules, device=device)


def _required_config(module: type[Module], folder: Path) -> dict[str, Any]:
    file = folder / module.config_file_name
    config = read_json(file)
    if set(config) != set(module.config_keys):
        raise BertflowError(f"{file} must hold exactly {', '.join(module.config_keys)}")
    return config
