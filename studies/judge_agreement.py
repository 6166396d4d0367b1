#!/usr/bin/env python3
"""Can a judge rank replies from the hidden-preference user's reactions? Pairwise agreement with the
hidden rule.

The policy (default: the embedded model) samples ``--group-size`` replies to each bundled scenario; the
hidden-preference user reacts to each; the judge (``--judge``: a model spec for RAPO's LLM group judge,
or ``reactions`` for the judge without a model) ranks every group from the replies and reactions. Over
the pairs of a group whose hidden-rule scores differ, agreement is the fraction the judge orders the
same way (a tie counts half); 0.5 is chance, 1.0 is the rule itself. One JSON line.

    python studies/judge_agreement.py --judge default --group-size 4 --max-new-tokens 24
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="default")
    ap.add_argument("--judge", default="default", help="a model spec, or 'reactions'")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--limit", type=int, default=None, help="at most this many scenarios")
    ap.add_argument("--reverse-pass", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from rapo_echo.config import DEFAULT_SYSTEM_PROMPT, SelectionConfig
    from rapo_echo.data import load_scenarios
    from rapo_echo.engines.hf import HFEngine
    from rapo_echo.judges.group import Candidate, GroupJudge
    from rapo_echo.judges.reactions import ReactionJudge
    from rapo_echo.models import resolve
    from rapo_echo.prompting import policy_conversation
    from rapo_echo.simulators.hidden_preference import HiddenPreferenceUser
    from rapo_echo.types import SamplingParams

    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    scenarios = load_scenarios(None, "auto", SelectionConfig(), args.limit)
    policy = HFEngine.from_spec(resolve(args.policy).path, device="cpu")
    convs = [policy_conversation(s, DEFAULT_SYSTEM_PROMPT) for s in scenarios]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, n=args.group_size)
    groups = [[g.text for g in gs] for gs in policy.generate(convs, params)]
    user = HiddenPreferenceUser()
    candidates = [[Candidate(r, user.react_one(s, r)) for r in g] for s, g in zip(scenarios, groups)]
    if args.judge == "reactions":
        judge = ReactionJudge()
    else:
        engine = (
            policy
            if args.judge == args.policy
            else HFEngine.from_spec(resolve(args.judge).path, device="cpu")
        )
        judge = GroupJudge(engine, reverse_pass=args.reverse_pass, rng=random.Random(args.seed))
    judged = judge.rank(scenarios, candidates, with_critiques=False)
    agree = pairs = 0.0
    top_hits = top_groups = 0
    for scenario, group, j in zip(scenarios, groups, judged):
        if j.ranks is None:
            continue
        hidden = [user.hidden_rule_score(r, scenario.last_user_message()) for r in group]
        for a, b in itertools.combinations(range(len(group)), 2):
            if hidden[a] == hidden[b]:
                continue
            pairs += 1
            truth = hidden[a] > hidden[b]
            if j.ranks[a] == j.ranks[b]:
                agree += 0.5
            elif (j.ranks[a] < j.ranks[b]) == truth:
                agree += 1
        if len(set(hidden)) > 1:
            top_groups += 1
            best = min(range(len(group)), key=lambda i: j.ranks[i])
            top_hits += hidden[best] == max(hidden)
    print(
        json.dumps(
            {
                "bench": "judge_agreement_with_hidden_rule",
                "judge": args.judge,
                "policy": args.policy,
                "groups": len(groups),
                "invalid_groups": sum(not j.valid for j in judged),
                "pairs_with_different_scores": int(pairs),
                "pairwise_agreement": round(agree / pairs, 4) if pairs else None,
                "top1_is_best": round(top_hits / top_groups, 4) if top_groups else None,
                "groups_with_a_best": top_groups,
                "config": vars(args),
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
