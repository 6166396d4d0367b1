"""The ``ppo`` section: PPO's own switches (docs/algorithms/ppo.md), read by ``--algo ppo`` and by RLVER's
PPO estimator (``rlver.ppo``) without importing the algorithm."""

from __future__ import annotations

from pydantic import Field

from rapo_echo.config import Strict


class PpoConfig(Strict):
    """PPO's own switches: the value head's estimate (GAE) and its loss."""

    gamma: float = Field(1.0, ge=0.0, le=1.0, description="GAE discount.")
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda.")
    value_clip: float | None = Field(
        0.2, gt=0.0, description="Clip of the value change around the old value (None: no clip)."
    )
    vf_coef: float = Field(0.5, ge=0.0, description="Weight of the value loss.")
    whiten: bool = Field(True, description="Normalise advantages over the batch's policy tokens.")
