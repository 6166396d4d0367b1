"""The ``fidelity`` section of a run config: how well the run's simulator and judge agree with real ESConv
seekers' own ratings (``eval --benchmark fidelity``), checked once before training, cached by the roles'
specs and recorded as the run's ``fidelity.json``.
"""

from __future__ import annotations

from pydantic import Field

from rapo_echo.config.base import Strict


class FidelityCheckConfig(Strict):
    """A fidelity check (see the module doc); the engines are the run's ``simulator`` and ``judge``."""

    data: str = Field(description="Raw ESConv.json or FailedESConv.json (files with in-dialogue ratings).")
    users: list[str] = Field(
        default_factory=lambda: ["reaction"], description="Simulated users run on the run's simulator."
    )
    rewards: list[str] = Field(
        default_factory=list, description="Reward plugins scored (judge rewards use the run's judge)."
    )
    limit: int = Field(20, ge=1, description="Conversations checked (all their rated points).")
    max_new_tokens: int = Field(48, ge=1, description="Tokens of the simulated users' next messages.")
    seed: int = Field(0, description="Seed of the random baseline and the bootstrap.")
    cache: str | None = Field(
        None, description="Folder of cached checks (None: the rapo-echo cache's fidelity/)."
    )
