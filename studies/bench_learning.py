#!/usr/bin/env python3
"""Proofs that training learns, at length, on the embedded model (LoRA). Prints one JSON line.

``--algo grpo`` (default): GRPO with the verifiable reward "the reply asks the person a question"
over the bundled English scenarios; the per-step mean reward.

``--algo rapo``: the hidden-preference user (``simulators/hidden_preference.py``) reacts to every
reply by a rule the policy never sees, and a judge ranks each group from those reactions
(``rapo.judge.kind: reactions`` by default, or ``--judge model``: the embedded model itself). Three
arms, each over several seeds, all with the same sampling, LoRA, learning rate and loss (group-normalised
advantages, no KL); what differs is the learning signal:

* ``rapo``: RAPO with self-distillation of the critique-guided rewrites (``rapo.sd.rewrite_prompt: system``,
  ``verify: true``: only a rewrite that beats its original is distilled, at most one per group,
  ``coef: 0.1``);
* ``ranks``: the same with ``rapo.sd.enabled: false`` (GRPO on the judge's rank rewards);
* ``emotion``: GRPO on the simulated emotion change as a scalar reward (``emotion_change``).

The score is the hidden-rule score (in [0, 1]) of the policy's sampled replies, per step.

    python studies/bench_learning.py [--steps 20] [--out FILE]
    python studies/bench_learning.py --algo rapo --steps 12 --seeds 0 1 2 \\
        --runs runs/learning --plot learning.png --out learning.jsonl
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rapo_echo.training.run_config import RunConfig

ARMS = ("rapo", "ranks", "emotion")
LEARNING_FILE = "learning.json"  # the result inside a --runs folder (the report draws it)
COMMON = [
    "model.lora.enabled=true",
    "loss.beta=0",
    "logging.progress=false",
    "logging.tensorboard=false",
    "train.save_every=100000",
]


def learning_config(run: Path, steps: int, seed: int = 0) -> RunConfig:
    """The GRPO learning proof's run: GRPO, LoRA, the ``question`` reward, 4 scenarios x 4 replies of at
    most 24 tokens, lr 2e-3, no KL; the test suite runs the same with fewer steps."""
    from rapo_echo.training.run_config import load_config

    return load_config(
        algo="grpo",
        overrides=[
            *COMMON,
            f"output={run}",
            "rewards=[{name: question}]",
            "train.lr=2e-3",
            "rollout.batch_size=4",
            "rollout.group_size=4",
            "rollout.max_new_tokens=24",
            f"train.max_steps={steps}",
            f"train.seed={seed}",
        ],
    )


# What every RAPO-benchmark arm shares (the sizes the test suite's short version uses too).
RAPO_SIZES = {
    "train.lr": "1e-3",
    "rollout.batch_size": "4",
    "rollout.group_size": "4",
    "rollout.max_new_tokens": "24",
    "loss.advantage": "grpo",
}


# RAPO's self-distillation in the benchmark: the rewrite request in the system message (the embedded
# model answers a follow-up request with text about the reply instead of a reply), and only rewrites
# that beat their original after re-simulation and re-ranking are distilled.
RAPO_SD = [
    "rapo.sd.rewrite_prompt=system",
    "rapo.sd.verify=true",
    "rapo.sd.max_per_group=1",
    "rapo.sd.coef=0.1",
]


def rapo_learning_config(
    run: Path,
    arm: str,
    steps: int,
    seed: int = 0,
    *,
    judge: str = "reactions",
    sizes: dict[str, str] | None = None,
    extra: Sequence[str] = (),
) -> RunConfig:
    """One arm of the RAPO learning benchmark (see the module doc) as a run config."""
    from rapo_echo.training.run_config import load_config

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; allowed: {', '.join(ARMS)}")
    sized = {**RAPO_SIZES, **(sizes or {})}
    overrides = [*COMMON, f"output={run}", f"train.max_steps={steps}", f"train.seed={seed}"]
    overrides += [f"{k}={v}" for k, v in sized.items()]
    if arm == "emotion":
        algo = "grpo"
        overrides.append("rewards=[{name: emotion_change, args: {simulator: hidden_preference}}]")
    else:
        algo = "rapo"
        overrides += [
            "rapo.simulator.name=hidden_preference",
            "rapo.judge.kind=" + ("reactions" if judge == "reactions" else "model"),
            f"rapo.sd.enabled={'true' if arm == 'rapo' else 'false'}",
            *RAPO_SD,
        ]
    return load_config(algo=algo, overrides=[*overrides, *extra])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def hidden_scores_per_step(run: Path, scorer: Any) -> list[float]:
    """Mean hidden-rule score of the policy's sampled replies at each step (from ``samples.jsonl``)."""
    from rapo_echo.types import last_user_message

    by_step: dict[int, list[float]] = {}
    for rec in read_jsonl(run / "samples.jsonl"):
        heard = last_user_message(rec.get("prompt") or [])
        by_step.setdefault(int(rec["step"]), []).append(scorer.hidden_rule_score(rec["reply"], heard))
    return [round(statistics.fmean(by_step[s]), 4) for s in sorted(by_step)]


def metric_per_step(rows: Sequence[dict[str, Any]], key: str) -> list[float | None]:
    return [None if r.get(key) is None else round(float(r[key]), 4) for r in rows]


def train_one(cfg: RunConfig) -> float:
    """Train one run in this process; returns its wall seconds."""
    from rapo_echo.training.run import Run

    t0 = time.perf_counter()
    trainer = Run(cfg)
    trainer.train()
    del trainer
    gc.collect()
    return time.perf_counter() - t0


def _mean(xs: Sequence[float]) -> float:
    return round(statistics.fmean(xs), 4)


def summarise(per_seed: dict[int, list[float]], window: int = 3) -> dict[str, Any]:
    """Per-step mean over seeds, and the gain: mean of the last ``window`` steps minus the first
    ``window`` (per seed, then averaged; also the per-seed gains)."""
    seeds = sorted(per_seed)
    n = min(len(per_seed[s]) for s in seeds)
    mean_curve = [_mean([per_seed[s][i] for s in seeds]) for i in range(n)]
    w = min(window, max(1, n // 2))
    gains = {s: _mean(per_seed[s][n - w : n]) - _mean(per_seed[s][:w]) for s in seeds}
    return {
        "mean_per_step": mean_curve,
        "first_window": _mean(mean_curve[:w]),
        "last_window": _mean(mean_curve[n - w :]),
        "gain": _mean(list(gains.values())),
        "gain_per_seed": {str(s): round(g, 4) for s, g in gains.items()},
        "window": w,
    }


def run_rapo(args: argparse.Namespace) -> dict[str, Any]:
    from rapo_echo.simulators.hidden_preference import HiddenPreferenceUser

    scorer = HiddenPreferenceUser()
    root = Path(args.runs) if args.runs else Path(tempfile.mkdtemp(prefix="rapo-learn-"))
    root.mkdir(parents=True, exist_ok=True)
    arms: dict[str, Any] = {}
    t_all = time.perf_counter()
    for arm in args.arms:
        scores: dict[int, list[float]] = {}
        emotion: dict[str, list[float | None]] = {}
        beat: dict[str, list[float | None]] = {}
        walls = {}
        for seed in args.seeds:
            run = root / f"{arm}-seed{seed}"
            if run.exists():
                shutil.rmtree(run)
            cfg = rapo_learning_config(run, arm, args.steps, seed, judge=args.judge, extra=args.set)
            walls[str(seed)] = round(train_one(cfg), 1)
            rows = read_jsonl(run / "metrics.jsonl")
            scores[seed] = hidden_scores_per_step(run, scorer)
            emotion[str(seed)] = metric_per_step(rows, "sim/emotion_delta")
            beat[str(seed)] = metric_per_step(rows, "sd/beat_original")
            for heavy in ("checkpoints", "final"):  # keep metrics, samples and config for the report
                shutil.rmtree(run / heavy, ignore_errors=True)
            print(
                json.dumps(
                    {"arm": arm, "seed": seed, "score_per_step": scores[seed], "wall_s": walls[str(seed)]}
                ),
                flush=True,
            )
        arms[arm] = {
            "score_per_step": {str(s): v for s, v in scores.items()},
            **summarise(scores),
            "wall_s": walls,
        }
        if any(v is not None for vs in emotion.values() for v in vs):
            arms[arm]["emotion_delta_per_step"] = emotion
        if any(v is not None for vs in beat.values() for v in vs):
            arms[arm]["rewrite_beat_original_per_step"] = beat
    result = {
        "bench": "rapo_learns_hidden_preference",
        "model": "SmolLM2-135M-Instruct (embedded), LoRA r=16",
        "judge": args.judge,
        "steps": args.steps,
        "seeds": list(args.seeds),
        "samples_per_step": 16,
        "sizes": RAPO_SIZES,
        "set": list(args.set),
        "arms": arms,
        "wall_s": round(time.perf_counter() - t_all, 1),
    }
    (root / LEARNING_FILE).write_text(json.dumps(result, indent=1))
    if args.plot:
        from rapo_echo.benchmarks.learning_report import learning_figure

        Path(args.plot).write_bytes(learning_figure(result))
    return result


def run_grpo(args: argparse.Namespace) -> dict[str, Any]:
    run = Path(tempfile.mkdtemp(prefix="rapo-learn-")) / "run"
    cfg = learning_config(run, args.steps, args.seeds[0])
    wall = train_one(cfg)
    rows = read_jsonl(run / "metrics.jsonl")
    rewards = [round(r["reward/mean"], 4) for r in rows]
    return {
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", choices=("grpo", "rapo"), default="grpo")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="rapo: several seeds; grpo: the first")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument("--judge", choices=("reactions", "model"), default="reactions")
    ap.add_argument("--set", action="append", default=[], help="extra key=value overrides for every arm")
    ap.add_argument("--runs", help="rapo: keep the run folders (and learning.json) here")
    ap.add_argument("--plot", help="rapo: write the learning curves (PNG) here")
    ap.add_argument("--out", help="also append the JSON line to this file")
    args = ap.parse_args()

    result = run_rapo(args) if args.algo == "rapo" else run_grpo(args)
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(line + "\n")


if __name__ == "__main__":
    main()
