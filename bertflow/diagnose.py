"""Pictures of anisotropy: the singular spectrum, random-pair cosines, token norms against
frequency, and a 2-D view, before and after a transform (`diagnose`: a head, or a flow fit on
the sentences themselves)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .cache import EmbeddingCache
from .constants import DEFAULT_BATCH_SIZE, DEFAULT_MAX_LENGTH, DEFAULT_POOLING
from .encoder import Encoder
from .errors import BertflowError
from .flow import FlowConfig
from .folders import PLOTS_FOLDER
from .head import FlowHead
from .isotropy import (
    effective_rank,
    isotropy_measures,
    mean_pair_cosine,
    pair_cosines,
    singular_values,
)
from .train import TrainConfig

__all__ = ["PLOTS", "diagnose", "plot_all", "token_frequencies"]

PLOTS = PLOTS_FOLDER.files  # spectrum.png, cosines.png, token_norms.png, projection.png
_BEFORE, _AFTER = "#c0392b", "#2471a3"


def plot_all(
    before: np.ndarray,
    after: np.ndarray,
    out: str | os.PathLike,
    *,
    encoder: Encoder,
    corpus: Sequence[str],
    title: str,
    after_label: str = "after the flow",
) -> list[Path]:
    """Write the four PNGs of `PLOTS` into folder `out`, replaced as a whole; a folder that
    holds anything else is refused."""
    out = PLOTS_FOLDER.check_destination(out)
    try:
        import matplotlib
    except ImportError:
        raise BertflowError("diagnose draws with matplotlib: pip install 'bertflow[plots]'") \
            from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {
        "spectrum.png": _spectrum(plt, before, after, title, after_label),
        "cosines.png": _cosines(plt, before, after, title, after_label),
        "token_norms.png": _token_norms(plt, encoder, corpus),
        "projection.png": _projection(plt, before, after, title, after_label),
    }
    def fill(tmp: Path) -> None:
        for name, figure in figures.items():
            figure.savefig(tmp / name, dpi=110, bbox_inches="tight")
            plt.close(figure)

    PLOTS_FOLDER.write(out, fill)
    return [Path(out) / name for name in PLOTS]


def diagnose(
    sentences: Sequence[str],
    out: str | os.PathLike,
    encoder: Encoder,
    *,
    head: FlowHead | None = None,
    pooling: str | None = None,
    max_length: int = DEFAULT_MAX_LENGTH,
    corpus: Sequence[str] | None = None,
    cache: EmbeddingCache | None = None,
    flow: FlowConfig | None = None,
    train: TrainConfig | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool | None = None,
) -> tuple[list[Path], dict[str, float | None], dict[str, float | None]]:
    """Plot `sentences`' embeddings before and after `head` (its pooling and max length; a
    given `pooling` must be the head's), or, without a head, after a flow fit on them with
    `flow` and `train`, into folder `out` (`plot_all`; token frequencies from `corpus`,
    default the sentences). Returns the plots and the isotropy measures before and after."""
    if head is not None:
        head.check(dim=encoder.width(head.pooling or pooling or DEFAULT_POOLING),
                   encoder=encoder.id, pooling=pooling)
    pooling = (head.pooling if head else None) or pooling or DEFAULT_POOLING
    max_length = (head.max_length if head else None) or max_length
    x = np.asarray((cache or EmbeddingCache()).encode(sentences, encoder, pooling, max_length,
                                                      batch_size, progress=progress))
    if head is None:
        head = FlowHead.fit(x, encoder=encoder.id, pooling=pooling, max_length=max_length,
                            flow=flow or FlowConfig(), train=train or TrainConfig(),
                            progress=progress is not False)
    z = head.transform(x)
    title = f"{encoder.id.name}, {pooling} pooling, {len(sentences)} sentences"
    paths = plot_all(x, z, out, encoder=encoder, corpus=corpus or sentences, title=title)
    return paths, isotropy_measures(x), isotropy_measures(z)


def token_frequencies(encoder: Encoder, corpus: Sequence[str]) -> Counter[int]:
    """How often each token id occurs in `corpus` under the encoder's tokenizer."""
    counts: Counter[int] = Counter()
    for ids in encoder.tokenizer(list(corpus), add_special_tokens=False)["input_ids"]:
        counts.update(ids)
    return counts


def _spectrum(plt, before, after, title, after_label):
    """Singular values over the largest, on a log scale cut at 1e-4: dead directions (a
    constant feature) are counted in the legend instead of stretching the axis."""
    figure, axis = plt.subplots(figsize=(5.5, 3.8))
    for x, label, colour in ((before, "before", _BEFORE), (after, after_label, _AFTER)):
        s = singular_values(x)
        s = s / s[0]
        dead = int((s < 1e-4).sum())
        note = f", {dead} below 1e-4" if dead else ""
        axis.semilogy(np.arange(1, len(s) + 1), np.maximum(s, 1e-4), color=colour,
                      label=f"{label} (effective rank {effective_rank(x):.0f}{note})")
    axis.set(xlabel="component", ylabel="singular value / largest", ylim=(8e-5, 1.5),
             title=f"Singular spectrum of centred embeddings\n{title}")
    axis.legend()
    return figure



def _cosines(plt, before, after, title, after_label):
    figure, axis = plt.subplots(figsize=(5.5, 3.8))
    bins = np.linspace(-1, 1, 81)
    for x, label, colour in ((before, "before", _BEFORE), (after, after_label, _AFTER)):
        axis.hist(pair_cosines(x), bins=bins, alpha=0.6, color=colour,
                  label=f"{label} (mean {mean_pair_cosine(x):.2f})")
    axis.set(xlabel="cosine of a random sentence pair", ylabel="pairs",
             title=f"Random-pair cosine similarity\n{title}")
    axis.legend()
    return figure


def _token_norms(plt, encoder: Encoder, corpus: Sequence[str]):
    counts = token_frequencies(encoder, corpus)
    ids = np.array(sorted(counts))
    weights = encoder.model.get_input_embeddings().weight.detach().float().cpu().numpy()
    norms = np.linalg.norm(weights[ids], axis=1)
    frequency = np.array([counts[i] for i in ids])
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.corrcoef(np.log(frequency), norms)[0, 1]
    figure, axis = plt.subplots(figsize=(5.5, 3.8))
    axis.scatter(frequency, norms, s=4, alpha=0.3, color=_BEFORE)
    edges = np.unique(np.geomspace(1, frequency.max() + 1, 12).astype(int))
    centres, medians = [], []
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        inside = (frequency >= low) & (frequency < high)
        if inside.any():
            centres.append(np.sqrt(low * high))
            medians.append(np.median(norms[inside]))
    axis.plot(centres, medians, "k-o", ms=3, label="median per frequency bin")
    axis.legend()
    axis.set_xscale("log")
    axis.set(xlabel=f"token frequency in the corpus ({len(corpus)} sentences)",
             ylabel="L2 norm of the static token embedding",
             title=f"Token embedding norm against frequency ({encoder.id.name})\n"
                   f"{len(ids)} tokens; Pearson r(log frequency, norm) = {rho:.2f}")
    return figure


def _projection(plt, before, after, title, after_label):
    """Unit vectors projected on their two top right-singular directions (not centred), so
    that a cone shows as a cloud far from the origin."""
    figure, axes = plt.subplots(1, 2, figsize=(9, 4.6), layout="constrained")
    rng = np.random.default_rng(0)
    rows = rng.choice(len(before), size=min(2000, len(before)), replace=False)
    for axis, x, label, colour in ((axes[0], before, "before", _BEFORE),
                                   (axes[1], after, after_label, _AFTER)):
        unit = x[rows] / np.linalg.norm(x[rows], axis=1, keepdims=True)
        _, _, vt = np.linalg.svd(unit, full_matrices=False)
        points = unit @ vt[:2].T
        axis.scatter(points[:, 0], points[:, 1], s=3, alpha=0.4, color=colour)
        axis.add_patch(plt.Circle((0, 0), 1, fill=False, color="grey", lw=0.8))
        axis.plot(0, 0, "k+")
        axis.set(xlim=(-1.1, 1.1), ylim=(-1.1, 1.1), aspect="equal", title=label)
    figure.suptitle(f"Unit vectors on their top two directions\n{title}")
    return figure
