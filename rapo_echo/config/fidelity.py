"""The ``fidelity`` section of a run config: a fidelity check run once before training.

With it, ``rapo-echo train`` measures how well the run's simulator (as the named simulated users) and
judge (through the named rewards) agree with real ESConv seekers' own ratings
(``eval --benchmark fidelity`` on ``limit`` conversations of ``data``), caches the result by the
simulator's and judge's spec, and records it as ``fidelity.json`` in the run directory, where
``rapo-echo report`` shows it next to the run's rewards::

    fidelity:
      data: path/to/FailedESConv.json
      users: [reaction]
      rewards: [empathy]
      limit: 20
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
