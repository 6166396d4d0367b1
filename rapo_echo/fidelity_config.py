"""The ``fidelity`` section of a run config: a fidelity check run once before training.

With it, ``rapo-echo train`` measures how well the run's simulator (as the named simulated users) and
judge (through the named rewards) agree with real ESConv seekers' own ratings
(``eval --benchmark fidelity`` on ``limit`` conversations of ``data``), caches the result by the
simulator's and judge's spec, and records it as ``fidelity.json`` in the run directory, where
``rapo-echo report`` shows it next to the run's rewards::

    fidelity:
      data: ../shared/data/esconv/FailedESConv.json
      users: [reaction]
      rewards: [empathy]
      limit: 20
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class FidelityCheckConfig(BaseModel):
    """A fidelity check (see the module doc); the engines are the run's ``simulator`` and ``judge``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    data: str  # raw ESConv.json or FailedESConv.json (files with in-dialogue ratings)
    users: list[str] = Field(default_factory=lambda: ["reaction"])  # simulated users on the simulator
    rewards: list[str] = Field(default_factory=list)  # reward plugins (judge rewards use the judge)
    limit: int = Field(20, ge=1)  # conversations (all their rated points)
    max_new_tokens: int = Field(48, ge=1)  # the simulated users' next messages
    seed: int = 0  # random baseline and bootstrap
    cache: str | None = None  # folder of cached checks (default: <rapo-echo cache>/fidelity)
