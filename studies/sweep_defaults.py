#!/usr/bin/env python3
"""The sweep behind ``--algo grpo``'s defaults: does ``rapo-echo train --algo grpo --reward R`` with no
config learn a simple verifiable reward on the embedded model within about 12 steps?

Every run is the plain CLI's config (the algorithm's defaults, the reward, nothing else) with one
setting changed: full fine-tuning or LoRA and the learning rate. Per (setting, reward) and seed it
records the per-step mean reward and the gain = mean of the last 3 steps minus the first 3; one JSON
line per run, then one summary line per (setting, reward) with the mean gain over seeds.

    python studies/sweep_defaults.py --steps 12 --seeds 0 1 2 \\
        --settings full:1e-5 full:1e-4 lora:5e-4 lora:2e-3 --rewards question length:target=12 \\
        --out sweep.jsonl
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the checkout's root

from studies.bench_learning import read_jsonl, summarise, train_one

# Only what does not change the learning: no progress bar, no TensorBoard, no checkpoint but the last.
QUIET = ["logging.progress=false", "logging.tensorboard=false", "train.save_every=100000"]


def reward_spec(text: str) -> dict[str, Any]:
    """``name`` or ``name:key=value,key=value`` -> a reward spec (values parsed as YAML scalars)."""
    from rapo_echo.config.yaml_files import load_yaml_text

    name, _, rest = text.partition(":")
    args = {}
    for part in filter(None, rest.split(",")):
        k, _, v = part.partition("=")
        args[k] = load_yaml_text(v, f"--reward {name}: {k}")
    return {"name": name, "weight": 1.0, "args": args}


def setting_overrides(setting: str) -> list[str]:
    """``full:1e-5`` / ``lora:5e-4`` / ``full:auto`` -> the overrides that differ from the CLI's
    defaults; ``default``: none (the CLI exactly as a user runs it)."""
    if setting == "default":
        return []
    kind, _, lr = setting.partition(":")
    if kind not in ("full", "lora") or not lr:
        raise SystemExit(f"--settings: {setting!r} is not default, full:LR or lora:LR")
    return [f"model.lora.enabled={'true' if kind == 'lora' else 'false'}", f"train.lr={lr}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--settings", nargs="+", default=["full:1e-5", "lora:5e-4"])
    ap.add_argument("--rewards", nargs="+", default=["question"])
    ap.add_argument("--set", action="append", default=[], help="extra overrides for every run")
    ap.add_argument("--out", help="also append the JSON lines to this file")
    args = ap.parse_args()

    from rapo_echo.training.run_config import load_config

    def emit(record: dict[str, Any]) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(line + "\n")

    root = Path(tempfile.mkdtemp(prefix="rapo-sweep-"))
    for reward in args.rewards:
        for setting in args.settings:
            curves: dict[int, list[float]] = {}
            for seed in args.seeds:
                run = root / "run"
                shutil.rmtree(run, ignore_errors=True)
                overrides = [*QUIET, f"output={run}", f"train.max_steps={args.steps}", f"train.seed={seed}"]
                cfg = load_config(
                    algo="grpo",
                    flags={"rewards": [reward_spec(reward)]},
                    overrides=[*overrides, *setting_overrides(setting), *args.set],
                )
                wall = train_one(cfg)
                rows = read_jsonl(run / "metrics.jsonl")
                curves[seed] = [round(r["reward/mean"], 4) for r in rows]
                emit({"bench": "default_sweep_run", "reward": reward, "setting": setting, "seed": seed,
                      "reward_per_step": curves[seed], "wall_s": round(wall, 1)})  # fmt: skip
            emit({"bench": "default_sweep", "reward": reward, "setting": setting, "steps": args.steps,
                  "seeds": args.seeds, "set": args.set, **summarise(curves)})  # fmt: skip
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
