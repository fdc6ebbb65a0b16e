"""The label-free choice for sentence similarity (`bertflow fit CORPUS --for sts`) on three STS
sets, scored on their ratings only afterwards.

Per encoder and pooling, each task's head is chosen on its own unlabeled sentences as the
command line chooses it: every candidate (the identity, the linear maps, the pooling's flow by
its recipe, seed 0, and a flow after the map best on the proxy) fit on the sentences and scored
on the proxy built from them (the first three fifths of each sentence's words find its last three
fifths), the identity kept unless a candidate beats it beyond its joint 95% bootstrap interval
and ranks the other sentences at least as alike from either crop (neighbour agreement,
`bertflow.training.proxy.proxy_agreement`). The sentences: Lee's 2,682 background sentences;
every STS-B and every SICK sentence (train, dev and test, without their scores: the paper's
target setting). Then every candidate is scored, Spearman × 100 against the ratings: Lee's 1,225
document pairs (a document the mean of its sentence vectors), and the STS-B and SICK-R test
pairs. The table shows the identity, the head chosen and its score, what the crops alone would
have chosen, the best candidate, and the Spearman over candidates of the proxy's two signals
against the ratings. No rating is read before every choice is made.

Writes experiments/results/choice_sts.{json,md} (choice_sts-NAME... for other encoders).

    python experiments/choice_sts.py [--encoder DIR]... [--data DIR] [--tasks Lee STS-B SICK-R]

(the command that made the results file is written at its end).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from common import RESULTS, command_line, parser
from scipy.stats import spearmanr

from bertflow import POOLINGS, MethodSpec, lee, load_encoder, sts
from bertflow.embeddings.cache import EmbeddingCache
from bertflow.storage.files import write_json
from bertflow.training.choice import candidates, choose_head, fit_candidate
from bertflow.training.proxy import build_proxy
from bertflow.training.recipes import recommended

TASKS = ("Lee", "STS-B", "SICK-R")


def tasks(data: Any, names: list[str]) -> list[tuple[str, list[str], list[str], Callable]]:
    """Of `names`, (name, the sentences fit on, the sentences scored, score(vectors of the
    scored ones))."""
    found = []
    if "Lee" in names:
        found.append(("Lee", lee.background_sentences(), lee.rated_sentences(),
                      lambda x: lee.judgement_spearman(lee.document_vectors(x))))
    for name in (n for n in names if n != "Lee"):
        pairs = (sts.read_stsb_splits(data / "STSBenchmark") if name == "STS-B" else
                 {s: sts.read_sick(data / "SICK", s) for s in ("train", "trial", "test")})
        sentences = sts.sentences_of(pairs.values())
        found.append((name, sentences, sentences,
                      functools.partial(sts.pair_spearman, pairs["test"], sentences)))
    return found


def main() -> None:
    cli = parser(__doc__, "encoders", "data")
    cli.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    args = cli.parse_args()
    cache, results = EmbeddingCache(), []
    for folder in args.encoder or [None]:
        encoder = load_encoder(folder)
        max_length = encoder.defaults(POOLINGS[0])[1]
        embed = functools.partial(cache.encode, encoder=encoder, pooling=list(POOLINGS),
                                  max_length=max_length)
        for task, fit_on, scored, score in tasks(args.data, args.tasks):
            proxy = build_proxy("sts", (("", s) for s in fit_on), name=task)
            [(queries, items)] = proxy.groups.values()
            x_fit, x_scored, crops = embed(fit_on), embed(scored), {
                id(texts): embed(texts) for texts in (queries, items)}
            for pooling in POOLINGS:
                print(f"{encoder.id.name} {task} {pooling}", flush=True)
                x = np.asarray(x_fit[pooling])
                recipe = recommended(pooling, x).updated(train={"seed": 0})
                fit = functools.partial(fit_candidate, x=x, recipe=recipe, encoder=encoder.id,
                                        pooling=pooling, max_length=max_length)
                choice = choose_head(
                    candidates(x.shape[1]), fit, proxy,
                    lambda texts, p=pooling, c=crops: np.asarray(c[id(texts)][p]),
                    after=lambda head, fit=fit: fit(MethodSpec("flow"), before=head.linear))
                rows = [r for r in choice.rows if "not_fit" not in r]
                for row in rows:  # the ratings, read only now
                    head = choice.heads[row["candidate"]]
                    row["spearman"] = round(score(head.transform(np.asarray(
                        x_scored[pooling]))), 2)
                results.append({"encoder": encoder.id.name, "max_length": max_length,
                                "task": task, "pooling": pooling, "chosen": choice.label,
                                "reason": choice.reason(), "proxy": choice.proxy,
                                "candidates": choice.rows})
                print(f"  {choice.reason()}", flush=True)
    named = "".join(f"-{Path(folder).name}" for folder in args.encoder or [])
    command, out = command_line("choice_sts.py"), RESULTS / f"choice_sts{named}"
    write_json(out.with_suffix(".json"), {"command": command, "results": results})
    out.with_suffix(".md").write_text(report(results, command), encoding="utf-8")
    print(report(results, command))


def report(results: list[dict[str, Any]], command: str) -> str:
    lines = ["# The label-free choice for sentence similarity, scored afterwards", "",
             "Spearman × 100 against the ratings. *crops alone*: what the rule would choose "
             "without the neighbour agreement; *mean agreement*: with the agreement's mean "
             "difference ≥ 0 in place of its interval above 0. ρ: Spearman over the candidates "
             "of a proxy signal (crop nDCG@10, neighbour agreement) against the ratings.", "",
             "| encoder | task | pooling | identity | chosen | its score | crops alone | its "
             "score | mean agreement | its score | best candidate (ratings) | ρ crops | "
             "ρ agreement |",
             "|---|---|---|---:|---|---:|---|---:|---|---:|---|---:|---:|"]
    losses = []
    for r in results:
        rows = [c for c in r["candidates"] if "spearman" in c]
        by = {c["candidate"]: c for c in rows}
        base = rows[0]
        beaten = [c for c in rows[1:] if c["interval"][0] > 0]
        crops = max(beaten, key=lambda c: c["proxy_ndcg_at_10"]) if beaten else base
        kept = [c for c in beaten if c["agreement_difference"] >= 0]
        mean = max(kept, key=lambda c: c["proxy_ndcg_at_10"]) if kept else base
        best = max(rows, key=lambda c: c["spearman"])
        rho = [spearmanr([c[key] for c in rows], [c["spearman"] for c in rows])[0]
               for key in ("proxy_ndcg_at_10", "agreement")]
        chosen = by[r["chosen"]]
        losses.append(chosen["spearman"] - base["spearman"])
        lines.append(f"| {r['encoder']} | {r['task']} | {r['pooling']} | {base['spearman']:.1f} "
                     f"| {r['chosen']} | {chosen['spearman']:.1f} | {crops['candidate']} | "
                     f"{crops['spearman']:.1f} | {mean['candidate']} | {mean['spearman']:.1f} | "
                     f"{best['candidate']} {best['spearman']:.1f} | "
                     f"{rho[0]:+.2f} | {rho[1]:+.2f} |")
    lines += ["", f"Chosen against the identity: worst {min(losses):+.2f}, best "
              f"{max(losses):+.2f}, mean {np.mean(losses):+.2f} over {len(losses)} settings.",
              "", f"Every candidate's row, proxy and score: the .json beside this file. Made by "
              f"`{command}`."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
