"""Plots of anisotropy before and after a head, every method's alignment and uniformity on STS-B,
and the input word embeddings' degeneration (Gao et al., 2019)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import rankdata

from ..constants import DEFAULT_BATCH_SIZE
from ..data.sts import Pairs, positive_pairs, read_stsb_splits, sentences_of
from ..embeddings.cache import EmbeddingCache
from ..embeddings.isotropy import (
    effective_rank,
    isotropy_measures,
    mean_pair_cosine,
    pair_cosines,
    singular_values,
)
from ..encoders.encoder import Encoder
from ..errors import BertflowError
from ..heads.head import Head
from ..heads.linear import linear_options
from ..storage.artifacts import PLOTS_FOLDER
from ..training.recipes import Recipe
from .methods import Method, flow_by_recipe, make_method
from .sts import pair_measures

__all__ = ["COMPARED", "PLOTS", "STSB_SPLITS", "diagnose", "method_points", "plot_all",
           "token_frequencies"]

PLOTS = PLOTS_FOLDER.files  # alignment_uniformity.png only where STS-B was given
STSB_SPLITS = ("dev", "test")  # the STS-B pairs of the alignment and uniformity plot
Points = Mapping[str, Mapping[str, "float | None"]]
_BEFORE, _AFTER = "#c0392b", "#2471a3"
COMPARED = ("raw", "standardize", "whitening", "whitening-k", "abtt", "flow")  # the plots' methods
# `isotropy_measures` as said: the name tables give each, its decimals (None: 3 significant)
_MEASURES = {"mean_cosine": ("mean pair cosine", 3), "effective_rank": ("effective rank", 1),
             "condition_number": ("condition number", None),
             "isotropy": ("partition isotropy I(W)", 3)}


def plot_all(before: np.ndarray, after: np.ndarray, out: str | os.PathLike, *,
             encoder: Encoder, corpus: Sequence[str], title: str,
             after_label: str = "after the flow", points: Points | None = None,
             points_title: str = "") -> list[Path]:
    """Write the PNGs of `PLOTS` into folder `out`, replaced as a whole (a folder holding
    anything else is refused); `alignment_uniformity.png` only with `points`."""
    out = PLOTS_FOLDER.check_destination(out)
    try:
        import matplotlib
    except ImportError:
        raise BertflowError("diagnose draws with matplotlib: pip install 'bertflow[plots]'") \
            from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    counts = token_frequencies(encoder, corpus)
    weights = encoder.model.get_input_embeddings().weight.detach().double().cpu().numpy()
    _, singular, directions = np.linalg.svd(weights, full_matrices=False)  # uncentred, once
    sides = ((before, "before", _BEFORE), (after, after_label, _AFTER))
    tokens = (encoder, weights, counts, len(corpus))
    small, constrained = {"figsize": (5.5, 3.8)}, {"layout": "constrained"}
    figures: dict[str, tuple[dict[str, Any], Callable[[Any], None]]] = {  # subplots' options
        "spectrum.png": (small, lambda axis: _spectrum(axis, sides, title)),
        "cosines.png": (small, lambda axis: _cosines(axis, sides, title)),
        "token_norms.png": (small, lambda axis: _token_norms(axis, *tokens)),
        "projection.png": ({"ncols": 2, "figsize": (9, 4.6), **constrained},
                           lambda axes: _projection(plt, axes, sides, title)),
        "token_projection.png": ({"figsize": (6.5, 5), **constrained},
                                 lambda axis: _token_projection(axis, *tokens, directions)),
        "token_spectrum.png": (small, lambda axis: _token_spectrum(axis, encoder, weights,
                                                                   singular)),
    }
    if points is not None:
        about = f"{points_title}\n{title}" if points_title else title
        figures["alignment_uniformity.png"] = (
            {"figsize": (6, 4.5)}, lambda axis: _alignment_uniformity(axis, points, about))

    def fill(tmp: Path) -> None:
        for name, (options, draw) in figures.items():
            figure, axis = plt.subplots(**options)
            draw(axis)
            figure.savefig(tmp / name, dpi=110, bbox_inches="tight")
            plt.close(figure)

    PLOTS_FOLDER.write(out, fill)
    return [Path(out) / name for name in PLOTS if name in figures]


def diagnose(sentences: Sequence[str], out: str | os.PathLike, encoder: Encoder, *,
             head: Head | None = None, pooling: str | None = None,
             max_length: int | None = None, corpus: Sequence[str] | None = None,
             cache: EmbeddingCache | None = None, recipe: Recipe | dict[str, Any] | None = None,
             batch_size: int = DEFAULT_BATCH_SIZE, progress: bool | None = None,
             data: str | os.PathLike | None = None, say: Callable[[str], None] | None = None,
             ) -> tuple[list[Path], dict[str, float | None], dict[str, float | None]]:
    """Plot `sentences`' embeddings into `out` before and after `head` or a flow fit on them by
    `recipe`; with `data` (SentEval's layout), also every method's alignment and uniformity on
    STS-B dev and test. `say` reports those and the isotropy measures, which are returned with
    the plots."""
    PLOTS_FOLDER.check_destination(out)  # before any work, and again when writing
    stsb = None if data is None else list(read_stsb_splits(Path(data) / "STSBenchmark",
                                                           STSB_SPLITS).values())
    pooling, max_length = head.settings(encoder, pooling, max_length) if head is not None \
        else encoder.defaults(pooling, max_length)
    embed = (cache or EmbeddingCache()).embedder(encoder, pooling, max_length, batch_size,
                                                 progress)
    x = embed(sentences)
    label = "flow" if head is None else f"the head ({head.method})"
    if head is None:
        head = flow_by_recipe(pooling, recipe, progress=progress is not False).fit(x).head
    z = head.transform(x)
    say = say or (lambda line: None)
    points, about = None, ""
    if stsb is None:
        say("alignment_uniformity.png left out: it needs STS-B (a data folder in SentEval's "
            "layout: --data DATA)")
    else:
        points = method_points(x, stsb, embed(sentences_of(stsb)), head, flow_label=label)
        about = (f"STS-B {'+'.join(STSB_SPLITS)}: {len(positive_pairs(stsb))} pairs with gold "
                 f"≥ 4, {len(sentences_of(stsb))} sentences; methods fit on the diagnosed "
                 "sentences")
        say(f"alignment and uniformity ({about}):")
        say(f"  {'':24}{'alignment':>11}{'uniformity':>11}")
        for name, v in points.items():
            a, u = ("n/a" if v[k] is None else f"{v[k]:.3f}" for k in ("alignment", "uniformity"))
            say(f"  {name:24}{a:>11}{u:>11}")
    title = f"{encoder.id.name}, {pooling} pooling, {len(sentences)} sentences"
    paths = plot_all(x, z, out, encoder=encoder, corpus=corpus or sentences, title=title,
                     points=points, points_title=about)
    before, after = isotropy_measures(x), isotropy_measures(z)
    width = max(len(name) for name, _ in _MEASURES.values())
    say(f"{'':{width}}{'before':>12}{'after':>12}")
    for key, (name, digits) in _MEASURES.items():
        cells = ["inf" if v is None else f"{v:.3g}" if digits is None else _fixed(v, digits)
                 for v in (before[key], after[key])]
        say(f"{name:{width}}{cells[0]:>12}{cells[1]:>12}")
    return paths, before, after


def method_points(x: np.ndarray, pairs: Sequence[Pairs], y: np.ndarray, head: Head,
                  flow_label: str = "flow") -> dict[str, dict[str, float | None]]:
    """The `pair_measures` of `pairs` (embedded by `y`) after each method the paper compares
    (`COMPARED`) fit on `x` (the flow being `head`), by label: whitening-K, abtt-D, the flow as
    `flow_label`."""
    k, d = linear_options("whitening-k", x.shape[1])["k"], linear_options("abtt", x.shape[1])["d"]
    labels = {"whitening-k": f"whitening-{k}", "abtt": f"abtt-{d}", "flow": flow_label}
    sentences = sentences_of(pairs)
    points = {}
    for name in COMPARED:
        method = Method("flow", head=head) if name == "flow" else make_method(name).fit(x)
        points[labels.get(name, name)] = pair_measures(pairs, sentences, method.transform(y))
    return points


def token_frequencies(encoder: Encoder, corpus: Sequence[str]) -> Counter[int]:
    """How often each token id occurs in `corpus` under the encoder's tokenizer."""
    ids = encoder.tokenizer(list(corpus), add_special_tokens=False)["input_ids"]
    return Counter(token for sentence in ids for token in sentence)


def _spectrum(axis, sides, title):
    """Singular values over the largest, cut at 1e-4: dead directions are counted instead; the
    axis spans the values drawn."""
    for x, label, colour in sides:
        s = singular_values(x)
        s = s / s[0]
        dead = int((s < 1e-4).sum())
        note = f", {dead} below 1e-4" if dead else ""
        axis.semilogy(np.arange(1, len(s) + 1), np.maximum(s, 1e-4), color=colour,
                      label=f"{label} (effective rank {effective_rank(x):.0f}{note})")
    axis.set(xlabel="component", ylabel="singular value / largest",
             title=f"Singular spectrum of centred embeddings\n{title}")
    axis.legend()


def _cosines(axis, sides, title):
    bins = np.linspace(-1, 1, 81)
    for x, label, colour in sides:
        axis.hist(pair_cosines(x), bins=bins, alpha=0.6, color=colour,
                  label=f"{label} (mean {_fixed(mean_pair_cosine(x), 2)})")
    axis.set(xlabel="cosine of a random sentence pair", ylabel="pairs",
             title=f"Random-pair cosine similarity\n{title}")
    axis.legend()


def _token_norms(axis, encoder: Encoder, weights: np.ndarray, counts: Counter[int],
                 corpus_size: int):
    ids = np.array(sorted(counts))
    norms = np.linalg.norm(weights[ids], axis=1)
    frequency = np.array([counts[i] for i in ids])
    with np.errstate(divide="ignore", invalid="ignore"):  # Spearman's: of the ranks
        rho = np.corrcoef(rankdata(frequency), rankdata(norms))[0, 1]
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
    axis.set(xlabel=f"token frequency in the corpus ({corpus_size} sentences)",
             ylabel="L2 norm of the static token embedding",
             title=f"Token embedding norm against frequency ({encoder.id.name})\n"
                   f"{len(ids)} tokens; Spearman ρ = {_fixed(rho, 2)}; bin medians "
                   f"{_fixed(min(medians), 2)} to {_fixed(max(medians), 2)}")


def _fixed(value: float, digits: int) -> str:
    """`value` to `digits` decimals, a zero unsigned: never "-0.00"."""
    return f"{round(value, digits) + 0.0:.{digits}f}"


def _token_projection(axis, encoder: Encoder, weights: np.ndarray, counts: Counter[int],
                      corpus_size: int, directions: np.ndarray):
    """The input word embeddings on their top two right-singular `directions` (rows), uncentred
    as in Gao et al. (2019), coloured by log10 of the token's count in the corpus."""
    points = weights @ directions[:2].T
    count = np.zeros(len(weights))
    count[list(counts)] = list(counts.values())
    seen = np.flatnonzero(count > 0)
    seen = seen[np.argsort(count[seen], kind="stable")]  # the most frequent drawn last
    unseen = count == 0
    axis.scatter(points[unseen, 0], points[unseen, 1], s=2, color="#bbbbbb", alpha=0.5,
                 label=f"never in the corpus ({int(unseen.sum())} tokens)")
    dots = axis.scatter(points[seen, 0], points[seen, 1], s=3, c=np.log10(count[seen]),
                        cmap="viridis", alpha=0.8, vmin=0)
    axis.figure.colorbar(dots, ax=axis,
                         label=f"log10 count in the corpus ({corpus_size} sentences)")
    axis.plot(0, 0, "k+")
    axis.legend(loc="best", markerscale=4, fontsize=8)
    axis.set(xlabel="first singular direction", ylabel="second singular direction",
             title=f"Input word embeddings on their top two singular directions\n(uncentred, "
                   f"as Gao et al. 2019; {encoder.id.name}, {len(weights)} tokens × "
                   f"{weights.shape[1]})")


def _token_spectrum(axis, encoder: Encoder, weights: np.ndarray, singular: np.ndarray):
    """Singular values of the input word embeddings over the largest, uncentred and centred."""
    for s, label, colour in ((singular, "uncentred (as Gao et al.)", _BEFORE),
                             (singular_values(weights), "centred", _AFTER)):
        axis.semilogy(np.arange(1, len(s) + 1), s / s[0], color=colour, label=label)
    axis.set(xlabel="index", ylabel="singular value / largest",
             title=f"Singular values of the input word embeddings\n{encoder.id.name}, "
                   f"{len(weights)} tokens × {weights.shape[1]}")
    axis.legend()


def _alignment_uniformity(axis, points: Points, title: str):
    """Each method's uniformity (x) against its alignment (y), as in SimCSE's Figure 2."""
    shown = [(label, v["uniformity"], v["alignment"]) for label, v in points.items()
             if v["uniformity"] is not None and v["alignment"] is not None]
    for i, (label, u, a) in enumerate(shown):  # labelled by marker: close points overlap
        axis.scatter(u, a, s=50, color=f"C{i}", marker="os^Dv<>P"[i % 8], zorder=3,
                     alpha=0.8, label=f"{label} ({u:.2f}, {a:.3f})")
    if shown:
        axis.legend(fontsize=7, title="method (uniformity, alignment)", title_fontsize=7)
    else:
        axis.text(0.5, 0.5, "no pair with gold ≥ 4", ha="center", transform=axis.transAxes)
    axis.margins(0.2)
    axis.grid(alpha=0.3)
    axis.set(xlabel="uniformity: log mean exp(−2‖u − v‖²) over random pairs",
             ylabel="alignment: mean ‖u − v‖² over pairs with gold ≥ 4",
             title=f"Alignment and uniformity (lower left is better)\n{title}")


def _projection(plt, axes, sides, title):
    """Unit vectors on their two top right-singular directions (uncentred: a cone shows)."""
    n = len(sides[0][0])  # rows, as many after as before
    rows = np.random.default_rng(0).choice(n, size=min(2000, n), replace=False)
    for axis, (x, label, colour) in zip(axes, sides, strict=True):
        unit = x[rows] / np.linalg.norm(x[rows], axis=1, keepdims=True)
        _, _, vt = np.linalg.svd(unit, full_matrices=False)
        points = unit @ vt[:2].T
        axis.scatter(points[:, 0], points[:, 1], s=3, alpha=0.4, color=colour)
        axis.add_patch(plt.Circle((0, 0), 1, fill=False, color="grey", lw=0.8))
        axis.plot(0, 0, "k+")
        axis.set(xlim=(-1.1, 1.1), ylim=(-1.1, 1.1), aspect="equal", title=label)
    axes[0].figure.suptitle(f"Unit vectors on their top two directions\n{title}")
