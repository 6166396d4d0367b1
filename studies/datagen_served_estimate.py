#!/usr/bin/env python3
"""Requests and time of Echo-N1's data chain (``rapo-echo data ...``) with served 7B-70B roles, by the
wave model of docs/algorithms/echo_n1.md: a stage of M requests costs ceil(M / cap) rounds of its role's
latency (all of a chunk's stage in flight at once when cap >= M), stages and chunks run one after another.
The throughput bound adds: a stage cannot finish before its output tokens / the server's output rate.

Every size, pass rate, latency and rate below is an assumption, printed with the result; nothing here is
measured. One request per prompt (the ``openai`` engine); a log-prob verdict is one request (a label read),
a grade with its critique two (the critique line, then the label read); ``n`` samples ride on one request.

    python studies/datagen_served_estimate.py [--cap 8] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import json
import math

# role -> (latency of one request in s, output tokens per s of one server replica); assumptions
ROLES = {"judge70b": (5.0, 2500.0), "writer7b": (2.0, 10000.0)}


def stages(z: dict) -> dict[str, list[tuple[str, str, float, int, int]]]:
    """Per command: (stage, role, requests per context, dependent rounds, output tokens per request)."""
    live = z["select_pass"] * z["safety_pass"]
    cands = live * (z["cr_candidates"] + 1)  # the sampled ones + the ESConv supporter turn

    def grade(tag: str, per_context: float) -> list[tuple[str, str, float, int, int]]:
        return [
            (f"critique{tag}", "judge70b", per_context, 1, 96),
            (f"score{tag}", "judge70b", per_context, 1, 1),
        ]

    cr = [
        ("select", "judge70b", 1.0, 1, 1),
        ("safety", "judge70b", z["select_pass"], 1, 1),
        ("candidates", "writer7b", live, 1, 96 * z["cr_candidates"]),
        *grade("", cands),
    ]
    for i, share in ((1, z["rewrite1"]), (2, z["rewrite2"])):
        cr += [(f"rewrite {i}", "judge70b", cands * share, 1, 96), *grade(f" {i}", cands * share)]
    k, open2 = z["ref_candidates"], z["ref_open_after_1"]
    refs = [
        ("candidates 1", "writer7b", 1.0, 1, 96 * k),
        *grade(" 1", k + 1.0),
        ("candidates 2", "writer7b", open2, 1, 96 * k),
        *grade(" 2", k * open2),
    ]
    n = z["best_of_n"]
    hard = [
        ("samples", "writer7b", 1.0, 1, 96 * n),
        ("needs", "judge70b", 3.0, 1, 40),
        ("compare", "judge70b", 2.0 * n, 1, 1),
    ]
    lengths = z["sft_stages"]
    mean = sum(lengths) / len(lengths)
    rounds, decisions = max(lengths), max(lengths) // 5
    mean_decisions = sum(x // 5 for x in lengths) / len(lengths)
    syn = [
        ("profile", "judge70b", 1.0, 1, 200),
        ("companion", "writer7b", mean, rounds, 96),
        ("user", "judge70b", mean, rounds, 64),
        ("director", "judge70b", mean_decisions, decisions, 1),
        ("topic", "judge70b", mean_decisions * z["switch_share"], decisions, 40),
    ]
    return {"critique-rewrite": cr, "references": refs, "hard-prompts": hard, "synthesize": syn}


def estimate(rows: list[tuple[str, str, float, int, int]], contexts: int, cap: int, batch: int) -> dict:
    """Requests, dependent rounds, the floor (every stage of the whole run in flight at once: rounds x
    latency), the throughput bound (each stage at least its tokens / the server's rate) and the time with
    ``batch`` contexts per chunk at ``cap`` requests in flight."""
    chunks = [batch] * (contexts // batch) + ([contexts % batch] if contexts % batch else [])
    out = {"requests": 0.0, "floor_rounds": 0, "floor_s": 0.0, "throughput_bound_s": 0.0, "chunked_s": 0.0}
    for _stage, role, per_context, rounds, tokens in rows:
        latency, rate = ROLES[role]
        out["requests"] += per_context * contexts
        out["floor_rounds"] += rounds
        out["floor_s"] += rounds * latency
        out["throughput_bound_s"] += max(rounds * latency, per_context * contexts * tokens / rate)
        for size in chunks:
            per_round = per_context * size / rounds
            out["chunked_s"] += rounds * math.ceil(per_round / cap) * latency
    return {k: round(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cap", type=int, default=8, help="requests in flight per engine (openai default 8)")
    ap.add_argument("--batch-size", type=int, default=16, help="contexts per chunk (the commands' default)")
    args = ap.parse_args()
    sizes = {
        "contexts": {"critique-rewrite": 2000, "references": 5000, "hard-prompts": 4000, "synthesize": 3000},
        "select_pass": 0.7,
        "safety_pass": 0.9,
        "cr_candidates": 2,
        "rewrite1": 0.6,
        "rewrite2": 0.3,
        "ref_candidates": 4,
        "ref_open_after_1": 0.4,
        "best_of_n": 4,
        "sft_stages": [6, 10, 16],
        "switch_share": 0.5,
    }
    out = {"assumptions": {"sizes": sizes, "roles (latency s, output tokens/s)": ROLES}}
    for command, rows in stages(sizes).items():
        out[command] = estimate(rows, sizes["contexts"][command], args.cap, args.batch_size)
    out["chunked_s"] = f"--batch-size {args.batch_size}, {args.cap} requests in flight per engine"
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
