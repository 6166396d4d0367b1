#!/usr/bin/env python3
"""How long the fidelity benchmark's summary (figures and bootstrap intervals) takes on a large file:
synthetic rated points shaped like the issue-39 run (5,880 conversations, about 5 points each, four
predictors), seeded. Prints one JSON line (and appends it to ``--output``).

Only :func:`~rapo_echo.benchmarks.fidelity.bench.summarize_points` is called, an API older than this
script, so ``PYTHONPATH=<old tree>`` measures an older checkout the same way.

    python perf/bench_fidelity_summary.py [--dialogues 5880] [--n-boot 1000] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

PREDICTORS = ("user:reaction", "random", "length", "questions")


def records(dialogues: int, seed: int = 0) -> list[dict[str, Any]]:
    """Point records as the benchmark writes them: per conversation 3-7 rated points, a survey, and a
    prediction per predictor loosely tied to the rating."""
    rng = random.Random(seed)
    out = []
    for d in range(dialogues):
        survey = {
            "initial_emotion_intensity": rng.randint(1, 5),
            "final_emotion_intensity": rng.randint(1, 5),
        }
        for p in range(rng.randint(3, 7)):
            rating = rng.randint(1, 5)
            predictions = {
                name: {
                    "kind": "user" if name.startswith("user") else "baseline",
                    "value": rating + rng.gauss(0, 2),
                }
                for name in PREDICTORS
            }
            out.append(
                {
                    "id": f"d{d}-r{p}",
                    "valid": True,
                    "metrics": {"rating": rating},
                    "info": {"dialogue": f"d{d}", "survey": survey, "predictions": predictions},
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dialogues", type=int, default=5880)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--label", default="")
    ap.add_argument("--output")
    args = ap.parse_args()
    from rapo_echo.benchmarks.fidelity.bench import summarize_points

    rows = records(args.dialogues)
    start = time.perf_counter()
    summary = summarize_points(rows, n_boot=args.n_boot, seed=0)
    seconds = time.perf_counter() - start
    line = {
        "bench": "fidelity_summary",
        "label": args.label,
        "dialogues": args.dialogues,
        "points": len(rows),
        "predictors": len(PREDICTORS),
        "n_boot": args.n_boot,
        "seconds": round(seconds, 2),
        "seconds_per_resample": round(seconds / max(args.n_boot, 1), 4),
        "pairwise_ci": [summary.get("user:reaction/pairwise_lo"), summary.get("user:reaction/pairwise_hi")],
        "spearman_ci": [summary.get("user:reaction/spearman_lo"), summary.get("user:reaction/spearman_hi")],
    }
    print(json.dumps(line))
    if args.output:
        with Path(args.output).open("a") as fh:
            fh.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
