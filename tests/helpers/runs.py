"""Set-up shared by tests that train in the test process: a run's config and its metrics rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rapo_echo.training.run_config import load_config

QUIET = ("logging.progress=false", "logging.tensorboard=false")
# two prompts, two replies each, four tokens, a length reward: the cheapest step that trains
SMALL = (
    "rollout.batch_size=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=4",
    "rewards=[{name: length, args: {target: 3}}]",
)


def run_config(model: str | Path, out: Path, *sets: str, algo: str | None = None) -> Any:
    """``load_config`` of a run of ``model`` into ``out``, quiet (no progress display, no TensorBoard)."""
    return load_config(algo=algo, overrides=[f"model.name={model}", f"output={out}", *QUIET, *sets])


def metrics(run: Path) -> list[dict[str, Any]]:
    """The rows of ``run``'s metrics.jsonl."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def set_flags(*sets: str) -> list[str]:
    """``sets`` as command-line ``--set`` flags."""
    return [flag for s in sets for flag in ("--set", s)]
