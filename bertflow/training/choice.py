"""A head chosen without labels: every candidate fit on the corpus (and an optional query log),
scored on a proxy task built from the corpus itself (`bertflow.training.proxy`), and the
baseline (the identity; PCA at reduced dimensions) kept unless a candidate beats it by more than
the joint 95% bootstrap interval of their paired difference (joint: for all candidates at once).
For sentence similarity a candidate must also beat it so on how alike it ranks the other
sentences from either crop (`proxy_agreement`): finding a crop's twin is not what a head for
sentence similarity is scored on.
For retrieval, vector pseudo-relevance feedback settings are candidates too, on the baseline's
vectors: a proxy query feeds back its first hits less its own item, so that finding its own
text first cannot make feedback look good (`feedback_candidates`)."""

from __future__ import annotations

import copy
import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..cosine import top_hits, unit_rows
from ..errors import BertflowError
from ..heads.head import Head
from ..heads.linear import LinearMap
from ..storage.corpus import Corpus
from .feedback import Feedback
from .proxy import Proxy, proxy_agreement, proxy_ndcg
from .recipes import Recipe
from .spec import MethodSpec
from .trainer import fit_head

__all__ = ["FEEDBACK_BETAS", "FEEDBACK_K", "RESAMPLES", "Choice", "candidates",
           "check_query_log", "choose_head", "feedback_candidates", "fit_candidate",
           "format_choice", "proxy_feedback", "query_key", "query_log", "recorded_feedback"]

RESAMPLES = 1000  # bootstrap resamples of the proxy's queries
FEEDBACK_K, FEEDBACK_BETAS = (1, 3, 5, 10), (0.25, 0.5, 1.0)  # feedback's candidate settings


def candidates(dim: int, dims: int | None = None) -> list[tuple[str, MethodSpec]]:
    """(label, method) of each candidate on `dim`-d embeddings, the baseline first: at full
    width the identity, the mean removed or its direction projected out, all-but-the-top,
    whitening (plain and Ledoit-Wolf-shrunk), fractional whitening (γ fixed, and γ from the
    eigenspectrum: `bertflow.heads.linear.spectral_gamma`) and the pooling's flow; at `dims`
    components PCA, whitening-k and fractional whitening."""
    if dims is not None:
        if not 0 < dims < dim:
            raise BertflowError(f"--dims {dims} is not between 1 and {dim - 1}, the "
                                "embeddings' width less one")
        return [(f"pca k={dims}", MethodSpec("pca", k=dims)),
                (f"whitening-k k={dims}", MethodSpec("whitening-k", k=dims)),
                *((f"fractional γ={g} k={dims}", MethodSpec("fractional", k=dims, gamma=g))
                  for g in (0.1, 0.25, 0.5, "spectrum"))]
    return [("identity (raw)", MethodSpec("identity")), ("center", MethodSpec("center")),
            ("no-mean-direction", MethodSpec("no-mean-direction")),
            *((f"abtt d={d}", MethodSpec("abtt", d=d)) for d in (1, 2, 3)),
            ("whitening", MethodSpec("whitening")),
            ("whitening, α by ledoit-wolf", MethodSpec("whitening", shrinkage="ledoit-wolf")),
            *((f"fractional γ={g}", MethodSpec("fractional", gamma=g))
              for g in (0.1, 0.25, 0.5, "spectrum")),
            ("flow (the pooling's recipe)", MethodSpec("flow"))]


def feedback_candidates() -> list[tuple[str, Feedback]]:
    """(label, feedback) of each pseudo-relevance feedback setting tried: k in `FEEDBACK_K`
    documents fed back, moved by β in `FEEDBACK_BETAS`."""
    return [(f"feedback k={k} β={beta}", Feedback(k, beta))
            for k in FEEDBACK_K for beta in FEEDBACK_BETAS]


def proxy_feedback(feedback: Feedback, queries: np.ndarray, items: np.ndarray,
                   own_kept: bool = False) -> np.ndarray:
    """The proxy's `queries` moved by `feedback` over its `items` (row i: query i's own item,
    the one relevant to it), with each query's own item left out of the documents it feeds
    back: it is still ranked, but cannot pull the query towards itself, so feedback scores
    only by what the query's neighbours bring (a pseudo-query finds its own text far more
    often than a real query finds a relevant document). `own_kept`: fed back as any other
    hit, to measure that self-retrieval."""
    unit = unit_rows(items, np.float32)
    return feedback.refine(unit_rows(queries, np.float32), lambda q, k: top_hits(q, unit, k),
                           unit.__getitem__, own=None if own_kept else np.arange(len(queries)))


def recorded_feedback(head: Head | None) -> Feedback | None:
    """The feedback a head chosen with it records (`choose_head`), checked; else None."""
    value = None if head is None else head.training_info.get("feedback")
    return None if value is None else Feedback.from_dict(value)


def fit_candidate(spec: MethodSpec, x: Any, recipe: Recipe | None = None,
                  before: LinearMap | None = None, **origin: Any) -> Head:
    """The head of `spec` fit on embeddings `x`: the flow by `recipe` (a whole one; after the
    fitted map `before` where given), a linear map in closed form; `origin` (encoder, pooling,
    max_length, corpus) recorded."""
    if spec.name == "flow":
        if not isinstance(recipe, Recipe):
            raise BertflowError("a flow candidate needs its whole recipe")
        options = {**recipe.fit_options(), **({"before": before} if before else {})}
        return fit_head(x, **origin, **options, progress=False)
    return Head.fit_linear(x, spec.name, k=spec.k, d=spec.d, shrinkage=spec.shrinkage,
                           gamma=spec.gamma, **origin)


@dataclass
class Choice:
    """Every candidate's head by label, the `label` chosen, and the evidence: each candidate's
    proxy score (nDCG@10 × 100), its paired difference from the baseline with the joint 95%
    bootstrap interval, and the proxy."""

    heads: dict[str, Head]
    label: str
    rows: list[dict[str, Any]]
    proxy: dict[str, Any]

    @property
    def head(self) -> Head:
        return self.heads[self.label]

    def evidence(self) -> dict[str, Any]:
        """What a head's config records of how it was chosen."""
        return {"chosen": self.label, "reason": self.reason(),
                "rule": "the baseline unless a candidate's joint 95% "
                "bootstrap interval of its proxy nDCG@10 difference lies above 0"
                + (", and so does that of its neighbour agreement's"
                   if "agreement" in self.rows[0] else ""),
                "proxy": self.proxy,
                **({"feedback": "each proxy query's own item left out of the documents it "
                    "feeds back"} if any("feedback" in r for r in self.rows) else {}),
                "resamples": RESAMPLES, "candidates": self.rows}

    def reason(self) -> str:
        """Why the chosen candidate was chosen, in one line."""
        row = next(r for r in self.rows if r["chosen"])
        if row is self.rows[0]:
            beaten = [r for r in self.rows[1:] if r.get("interval", (0,))[0] > 0]
            if not beaten:
                return f"kept {self.label}: no candidate beat it beyond its joint 95% interval"
            best = max(beaten, key=lambda r: r["proxy_ndcg_at_10"])
            low, high = best["agreement_interval"]
            return (f"kept {self.label}: {best['candidate']} beat it on the proxy "
                    f"({best['difference']:+.2f}) but did not rank the other sentences more "
                    f"alike from either crop (neighbour agreement "
                    f"{best['agreement_difference']:+.2f}, joint 95% interval "
                    f"[{low:+.2f}, {high:+.2f}])")
        low, high = row["interval"]
        return (f"chose {self.label}: proxy nDCG@10 {row['difference']:+.2f} over "
                f"{self.rows[0]['candidate']}, joint 95% interval [{low:+.2f}, {high:+.2f}]")


def choose_head(specs: list[tuple[str, MethodSpec]], fit: Callable[[MethodSpec], Head],
                proxy: Proxy, embed: Callable[[list[str]], np.ndarray], *,
                after: Callable[[Head], Head] | None = None,
                feedback: list[tuple[str, Feedback]] = (), seed: int = 0,
                say: Callable[[str], None] | None = None) -> Choice:
    """Fit each of `specs` (the baseline first) by `fit`, and with `after` a flow after the
    bijective linear map best on the proxy (`after(that head)`); each of `feedback` (label,
    setting) is a candidate too, the baseline's head searched with it (`proxy_feedback`; a
    copy of the head that records it). Score each on `proxy` (its texts embedded by `embed`)
    and choose: of the candidates whose interval lies above 0 (on an sts proxy, also the
    interval of their neighbour agreement's difference, `proxy_agreement`), the best on the
    proxy; else the baseline. The intervals hold jointly, at 95% for all the
    candidates at once (a bootstrap of the largest standardised deviation among them), so that
    trying more candidates does not make a chance winner likelier. A candidate that cannot be
    fit (full whitening on fewer rows than dimensions) or gives non-finite vectors gets a row
    saying why, and is not chosen."""
    queries, items = proxy.embed(embed)
    picks = np.random.default_rng(seed).integers(0, len(queries), (RESAMPLES, len(queries)))
    heads, rows, scores, agreements = {}, [], {}, {}
    total = len(specs) + (after is not None) + len(feedback)
    say = say or (lambda line: None)

    def score(label: str, method: str, make: Callable[[], Head],
              setting: Feedback | None = None, vectors: tuple | None = None) -> None:
        try:
            head = make()
            z_queries, z_items = vectors or (head.transform(queries),
                                             head.transform(items))  # finite
            if setting is not None:
                z_queries, head = (proxy_feedback(setting, z_queries, z_items),
                                   _searched_with(head, setting))
        except BertflowError as e:  # too few rows for it: a row saying so, never chosen
            if not scores:
                raise
            rows.append({"candidate": label, "method": method, "not_fit": str(e)})
            say(f"candidate {len(rows)}/{total}: {label}, not fit: {e}")
            return
        heads[label], scores[label] = head, proxy_ndcg(z_queries, z_items)
        rows.append({"candidate": label, "method": method, "out_dim": head.out_dim,
                     **({"feedback": setting.to_dict()} if setting else {}),
                     "proxy_ndcg_at_10": round(100 * float(scores[label].mean()), 4)})
        if proxy.kind == "sts":
            agreements[label] = proxy_agreement(z_queries, z_items, seed=seed)
            rows[-1]["agreement"] = round(100 * float(agreements[label].mean()), 4)
        say(f"candidate {len(rows)}/{total}: {label}, proxy nDCG@10 "
            f"{rows[-1]['proxy_ndcg_at_10']:.2f}")

    for label, spec in specs:
        score(label, spec.name, functools.partial(fit, spec))
    maps = [r for r in rows if r["candidate"] in heads and heads[r["candidate"]].glow is None
            and heads[r["candidate"]].linear.invertible]
    if after is not None and maps:
        best = max(maps, key=lambda r: r["proxy_ndcg_at_10"])["candidate"]
        score(f"flow after {best}", "flow", functools.partial(after, heads[best]))
    baseline = heads[rows[0]["candidate"]]
    vectors = (baseline.transform(queries), baseline.transform(items)) if feedback else None
    for label, setting in feedback:  # the baseline searched with feedback
        score(label, rows[0]["method"], lambda: baseline, setting, vectors)
    by_label = {row["candidate"]: row for row in rows}
    for key, values in (("", scores), ("agreement_", agreements)):
        for label, (difference, interval) in _joint_intervals(values, picks).items():
            by_label[label][f"{key}difference"], by_label[label][f"{key}interval"] = \
                difference, interval
    beaten = [r for r in rows[1:] if "interval" in r and r["interval"][0] > 0
              and r.get("agreement_interval", [1])[0] > 0]
    chosen = max(beaten, key=lambda r: r["proxy_ndcg_at_10"]) if beaten else rows[0]
    for row in rows:
        row["chosen"] = row is chosen
    return Choice(heads, chosen["candidate"], rows, proxy.describe())


def _joint_intervals(per_query: dict[str, np.ndarray],
                     picks: np.ndarray) -> dict[str, tuple[float, list[float]]]:
    """Each label's mean paired difference from the first label's `per_query` values, × 100,
    with its 95% bootstrap interval over the queries resampled by `picks`, joint for all the
    labels at once: the 95th percentile of the largest standardised deviation among them."""
    if not per_query:
        return {}
    base = next(iter(per_query.values()))
    differences = {label: values - base for label, values in per_query.items()}
    boots = {label: d[picks].mean(1) for label, d in differences.items()}
    spread = {label: float(b.std()) for label, b in boots.items()}
    deviations = [np.abs(boots[label] - d.mean()) / spread[label]
                  for label, d in differences.items() if spread[label] > 0]
    reach = float(np.percentile(np.max(deviations, axis=0), 95)) if deviations else 0.0
    found = {}
    for label, d in differences.items():
        mean, half = float(d.mean()), reach * spread[label]
        found[label] = (round(100 * mean, 4),
                        [round(100 * (mean - half), 4), round(100 * (mean + half), 4)])
    return found


def _searched_with(head: Head, feedback: Feedback) -> Head:
    """A copy of `head` that records `feedback` as its searches' (`recorded_feedback`)."""
    head = copy.deepcopy(head)
    head.training_info["feedback"] = feedback.to_dict()
    return head


def format_choice(rows: list[dict[str, Any]]) -> str:
    """The candidates' rows as a markdown table (a `*` marks the chosen one); on an sts proxy,
    with each one's neighbour agreement (`proxy_agreement`, × 100), its difference from the
    baseline's and that difference's joint 95% interval."""
    agree = "agreement" in rows[0]
    lines = ["| candidate | dims | proxy nDCG@10 | vs baseline | joint 95% interval |"
             + (" neighbour agreement |" if agree else ""),
             "|---|---:|---:|---:|---|" + ("---:|" if agree else "")]
    for row in rows:
        if "not_fit" in row:
            lines.append(f"| {row['candidate']} | | | | not fit: {row['not_fit']} |"
                         + (" |" if agree else ""))
            continue
        low, high = row["interval"]
        mark = " *" if row.get("chosen") else ""
        lines.append(f"| {row['candidate']}{mark} | {row['out_dim']} | "
                     f"{row['proxy_ndcg_at_10']:.2f} | {row['difference']:+.2f} | "
                     f"[{low:+.2f}, {high:+.2f}] |"
                     + (f" {row['agreement']:.2f} ({row['agreement_difference']:+.2f} "
                        f"[{row['agreement_interval'][0]:+.2f}, "
                        f"{row['agreement_interval'][1]:+.2f}]) |" if agree else ""))
    return "\n".join(lines)


def query_key(query: str) -> str:
    """A query as the query log's check compares it: its words, whitespace aside."""
    return " ".join(query.split())


def _digest(query: str) -> str:
    return hashlib.sha256(query_key(query).encode("utf-8")).hexdigest()[:16]


def query_log(path: Path, queries: Corpus) -> dict[str, Any]:
    """What a head records of the query log it was fit with: its file, size and digest, and a
    digest of each query, so that it is never scored on those queries (`check_query_log`)."""
    return {"file": path.name, "count": len(queries), "sha256": queries.sha256,
            "digests": sorted({_digest(q) for q in queries})}


def check_query_log(head: Head, queries: Mapping[str, str], what: str) -> None:
    """Refuse to score `queries` (id → text, `what` names them) with a head whose query log
    holds any of them, naming how many and the first."""
    log = head.training_info.get("query_log")
    if not log:
        return
    known = set(log["digests"])
    shared = [q for q in queries if _digest(queries[q]) in known]
    if shared:
        raise BertflowError(f"the head was fit with query log {log['file']}, which holds "
                            f"{len(shared)} of {what} it would score (first: query "
                            f"{shared[0]!r}): score it on queries it has not seen")
