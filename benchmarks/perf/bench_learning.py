#!/usr/bin/env python3
"""Proof that GRPO learns, at length: the embedded model (LoRA) trained with the verifiable reward
"the reply asks the person a question" over the bundled English scenarios. Prints one JSON line with
the per-step mean reward; the README quotes its figure.

    python benchmarks/perf/bench_learning.py [--steps 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rapo_echo.config import RunConfig


def learning_config(run: Path, steps: int, seed: int = 0) -> RunConfig:
    """The learning proof's run: GRPO, LoRA, the ``question`` reward, 4 scenarios x 4 replies of at
    most 24 tokens, lr 2e-3, no KL; the test suite runs the same with fewer steps."""
    from rapo_echo.config import load_config

    return load_config(
        algo="grpo",
        overrides=[
            f"output={run}",
            "rewards=[{name: question}]",
            "model.lora.enabled=true",
            "train.lr=2e-3",
            "loss.beta=0",
            "rollout.batch_size=4",
            "rollout.group_size=4",
            "rollout.max_new_tokens=24",
            f"train.max_steps={steps}",
            f"train.seed={seed}",
            "train.save_every=100000",
            "logging.progress=false",
            "logging.tensorboard=false",
        ],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also append the JSON line to this file")
    args = ap.parse_args()

    from rapo_echo.trainer import Trainer

    run = Path(tempfile.mkdtemp(prefix="rapo-learn-")) / "run"
    cfg = learning_config(run, args.steps, args.seed)
    t0 = time.perf_counter()
    Trainer(cfg).train()
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rewards = [round(r["reward/mean"], 4) for r in rows]
    result = {
        "bench": "grpo_learns_question_reward",
        "model": "SmolLM2-135M-Instruct (embedded), LoRA r=16",
        "steps": args.steps,
        "samples_per_step": 16,
        "reward_per_step": rewards,
        "first_step": rewards[0],
        "mean_last_5": round(statistics.fmean(rewards[-5:]), 4),
        "wall_s": round(wall, 1),
        "sec_per_step_median": round(statistics.median(r["time/step"] for r in rows), 2),
    }
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(line + "\n")


if __name__ == "__main__":
    main()
