"""A head in words: what `bertflow info` and `fit` print of it, and a pipeline's model card. A
head is described by its record (its config.json), so a head folder is described without torch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..config import nll_text
from ..storage.artifacts import HEAD_FOLDER

if TYPE_CHECKING:
    from ..encoders.encoder import Encoder
    from ..heads.head import Head

__all__ = ["details", "model_card", "summary", "tagline"]

_POOLING_TEXT = {
    "cls": "the last layer's state of the first ([CLS]) token",
    "mean": "the mean of the last layer's token states",
    "first_last": "the mean over tokens of the average of the first and the last Transformer "
                  "layers' states",
    "last2": "the mean over tokens of the average of the last two layers' states",
    "static": "the mean of the input word embeddings (no context), special tokens excluded",
}
_BEFORE_TEXT = {"standardisation": "a standardisation per dimension, then ",
                "whitening": "a full whitening, then ",
                "fractional": "a fractional whitening, then ", "nothing": ""}


def summary(head: Head | Path) -> str:
    """What the head (or the head folder) computes, in one line."""
    return _summary(_record(head))


def _summary(record: dict[str, Any]) -> str:
    training, c = record["training"], record["flow"]
    dim, out_dim = record["dim"], (record["linear"] or {}).get("out_dim", record["dim"])
    if c is None:
        options = ", ".join(f"{key} {training[key]}" for key in (
            "k", "d", "shrinkage", "shrinkage_estimator", "gamma", "gamma_estimator")
            if key in training)
        return (f"{record['method']}{f' ({options})' if options else ''}, a linear map {dim} → "
                f"{out_dim}")
    before = f"{_mapped(record)}, then a " if record["linear"] else ""
    return (f"{before}Glow: {c['levels']} levels × depth {c['depth']}, {c['coupling']} "
            f"coupling, width {c['hidden']}, {c['linear']} mixing")


def tagline(head: Head | Path) -> str:
    """Its encoder, pooling, width and training corpus size, in one line."""
    record = _record(head)
    return (f"{(record['encoder'] or {}).get('name', '?')}, {record['pooling']} pooling, "
            f"{record['dim']}-d, fit on {record['training']['corpus'].get('size')} sentences")


def details(head: Head | Path) -> list[tuple[str, str]]:
    """What the head (or the head folder) is and how it was fit, as labelled rows."""
    record = _record(head)
    training, encoder = record["training"], record["encoder"]
    dim, out_dim = record["dim"], (record["linear"] or {}).get("out_dim", record["dim"])
    corpus = training.get("corpus") if isinstance(training.get("corpus"), dict) else {}
    digest = next((str(corpus[k]) for k in ("sha256", "npy_sha256", "embeddings_sha256")
                   if k in corpus), "?")
    source = f"{corpus['file']}: " if corpus.get("file") else ""
    config = training.get("config") if isinstance(training.get("config"), dict) else {}
    rows = [
        ("dim", str(dim) if out_dim == dim else f"{dim} → {out_dim}"),
        ("encoder", f"{encoder['name']} [{encoder['fingerprint']}]" if encoder else "unknown"),
        ("pooling", record["pooling"] or "unknown"),
        ("max length", str(record["max_length"])),
        ("method", _summary(record)),
        ("before", _before(record) if record["flow"] else None),
        ("parameters", f"{_parameters(head):,}"),
        ("corpus", f"{source}{corpus.get('size', '?')} rows, sha256 {digest[:16]}"),
        ("seed", str(training["seed"]) if "seed" in training else None),
        ("epochs", f"best {training.get('best_epoch')} of {training['epochs_run']}"
         if "epochs_run" in training else None),
        ("val NLL", (nll_text(training) or "unknown") if record["flow"] else None),
        ("training options", ", ".join(f"{k}={v}" for k, v in config.items()) or None),
        ("chosen", _chosen(training)),
        ("query log", f"{log['file']}: {log['count']} queries" if isinstance(
            log := training.get("query_log"), dict) else None),
        ("feedback", ", ".join(f"{k} {v}" for k, v in feedback.items()) + " (searches)"
         if isinstance(feedback := training.get("feedback"), dict) else None),
    ]
    return [(k, v) for k, v in rows if v is not None]


def _chosen(training: dict) -> str | None:
    """How a head chosen without labels was chosen (`bertflow.training.choice`), in words."""
    choice = training.get("choice")
    if not isinstance(choice, dict):
        return None
    rows = choice.get("candidates") or []
    row = next((r for r in rows if isinstance(r, dict) and r.get("chosen")), {})
    return (f"{choice.get('chosen')} of {len(rows)} candidates on a "
            f"{(choice.get('proxy') or {}).get('kind', '?')} proxy, "
            f"{row.get('difference', 0):+.2f} nDCG@10 × 100 against the baseline")


def _before(record: dict[str, Any]) -> str:
    """What a flow head applies before its Glow: standardisation, (fractional) whitening or
    nothing."""
    return "standardisation" if record["standardize"] else \
        _mapped(record) if record["linear"] else "nothing"


def _mapped(record: dict[str, Any]) -> str:
    """A head's linear map's method (a head whose config names none whitens, as it loads)."""
    return record["linear"].get("method") or "whitening"


def _record(head: Head | Path) -> dict[str, Any]:
    """The record of `head`, as its folder's config.json holds it."""
    if isinstance(head, Path):
        return HEAD_FOLDER.read(head)
    from ..heads.format import head_config

    return head_config(head)


def _parameters(head: Head | Path) -> int:
    """The count of `head`'s weights (a folder's read from its weights file's header)."""
    if not isinstance(head, Path):
        return sum(t.numel() for t in head.state_dict().values())
    from safetensors import safe_open

    with safe_open(head / HEAD_FOLDER.files[1], framework="numpy") as weights:
        return sum(math.prod(weights.get_slice(k).get_shape()) for k in weights.keys())


def model_card(head: Head, encoder: Encoder, max_length: int, normalized: bool,
               name: str = "PATH") -> str:
    """The README.md of a saved pipeline (`encoder` → pooling → `head` → [unit length])."""
    identity, flow = encoder.id, head.glow is not None
    lines = [
        "---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity",
        "tags:", "- bertflow", "- sentence-transformers", "- sentence-similarity",
        *(["- normalizing-flow"] if flow else []), "---", "",
        f"# bertflow pipeline: {identity.name}, {head.pooling} pooling, "
        f"{'BERT-flow' if flow else head.method} head", "",
        "Sentence embeddings " + ("made isotropic by a normalizing flow (BERT-flow)" if flow
                                  else f"post-processed by a linear map ({head.method})") +
        f", exported by bertflow {__version__} as a sentence-transformers pipeline of these "
        "modules:", "",
        f"1. **Encoder**: `{identity.name}` (fingerprint `{identity.fingerprint}`), "
        f"frozen: {encoder.num_layers} layers, {encoder.dim}-d hidden states, input cut at "
        f"{max_length} tokens.",
        f"2. **Pooling**: `{head.pooling}`, {_POOLING_TEXT[str(head.pooling)]}.",
        f"3. **Head**: {summary(head)}, fit in closed form on the pooled embeddings "
        f"({head.dim}-d in, {head.out_dim}-d out)." if not flow else
        f"3. **Head**: a BERT-flow head, {_BEFORE_TEXT[_before(_record(head))]}a Glow "
        f"normalizing flow that maps the {head.dim}-d pooled embeddings to latents distributed "
        "as a standard normal.",
        *(["4. **Normalize**: each vector scaled to unit length."] if normalized else []),
        "", f"The output has {head.out_dim} dimensions; compare vectors by cosine similarity "
        "(`model.similarity`).", "",
        "## The head", "", "Fit without labels on the pooled embeddings of its corpus; the "
        "encoder is not trained.", "", "| | |", "|---|---|",
        *(f"| {k} | {v} |" for k, v in details(head)), "",
        "## How to load it", "", "```python",
        "from bertflow.export.pipeline import load_pipeline", "",
        f'model = load_pipeline("{name}")',
        'embeddings = model.encode(["A man is playing a guitar.", "Someone plays music."])',
        "print(model.similarity(embeddings, embeddings))", "```", "",
        "`load_pipeline` checks every file against `manifest.json`, builds only bertflow's and "
        "sentence-transformers' module classes (nothing is unpickled) and refuses a head fit "
        "on another encoder, pooling, dimension or maximum length; it returns a "
        "`SentenceTransformer`, and needs `pip install bertflow[st]`. "
        f'`SentenceTransformer("{name}")` refuses the folder: sentence-transformers imports '
        "only its own module classes unless given `trust_remote_code=True`, which lets a "
        "folder import and run any Python code; never pass it for a folder you received.", "",
    ]
    return "\n".join(lines)
