"""Measure each remaining difference from the BERT-flow release on STS-B dev, without labels.

For every pooling of the default encoder, a head is fit on the STS-B sentences without their
scores (train+dev+test) and scored by Spearman × 100 on STS-B dev. The first row is bertflow's
defaults and the second its flow before it factored out the release's half; every other row
changes one thing to what the release (bohanli/BERT-flow, `run_siamese.py` with `--flow=1
--flow_loss=1 --num_examples=0 --use_full_for_training=1 --num_train_epochs=1`) does, and the
last row changes all of them:

- the release's optimiser, BERT's AdamWeightDecay: decoupled weight decay 0.01, Adam's eps
  1e-6, no bias correction, the global gradient norm clipped at 1.0 and a constant learning
  rate. Its loss is the sum of two batch means in bits per dimension (one per side of a pair),
  2 / (D ln 2) times bertflow's batch mean in nats, so its clipping at 1.0 and eps 1e-6 are
  bertflow's at D ln 2 / 2 and 1e-6 · D ln 2 / 2 (133 and 1.3e-4 for D = 384); both the
  literal and the rescaled values are measured;
- the encoder's dropout active while the flow is fit (the release's BERT runs with
  `is_training=True`): the library encodes in eval mode only, so this script makes one
  stochastic pass with the model's own forward in train mode (`dropout_pass`) and fits on it,
  one pass per sentence occurrence as in one epoch of the release; heads are scored on the
  usual deterministic embeddings;
- every sentence occurrence of the pairs kept (the release iterates over pairs: both sides of
  8,628 pairs are 17,256 rows, against bertflow's 15,437 distinct sentences; "a man is playing
  a guitar ." comes 65 times);
- max sequence length 64 (its `train_siamese.sh`) instead of 128, to fit and to score;
- `cls` as the pooler's output, tanh(W h_CLS + b) (its `get_pooled_output`), not the raw state;
- no held-out split: the release trains on every row (bertflow holds out 10% even at one
  epoch, for the validation NLL);
- its ActNorm initialised on the first batch (32 rows, one side of 32 pairs) rather than
  bertflow's first 1,024 rows, and its log-scale stored divided by 3 (`logscale_factor`), which
  makes Adam move the scale 3 times as fast (`ReleaseActNorm`);
- its coupling network (`conv_stack`): bias-free layers with N(0, 0.05²) weights each followed
  by an ActNorm, and a zero output layer scaled by exp(3 · logs) (`ReleaseConditioner`);
  bertflow's is Linear-ReLU-Linear-ReLU-Linear with PyTorch's initialisation;
- no standardisation before the flow (measured alone by `recipe.py`, "nothing before the
  flow"; here only in the all-together row).

Layers and the dropout pass are built here, not in the library, which has no use for them.

Writes experiments/results/release_differences.{json,md}.

    python experiments/release_differences.py [--data DIR] [--seeds 0 1 2]
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from common import parser
from nflows.transforms import CompositeTransform
from torch import Tensor, nn

from bertflow import POOLINGS, FlowConfig, Glow, Head, TrainConfig, fit_head, load_encoder, sts
from bertflow.embeddings.cache import EmbeddingCache
from bertflow.encoders.encoder import Encoder
from bertflow.encoders.pooling import pool
from bertflow.heads.flow import ActNorm, AdditiveCoupling, StandardScaler, robust_std
from bertflow.storage.files import write_json
from bertflow.storage.rows import as_rows, moments
from bertflow.training.trainer import fit

DIM = 384  # all-MiniLM-L6-v2's width, every pooling
SCALE = DIM * math.log(2) / 2  # bertflow's loss over the release's
RELEASE_OPTIMISER = TrainConfig(weight_decay=0.01, eps=1e-6 * SCALE, bias_correction=False,
                                max_grad_norm=1.0 * SCALE, schedule="constant")


@dataclass(frozen=True)
class Variant:
    train: TrainConfig = TrainConfig()
    flow: FlowConfig = FlowConfig()
    dropout: bool = False
    duplicates: bool = False
    max_length: int = 128
    pooler: bool = False
    standardize: bool = True
    conditioner: bool = False
    actnorm: bool = False
    poolings: tuple[str, ...] = tuple(POOLINGS)


VARIANTS = {
    "bertflow defaults": Variant(),
    "first half factored out (bertflow before)": Variant(flow=FlowConfig(factor_out="first")),
    "weight decay 0.01 (decoupled)": Variant(TrainConfig(weight_decay=0.01)),
    "Adam eps 1e-6": Variant(TrainConfig(eps=1e-6)),
    "Adam eps 1e-6 of the release's loss (1.3e-4)": Variant(TrainConfig(eps=1e-6 * SCALE)),
    "no bias correction": Variant(TrainConfig(bias_correction=False)),
    "gradient norm clipped at 1.0": Variant(TrainConfig(max_grad_norm=1.0)),
    "clipped at 1.0 of the release's loss (133)": Variant(TrainConfig(max_grad_norm=SCALE)),
    "constant learning rate": Variant(TrainConfig(schedule="constant")),
    "release optimiser (all five, release loss scale)": Variant(RELEASE_OPTIMISER),
    "encoder dropout while fitting": Variant(dropout=True),
    "duplicates kept (every pair's two sentences)": Variant(duplicates=True),
    "max length 64": Variant(max_length=64),
    "pooler output instead of raw CLS": Variant(pooler=True, poolings=("cls",)),
    "no held-out split (val_fraction 0)": Variant(TrainConfig(val_fraction=0.0)),
    "ActNorm initialised on the first batch (32 rows)": Variant(TrainConfig(init_size=32)),
    "ActNorm log-scale stored ÷ 3": Variant(actnorm=True),
    "the release's coupling network": Variant(conditioner=True),
    "all of the release's choices together": Variant(
        replace(RELEASE_OPTIMISER, val_fraction=0.0, init_size=32), dropout=True,
        duplicates=True, max_length=64, pooler=True, standardize=False, conditioner=True,
        actnorm=True),
}


class ReleaseActNorm(ActNorm):
    """ActNorm as the release parametrises it: the log-scale stored divided by 3 (its
    `logscale_factor`), so that Adam moves the scale 3 times as fast."""

    def __init__(self, features: int):
        super().__init__(features)
        del self.log_scale
        self.logs = nn.Parameter(torch.zeros(features))

    @property
    def log_scale(self) -> Tensor:  # type: ignore[override]
        return 3 * self.logs

    def _initialize(self, inputs: Tensor) -> None:
        super()._initialize(inputs)  # sets `log_scale.data` on a temporary: set `logs` here
        with torch.no_grad():
            self.logs.data = -torch.log(robust_std(inputs)) / 3


class ReleaseConditioner(nn.Module):
    """The release's coupling network (its `conv_stack` on 1×1 inputs): twice a bias-free
    linear layer with N(0, 0.05²) weights, a `ReleaseActNorm` and a ReLU; then a zero linear
    layer whose output is scaled by exp(3 · logs), logs starting at 0."""

    def __init__(self, in_features: int, out_features: int, hidden: int):
        super().__init__()
        self.first = nn.Linear(in_features, hidden, bias=False)
        self.second = nn.Linear(hidden, hidden, bias=False)
        for layer in (self.first, self.second):
            nn.init.normal_(layer.weight, std=0.05)
        self.norms = nn.ModuleList([ReleaseActNorm(hidden), ReleaseActNorm(hidden)])
        self.last = nn.Linear(hidden, out_features)
        nn.init.zeros_(self.last.weight)
        nn.init.zeros_(self.last.bias)
        self.logs = nn.Parameter(torch.zeros(out_features))

    def forward(self, inputs: Tensor, context: Tensor | None = None) -> Tensor:
        h = torch.relu(self.norms[0](self.first(inputs))[0])
        h = torch.relu(self.norms[1](self.second(h))[0])
        return self.last(h) * torch.exp(3 * self.logs)


def fit_variant(x: np.ndarray, variant: Variant, train: TrainConfig) -> Head:
    """`fit_head` with the default flow, its layers swapped for the release's where the
    variant asks."""
    if not (variant.conditioner or variant.actnorm):
        return fit_head(x, flow=variant.flow, train=train,
                        before="standardize" if variant.standardize else "none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(train.seed)
        glow = Glow(x.shape[1], variant.flow)
        for module in list(glow.modules()):
            if variant.conditioner and isinstance(module, AdditiveCoupling):
                module.transform_net = ReleaseConditioner(
                    module.num_identity_features, module.num_transform_features, 32)
            if variant.actnorm and isinstance(module, CompositeTransform):
                for i, step in enumerate(module._transforms):
                    if type(step) is ActNorm:
                        module._transforms[i] = ReleaseActNorm(step.shift.numel())
    scaler = None
    if variant.standardize:
        scaler = StandardScaler.from_moments(moments(as_rows(x)))
    head = Head(glow, scaler)
    head.history = fit(head, x, train)
    return head


def main() -> None:
    options = parser(__doc__, "data", "cache", "out")
    options.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    options.add_argument("--only", nargs="+", choices=list(VARIANTS), default=None,
                         help="run only these rows; the others are kept from the .json")
    options.add_argument("--table", action="store_true",
                         help="only rebuild the .md from the .json of an earlier run")
    args = options.parse_args()
    began = time.perf_counter()
    if args.table:
        rows = json.loads((args.out / "release_differences.json").read_text())
        _write_table(rows, args.out, "")
        return

    encoder, cache = load_encoder(), EmbeddingCache(args.cache)
    splits = sts.read_stsb_splits(args.data / "STSBenchmark")
    sentences = sts.sentences_of(splits.values())
    occurrences = [s for p in splits.values() for pair in zip(p.first, p.second, strict=True)
                   for s in pair]
    dev = splits["dev"]
    _check_dropout_pass(encoder, sentences[:64])

    clean: dict[int, dict[str, np.ndarray]] = {}
    noisy: dict[tuple, dict[str, np.ndarray]] = {}

    def embeddings(max_length: int) -> dict[str, np.ndarray]:
        if max_length not in clean:
            found = cache.encode(sentences, encoder, list(POOLINGS), max_length)
            clean[max_length] = {p: np.asarray(x) for p, x in found.items()}
            clean[max_length]["pooler"] = _pooler(encoder, clean[max_length]["cls"])
        return clean[max_length]

    def training_rows(variant: Variant, pooling: str, seed: int) -> np.ndarray:
        name = "pooler" if variant.pooler and pooling == "cls" else pooling
        if variant.dropout:
            corpus = occurrences if variant.duplicates else sentences
            key = (variant.duplicates, variant.max_length, seed)
            if key not in noisy:
                noisy.clear()  # a pass of every pooling over 17,256 rows is 133 MB
                noisy[key] = dropout_pass(encoder, corpus, variant.max_length, seed)
                noisy[key]["pooler"] = _pooler(encoder, noisy[key]["cls"])
            return noisy[key][name]
        x = embeddings(variant.max_length)[name]
        if variant.duplicates:
            row = {s: i for i, s in enumerate(sentences)}
            return x[[row[s] for s in occurrences]]
        return x

    rows = []
    if args.only:
        previous = json.loads((args.out / "release_differences.json").read_text())
        rows = [r for r in previous if r["seed"] is not None and r["difference"] not in args.only]
    for pooling in POOLINGS:
        for name, x in (("raw", embeddings(128)[pooling]), ("raw, max length 64",
                        embeddings(64)[pooling])):
            rows.append({"difference": name, "pooling": pooling, "seed": None,
                         "stsb_dev": sts.pair_spearman(dev, sentences, x)})
    rows.append({"difference": "raw pooler output", "pooling": "cls", "seed": None,
                 "stsb_dev": sts.pair_spearman(dev, sentences, embeddings(128)["pooler"])})
    fitted = 0
    for difference in args.only or VARIANTS:
        variant = VARIANTS[difference]
        for seed in args.seeds:
            for pooling in variant.poolings:
                started = time.perf_counter()
                x = training_rows(variant, pooling, seed)
                train = replace(variant.train, seed=seed)
                head = fit_variant(x, variant, train)
                name = "pooler" if variant.pooler and pooling == "cls" else pooling
                z = head.transform(embeddings(variant.max_length)[name])
                row = {"difference": difference, "pooling": pooling, "seed": seed,
                       "stsb_dev": sts.pair_spearman(dev, sentences, z),
                       "fit_rows": len(x), "val_nll": head.history.best_val_nll,
                       "seconds": time.perf_counter() - started}
                rows.append(row)
                fitted += 1
                print(json.dumps(row), flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "release_differences.json", rows)
    seconds = time.perf_counter() - began
    earlier = sum(r["seed"] is not None for r in rows) - fitted
    kept = f", keeping {earlier} fits from an earlier run" if args.only else ""
    _write_table(rows, args.out, f"; {fitted} fits in {seconds:.0f} s{kept}")


def _write_table(rows: list[dict], out: Path, timing: str) -> None:
    seeds = sorted({r["seed"] for r in rows if r["seed"] is not None})
    note = (f"\nSTS-B dev Spearman × 100, all-MiniLM-L6-v2, heads fit on the STS-B sentences "
            f"without scores; cells are means over seeds {', '.join(map(str, seeds))}. Δ is "
            f"the change of the average over poolings against bertflow's defaults with the "
            f"same seed, averaged over seeds, ± its standard deviation over seeds{timing}.\n")
    table = _table(rows, seeds)
    (out / "release_differences.md").write_text(table + "\n" + note)
    print(table + note)


def dropout_pass(encoder: Encoder, sentences: Sequence[str], max_length: int,
                 seed: int, batch_size: int = 64, dropout: bool = True) -> dict[str, np.ndarray]:
    """Every pooling of `sentences` with the encoder's dropout active (the Hugging Face model
    in train mode, its own forward), batched by length; one dropout mask per sentence."""
    torch.manual_seed(seed)
    lengths = [len(ids) for ids in encoder.tokenize(sentences, max_length)["input_ids"]]
    order = np.argsort(lengths, kind="stable")
    out = {p: np.empty((len(sentences), encoder.width(p)), np.float32) for p in POOLINGS}
    model = encoder.model.train(dropout)
    try:
        with torch.no_grad():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                batch = encoder.tokenize([sentences[i] for i in rows], max_length,
                                         padding=True, return_tensors="pt")
                batch = {k: v.to(encoder.device) for k, v in batch.items()}
                inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")
                          if k in batch}  # MPNet has no token types
                hidden = model(**inputs, output_hidden_states=True).hidden_states
                words = model.get_input_embeddings()(batch["input_ids"])
                for p in POOLINGS:
                    out[p][rows] = pool(hidden, words, batch["attention_mask"],
                                        batch["special_tokens_mask"], p).cpu().numpy()
    finally:
        model.eval()
    return out


def _check_dropout_pass(encoder: Encoder, sentences: Sequence[str]) -> None:
    """With dropout off, `dropout_pass` must give the library's embeddings."""
    mine = dropout_pass(encoder, sentences, 128, 0, dropout=False)
    theirs = encoder.encode(sentences, list(POOLINGS))
    for p in POOLINGS:
        assert np.allclose(mine[p], theirs[p], atol=1e-4), p


def _pooler(encoder: Encoder, cls: np.ndarray) -> np.ndarray:
    dense = encoder.model.pooler.dense
    with torch.no_grad():
        cls = torch.from_numpy(np.array(cls, np.float32)).to(encoder.device)
        return torch.tanh(dense(cls)).cpu().numpy()


def _table(rows: list[dict], seeds: Sequence[int]) -> str:
    def mean(difference: str, pooling: str, seed: int | None = None) -> float | None:
        found = [r["stsb_dev"] for r in rows if r["difference"] == difference
                 and r["pooling"] == pooling and (seed is None or r["seed"] == seed)]
        return float(np.mean(found)) if found else None

    lines = ["| difference from the release | " + " | ".join(POOLINGS)
             + " | average | Δ |", "|---|" + "---:|" * (len(POOLINGS) + 2)]
    for raw, label in (("raw", "raw pooling (no flow)"),
                       ("raw, max length 64", "raw pooling, max length 64 (no flow)")):
        cells = [mean(raw, p) for p in POOLINGS]
        lines.append(f"| {label} | " + " | ".join(f"{c:.1f}" for c in cells)
                     + f" | {np.mean(cells):.2f} | |")
    lines.append("| raw pooler output (no flow) | " + f"{mean('raw pooler output', 'cls'):.1f}"
                 + " |" * (len(POOLINGS) + 1) + " |")
    for difference, variant in VARIANTS.items():
        if not any(r["difference"] == difference for r in rows):
            continue
        cells = [mean(difference, p) if p in variant.poolings else None for p in POOLINGS]
        mine = [p for p in POOLINGS if p in variant.poolings]
        per_seed = [np.mean([mean(difference, p, s) for p in mine]) for s in seeds]
        base = [np.mean([mean("bertflow defaults", p, s) for p in mine]) for s in seeds]
        deltas = np.subtract(per_seed, base)
        deviation = np.std(deltas, ddof=1) if len(seeds) > 1 else 0.0
        lines.append(f"| {difference} | "
                     + " | ".join("" if c is None else f"{c:.1f}" for c in cells)
                     + f" | {np.mean(per_seed):.2f} | {np.mean(deltas):+.2f} ± {deviation:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
