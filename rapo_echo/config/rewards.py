"""The ``rewards`` list: one spec per reward plugin, and the ``--reward NAME=WEIGHT`` flag."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rapo_echo.config.base import Strict
from rapo_echo.errors import ConfigError


class RewardSpec(Strict):
    """One reward: a registered name, an entry point, or ``module:attr``; weight; constructor args."""

    name: str = Field(
        description="A built-in reward, an entry point of `rapo_echo.rewards`, or `module:attr`."
    )
    weight: float = Field(
        1.0, description="Weight in the summed reward (0: logged only, e.g. a held-out judge)."
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the reward's constructor."
    )


def parse_reward_flag(text: str) -> dict[str, Any]:
    """``'length'``, ``'pkg.mod:fn=0.5'`` -> a reward spec mapping."""
    name, weight = text, 1.0
    if "=" in text:
        name, w = text.rsplit("=", 1)
        try:
            weight = float(w)
        except ValueError as exc:
            raise ConfigError(f"--reward {text!r}: weight {w!r} is not a number (use NAME=WEIGHT)") from exc
    if not name:
        raise ConfigError(f"--reward {text!r}: empty reward name")
    return {"name": name, "weight": weight}
