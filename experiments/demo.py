"""The main job on the embedded defaults: fit, save, export, reload and compare, per pooling.

Fits one flow head per pooling, by the pooling's recommended recipe (`bertflow.training.recipes`),
on the Lee background corpus (2,682 unlabeled news sentences, shipped in gensim's wheel) with
the default encoder (all-MiniLM-L6-v2); saves each head under checkpoints/demo/ and exports it
there as one ONNX file (`bertflow export --format onnx`), loads both back (the ONNX file with
onnxruntime, when installed) and checks that they transform as the fitted head does; then
prints before/after numbers:

- the mean cosine of random pairs of the 152 sentences of the 50 rated Lee documents;
- Spearman × 100 against the human ratings of the 1,225 document pairs, a document being the
  mean of its sentence vectors.

With a data folder holding STSBenchmark/ (default data/, `make data`), it also fits a head per
pooling on the STS-B sentences, unlabeled (train+dev+test: the paper's "target" setting), and
scores the STS-B test pairs.

Sentences are encoded at the encoder folder's own max length (all-MiniLM-L6-v2: 256), as the
command line's are, into the embedding cache the command line uses (`bertflow eval sts data/`
then reads the STS-B sentences from there), so a second run encodes nothing.

    python experiments/demo.py [--data DIR] [--out checkpoints/demo]
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from common import REPO, parser

from bertflow import POOLINGS, Head, fit_head, lee, load_encoder, mean_pair_cosine, sts
from bertflow.embeddings.cache import EmbeddingCache
from bertflow.export.graphs import export_onnx
from bertflow.training.choice import candidates, choose_head, fit_candidate
from bertflow.training.proxy import build_proxy
from bertflow.training.recipes import recommended


def main() -> None:
    options = parser(__doc__, "data")
    options.add_argument("--out", type=Path, default=REPO / "checkpoints" / "demo",
                         help="folder for the heads")
    options.add_argument("--poolings", nargs="+", choices=POOLINGS, default=list(POOLINGS))
    options.add_argument("--seed", type=int, default=0)
    args = options.parse_args()
    began = time.perf_counter()
    print("loading the encoder", flush=True)
    encoder = load_encoder()
    max_length = encoder.defaults(POOLINGS[0])[1]
    print(f"encoder: {encoder.id}, {encoder.dim}-d, max length {max_length}")
    cache = EmbeddingCache()

    def embed(sentences: list[str], progress: bool = False) -> dict[str, np.ndarray]:
        return cache.encode(sentences, encoder, args.poolings, max_length, progress=progress)

    def fit_export_reload(x: np.ndarray, pooling: str, name: str, corpus: str) -> Head:
        recipe = recommended(pooling, x).updated(train={"seed": args.seed})
        print(f"fitting the {pooling} head on {len(x)} {name} sentences ({recipe.before}, then "
              f"{recipe.train.epochs} epoch(s) of the flow)", flush=True)
        head = fit_head(x, encoder=encoder.id, pooling=pooling, max_length=max_length,
                            corpus={"name": corpus}, progress=True, **recipe.fit_options())
        folder = head.save(args.out / f"{name}-{pooling}")
        onnx = export_onnx(head, args.out / f"{name}-{pooling}.onnx")
        print(f"  saved {folder}, exported {onnx}; reloading both", flush=True)
        _check_reloaded(head, Head.load(folder), onnx, x[:256])
        return head

    def compare(train: dict, test: dict, name: str, corpus: str,
                score: Callable[[np.ndarray], float]) -> list[tuple]:
        rows = []
        for pooling in args.poolings:
            head = fit_export_reload(train[pooling], pooling, name, corpus)
            x = np.asarray(test[pooling])
            z = head.transform(x)
            rows.append((pooling, _cosine(x), _cosine(z), score(x), score(z)))
        return rows

    def choose(sentences: list[str], train: dict, test: dict,
               score: Callable[[np.ndarray], float]) -> list[tuple]:
        """Per pooling, the head chosen without labels on the sts proxy of `sentences`
        (`bertflow fit --for sts`), and its score."""
        proxy = build_proxy("sts", (("", s) for s in sentences), name="the corpus")
        [(queries, items)] = proxy.groups.values()
        crops = {id(t): embed(t) for t in (queries, items)}
        rows = []
        for pooling in args.poolings:
            x = np.asarray(train[pooling])
            recipe = recommended(pooling, x).updated(train={"seed": args.seed})
            fit = functools.partial(fit_candidate, x=x, recipe=recipe, encoder=encoder.id,
                                    pooling=pooling, max_length=max_length)
            choice = choose_head(candidates(x.shape[1]), fit, proxy, functools.partial(
                lambda texts, p: np.asarray(crops[id(texts)][p]), p=pooling))
            rows.append((pooling, choice.label,
                         score(choice.head.transform(np.asarray(test[pooling])))))
            print(f"  {pooling}: {choice.label}", flush=True)
        return rows

    corpus = lee.background_sentences()
    rated = lee.rated_sentences()

    def lee_score(x: np.ndarray) -> float:
        return lee.judgement_spearman(lee.document_vectors(x))

    print(f"encoding the {len(corpus)} Lee background and {len(rated)} rated sentences",
          flush=True)
    x_corpus = embed(corpus, progress=True)
    rows = compare(x_corpus, embed(rated, progress=True), "lee",
                   "lee_background.cor", lee_score)
    print(f"choosing a head per pooling without labels on the {len(corpus)} background "
          "sentences (bertflow fit --for sts)", flush=True)
    x_rated = embed(rated)
    chosen = choose(corpus, x_corpus, x_rated, lee_score)
    print(f"\nLee: heads fit on {len(corpus)} background sentences; cosine over the {len(rated)} "
          "sentences of the 50 rated documents, Spearman over their 1,225 rated pairs; the "
          "flow by the pooling's recipe, and the head chosen without labels")
    _table(rows, chosen)

    stsb = args.data / "STSBenchmark"
    if stsb.is_dir():
        splits = sts.read_stsb_splits(stsb)
        sentences = sts.sentences_of(splits.values())
        print(f"\nencoding the {len(sentences)} STS-B sentences", flush=True)
        x = embed(sentences, progress=True)
        stsb_score = functools.partial(sts.pair_spearman, splits["test"], sentences)
        rows = compare(x, x, "stsb", "STS-B train+dev+test sentences", stsb_score)
        print("choosing a head per pooling without labels on them", flush=True)
        chosen = choose(sentences, x, x, stsb_score)
        print(f"\nSTS-B: heads fit on its {len(sentences)} sentences (no scores); cosine over "
              f"them, Spearman over the {len(splits['test'])} test pairs")
        _table(rows, chosen)
    else:
        print(f"\n(no STSBenchmark/ in {args.data}: STS-B rows skipped)")
    print(f"\nheads and their ONNX exports in {args.out}; {time.perf_counter() - began:.0f} s")


def _check_reloaded(head: Head, reloaded: Head, onnx: Path, x: np.ndarray) -> None:
    """The saved head transforms `x` bit for bit as the fitted one; the ONNX export (run by
    onnxruntime, where installed) to float32 rounding."""
    z = head.transform(x)
    if not np.array_equal(reloaded.transform(x), z):
        raise SystemExit("the saved head, reloaded, transforms otherwise")
    try:
        import onnxruntime
    except ImportError:
        print("  (onnxruntime is not installed: the ONNX export is left unchecked)")
        return
    session = onnxruntime.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    [z_onnx] = session.run(None, {"embeddings": np.ascontiguousarray(x, np.float32)})
    gap = float(np.abs(z_onnx - z).max())
    if gap > 1e-3:
        raise SystemExit(f"{onnx} transforms otherwise (largest difference {gap:.2g})")
    print(f"  reloaded: the saved head is identical, the ONNX export within {gap:.1g}")


def _cosine(x: np.ndarray) -> float:
    return mean_pair_cosine(torch.from_numpy(np.ascontiguousarray(x)))


def _table(rows: list[tuple], chosen: list[tuple] | None = None) -> None:
    extra = (" chosen without labels | its Spearman |", "---|---:|") if chosen else ("", "")
    print("| pooling | cosine before | cosine after | Spearman before | Spearman after |"
          + extra[0])
    print("|---|---:|---:|---:|---:|" + extra[1])
    for i, (pooling, cos_x, cos_z, rho_x, rho_z) in enumerate(rows):
        more = f" {chosen[i][1]} | {chosen[i][2]:.1f} |" if chosen else ""
        print(f"| {pooling} | {cos_x:.3f} | {cos_z:.3f} | {rho_x:.1f} | {rho_z:.1f} |{more}")


if __name__ == "__main__":
    main()
