#!/usr/bin/env python3
"""How RAPO's group judge turns label probabilities into ranks (``rapo.judge.ties``), measured on real
groups judged by the embedded model. Prints one JSON object (and writes it with ``--out``);
docs/algorithms/rapo.md quotes it.

Groups: the bundled English scenarios, ``--group-size`` replies each sampled by the embedded model
(temperature 1), each seen through the reaction simulator (the embedded model too), as in a RAPO step.
They are cached in ``--groups`` so the judge phase can be rerun on the same groups.

Every rule ranks each group from two complementary presentations: the P(best) rules and ``sequential``
from a shuffled order and its reverse (what ``reverse_pass`` averages), ``pairwise`` from the pairs shown
one way and the other way round. Per rule:

* ``distinct_ranks``: mean number of distinct rank values per group (from one presentation);
* ``max_tie_span``: the largest P(best) gap inside one tie block;
* ``split_tau_b``: Kendall tau-b between the ranks of the two presentations (does the order survive a
  change of presentation, or is it noise?);
* ``emotion_tau_b``: Kendall tau-b between the ranks (best = high) and the simulator's emotion change of
  each reply, an outside signal of which reply helped;
* ``vs_pairwise_tau_b``: Kendall tau-b with the full pairwise ranking (both orders);
* ``prompts_per_group``, ``calls``, ``seconds``: the judge's cost.

    python studies/judge_ties.py [--scenarios 16] [--group-size 8] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b of two score vectors (ties allowed); None when either is constant."""
    concordant = discordant = ties_x = ties_y = 0
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return None if denom == 0 else (concordant - discordant) / denom


def max_tie_span(ranks: Sequence[float], scores: Sequence[float]) -> float:
    """The largest score gap between two members of one tie block."""
    blocks: dict[float, list[float]] = {}
    for r, s in zip(ranks, scores):
        blocks.setdefault(r, []).append(s)
    return max((max(b) - min(b) for b in blocks.values()), default=0.0)


def mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(statistics.fmean(kept), 4) if kept else None


def build_groups(engine: Any, scenarios: list, size: int, seed: int) -> list[dict]:
    """Sample ``size`` replies per scenario and the simulated person's reaction to each."""
    from rapo_echo.config import DEFAULT_SYSTEM_PROMPT
    from rapo_echo.prompting import policy_conversation
    from rapo_echo.simulators.reaction import ReactionSimulator
    from rapo_echo.types import SamplingParams

    params = SamplingParams(max_new_tokens=48, temperature=1.0, n=size, seed=seed)
    convs = [policy_conversation(s, DEFAULT_SYSTEM_PROMPT) for s in scenarios]
    replies = [[g.text.strip() for g in gens] for gens in engine.generate(convs, params)]
    sim = ReactionSimulator(engine, max_new_tokens=48, thought_tokens=24)
    reactions = sim.react([(s, r) for s, rs in zip(scenarios, replies) for r in rs])
    out, k = [], 0
    for s, rs in zip(scenarios, replies):
        out.append(
            {"scenario": s.id, "replies": rs, "reactions": [asdict(r) for r in reactions[k : k + size]]}
        )
        k += size
    return out


def judge_all(
    engine: Any, rules: Sequence[str], scenarios: list, groups: list, seed: int, eps: float
) -> dict:
    """Every rule's ranks from two complementary presentations of each group, with the fewest engine
    calls: the P(best) rules share one call (both presentations), ``sequential`` runs its rounds for both
    presentations together, ``pairwise`` asks every ordered pair once (the halves are its two orders)."""
    from rapo_echo.judges.group import GroupJudge, pairwise_scores, ranks_from_p_best
    from rapo_echo.llm.ranks import average_ranks

    rng = random.Random(seed)
    orders = [rng.sample(range(len(g)), len(g)) for g in groups]  # the same shuffles for every rule
    both = [(k, o) for k, o in enumerate(orders)] + [(k, o[::-1]) for k, o in enumerate(orders)]
    n = len(groups)
    judge = GroupJudge(engine, use_logprobs="always", tie_eps=eps)
    out: dict[str, dict] = {}

    def in_caller_order(order: Sequence[int], shown: Sequence[float]) -> list[float]:
        values = [0.0] * len(order)
        for pos, i in enumerate(order):
            values[i] = shown[pos]
        return values

    p_rules = [r for r in rules if r in ("chained", "leader", "none")]
    if p_rules:
        t0 = time.perf_counter()
        shown = judge._best_probs(scenarios, groups, both)
        if any(p is None for p in shown):
            raise SystemExit("the judge gave unusable label probabilities (NaN or no label); cannot compare")
        seconds = (time.perf_counter() - t0) / 2
        p_best = [in_caller_order(o, p) for (_, o), p in zip(both, shown)]
        for rule in p_rules:
            halves = [[ranks_from_p_best(p, rule, eps) for p in p_best[h * n : (h + 1) * n]] for h in (0, 1)]
            out[rule] = {
                "ranks": halves[0],
                "scores": p_best[:n],
                "halves": halves,
                "seconds": seconds,
                "calls": 1,
            }
    if "sequential" in rules:
        seq = GroupJudge(engine, use_logprobs="always", ties="sequential")
        t0 = time.perf_counter()
        ranks, scores = seq._sequential(scenarios, groups, both)
        seconds = (time.perf_counter() - t0) / 2
        halves = [[ranks[k][h] for k in range(n)] for h in (0, 1)]
        out["sequential"] = {
            "ranks": halves[0],
            "scores": [scores[k][0] for k in range(n)],
            "halves": halves,
            "seconds": seconds,
            "calls": seq.stats["rank_calls"],
        }
    if "pairwise" in rules:
        jobs = [
            (k, [i, j]) for k, g in enumerate(groups) for i in range(len(g)) for j in range(len(g)) if i != j
        ]
        t0 = time.perf_counter()
        probs = judge._best_probs(scenarios, groups, jobs)
        if any(p is None for p in probs):
            raise SystemExit("the judge gave unusable label probabilities (NaN or no label); cannot compare")
        seconds = time.perf_counter() - t0
        shown_by = [
            [(i, j, pi, pj) for (kk, (i, j)), (pi, pj) in zip(jobs, probs) if kk == k] for k in range(n)
        ]
        full = [pairwise_scores(len(g), shown_by[k]) for k, g in enumerate(groups)]
        halves = [
            [
                average_ranks(pairwise_scores(len(g), [t for t in shown_by[k] if (t[0] < t[1]) == first]))
                for k, g in enumerate(groups)
            ]
            for first in (True, False)
        ]
        out["pairwise"] = {
            "ranks": [average_ranks(f) for f in full],
            "scores": full,
            "halves": halves,
            "seconds": seconds,
            "calls": 1,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tie-eps", type=float, default=0.02)
    ap.add_argument("--rules", default="chained,leader,none,sequential,pairwise")
    ap.add_argument("--groups", default="runs/judge_ties_groups.json", help="cache of the sampled groups")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy machine)")
    args = ap.parse_args()

    import torch

    from rapo_echo.data import load_scenarios
    from rapo_echo.engines.hf import HFEngine
    from rapo_echo.judges.group import Candidate
    from rapo_echo.llm.reaction import Reaction
    from rapo_echo.models import resolve

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    engine = HFEngine.from_spec(resolve("default").path, device="cpu")
    scenarios = load_scenarios(None)[: args.scenarios]
    cache = Path(args.groups)
    t0 = time.perf_counter()
    if cache.exists():
        raw = json.loads(cache.read_text())
    else:
        raw = build_groups(engine, scenarios, args.group_size, args.seed)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(raw, indent=1))
    build_s = time.perf_counter() - t0
    by_id = {s.id: s for s in scenarios}
    scenarios = [by_id[g["scenario"]] for g in raw]
    reactions = [[Reaction(**r) for r in g["reactions"]] for g in raw]
    groups = [
        [Candidate(t, r if r.valid else None) for t, r in zip(g["replies"], rs)]
        for g, rs in zip(raw, reactions)
    ]
    deltas = [[r.emotion_delta if r.valid else None for r in rs] for rs in reactions]

    results = judge_all(engine, args.rules.split(","), scenarios, groups, args.seed, args.tie_eps)
    reference = results.get("pairwise")
    table = {}
    for rule, res in results.items():
        rows = []
        for k, ranks in enumerate(res["ranks"]):
            best_high = [-r for r in ranks]
            kept = [i for i, d in enumerate(deltas[k]) if d is not None]
            rows.append(
                {
                    "distinct": len(set(ranks)),
                    "span": max_tie_span(ranks, res["scores"][k])
                    if rule in ("chained", "leader", "none")
                    else None,
                    "split": kendall_tau_b(res["halves"][0][k], res["halves"][1][k]),
                    "emotion": kendall_tau_b([best_high[i] for i in kept], [deltas[k][i] for i in kept]),
                    "pairwise": None if reference is None else kendall_tau_b(ranks, reference["ranks"][k]),
                }
            )
        size = args.group_size
        table[rule] = {
            "distinct_ranks": mean([r["distinct"] for r in rows]),
            "groups_all_distinct": sum(r["distinct"] == size for r in rows),
            "max_tie_span": None if rows[0]["span"] is None else round(max(r["span"] for r in rows), 4),
            "split_tau_b": mean([r["split"] for r in rows]),
            "emotion_tau_b": mean([r["emotion"] for r in rows]),
            "vs_pairwise_tau_b": mean([r["pairwise"] for r in rows]),
            "prompts_per_group": {"sequential": size - 1, "pairwise": size * (size - 1)}.get(rule, 1),
            "calls": res["calls"],
            "seconds_per_presentation": round(res["seconds"], 1),
        }
    p_best = [s for s in results.get("none", results[next(iter(results))])["scores"]]
    out = {
        "bench": "judge_ties",
        "model": "SmolLM2-135M-Instruct (policy, simulator and judge)",
        "groups": len(groups),
        "group_size": args.group_size,
        "tie_eps": args.tie_eps,
        "seed": args.seed,
        "invalid_reactions": sum(d is None for ds in deltas for d in ds),
        "mean_max_p_best": mean([max(s) for s in p_best]),
        "build_seconds": round(build_s, 1),
        "rules": table,
    }
    text = json.dumps(out)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
