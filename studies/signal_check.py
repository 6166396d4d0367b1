"""Does each command, with no switches beyond sizes, give a trainable signal on the embedded model?

Runs the commands of issue 29's table (training: one step at the smallest sizes; evaluation: one case, two
turns) one after another and reads what each wrote: for training runs, the share of samples whose reward is
invalid (``None``), the share of groups whose valid rewards differ (a non-zero advantage spread) and the
optimizer updates; for evaluations, the valid and invalid case counts of ``summary.json``.

    python studies/signal_check.py --out build/signal.json [--only rlver-grpo,sage] [--timeout 1800]

Prints one JSON object per command and a Markdown table; ``--out`` keeps them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

SMALL_TRAIN = ["--max-steps", "1", "--set", "rollout.batch_size=2", "--set", "rollout.group_size=2"]
RLVER = ["--max-steps", "1", "--set", "rollout.batch_size=1", "--set", "rollout.group_size=2"]
RLVER += ["--set", "rlver.simulator.max_turns=2"]
ESCONV = "{shared}/data/esconv/ppdpp_esc-test.jsonl"  # the PPDPP test split in the shared data folder
SHARED = "../shared"
SMALL_EVAL = ["--policy", "default", "--limit", "1", "--max-turns", "2"]

COMMANDS: dict[str, list[str]] = {
    "rlver-grpo": ["train", "--algo", "rlver", *RLVER],
    "rlver-ppo": ["train", "--algo", "rlver", *RLVER, "--set", "rlver.estimator=ppo"],
    "grpo-humanlike": ["train", "--algo", "grpo", "--reward", "humanlike", *SMALL_TRAIN],
    "grpo-empathy": ["train", "--algo", "grpo", "--reward", "empathy", *SMALL_TRAIN],
    "grpo-echo_n1": ["train", "--algo", "grpo", "--reward", "echo_n1", "--set", "persona.enabled=true"]
    + SMALL_TRAIN,
    "rapo": ["train", "--algo", "rapo", *SMALL_TRAIN],
    "esconv": ["eval", "--benchmark", "esconv", *SMALL_EVAL, "--data", ESCONV],
    "sage": ["eval", "--benchmark", "sage", *SMALL_EVAL],
    "sotopia": ["eval", "--benchmark", "sotopia", *SMALL_EVAL],
    "epm": ["eval", "--benchmark", "epm", *SMALL_EVAL],
}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file ([] when it is missing); a torn last line is skipped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def train_signal(run: Path) -> dict[str, Any]:
    """Invalid share, groups with a reward spread and updates of a training run folder."""
    samples = read_jsonl(run / "samples.jsonl")
    groups: dict[tuple[Any, Any], list[float]] = defaultdict(list)
    invalid = 0
    for s in samples:
        value = _number(s.get("reward"))
        if value is None:
            invalid += 1
        key = (s.get("step"), s.get("group", s.get("scenario")))
        groups[key].append(math.nan if value is None else value)
    valid = [[v for v in g if not math.isnan(v)] for g in groups.values()]
    moving = [g for g in valid if len(g) >= 2 and max(g) - min(g) > 1e-9]
    metrics = read_jsonl(run / "metrics.jsonl")
    return {
        "samples": len(samples),
        "invalid_share": invalid / len(samples) if samples else None,
        "groups": len(groups),
        "groups_with_spread": len(moving),
        "spread_share": len(moving) / len(groups) if groups else None,
        "updates": sum(int(m.get("updates") or 0) for m in metrics),
        "reward_mean": [m.get("reward/mean") for m in metrics],
    }


def eval_signal(out: Path) -> dict[str, Any]:
    """The valid / invalid counts (and any top-level figure) of an evaluation's ``summary.json`` files."""
    found: dict[str, Any] = {}
    for path in sorted(out.rglob("summary.json")):
        data = json.loads(path.read_text())
        flat = {k: v for k, v in data.items() if isinstance(v, (int, float, str, type(None)))}
        found[str(path.relative_to(out))] = flat
    return found


def run_one(name: str, argv: list[str], root: Path, timeout: float) -> dict[str, Any]:
    """Run one command into ``root / name`` and read what it wrote."""
    out = root / name
    cmd = [sys.executable, "-m", "rapo_echo.cli", *argv, "--output", str(out)]
    cmd = [part.format(shared=SHARED) if "{shared}" in part else part for part in cmd]
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
        code, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as err:
        code, tail = "timeout", str(err)[-500:]
    result: dict[str, Any] = {"name": name, "command": "rapo-echo " + " ".join(argv), "exit": code}
    result["seconds"] = round(time.time() - start, 1)
    result.update(train_signal(out) if argv[0] == "train" else {"summaries": eval_signal(out)})
    warnings = [line for line in tail.splitlines() if "WARNING" in line or "weak" in line.lower()]
    result["warnings"] = warnings[-6:]
    if code != 0:
        result["tail"] = tail[-1500:]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--only", default="", help="comma-separated names of " + ",".join(COMMANDS))
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per command")
    parser.add_argument("--shared", default="../shared", help="the shared folder holding data/ (ESConv)")
    parser.add_argument("--keep", type=Path, help="keep the run folders here (default: a temporary folder)")
    args = parser.parse_args()
    global SHARED
    SHARED = str(Path(args.shared).resolve())
    names = [n for n in args.only.split(",") if n] or list(COMMANDS)
    unknown = sorted(set(names) - set(COMMANDS))
    if unknown:
        parser.error(f"unknown command name(s) {unknown}; known: {sorted(COMMANDS)}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for name in names:
            result = run_one(name, COMMANDS[name], root, args.timeout)
            print(json.dumps(result), flush=True)
            results.append(result)
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
