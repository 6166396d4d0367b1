"""Algorithms: the rollout shape and loss of each method, keyed by the name ``--algo`` takes.

Each algorithm class gives ``defaults()`` (a config overlay applied before the user's YAML) and is
built by the trainer with the run's context. Classes are imported on first use so that reading a
config stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_ALGORITHMS = {
    "grpo": "rapo_echo.algorithms.grpo:GRPO",
    "rapo": "rapo_echo.algorithms.rapo:RAPO",
    "rlver": "rapo_echo.algorithms.rlver:RLVER",
}


def names() -> list[str]:
    """The algorithm names ``--algo`` accepts."""
    return sorted(_ALGORITHMS)


def get(name: str) -> Any:
    """The algorithm class registered under ``name``."""
    if name not in _ALGORITHMS:
        raise KeyError(f"unknown algorithm {name!r}; allowed: {', '.join(names())}")
    module, attr = _ALGORITHMS[name].split(":")
    return getattr(importlib.import_module(module), attr)
