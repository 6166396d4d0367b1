"""``emotion_change``: a simulated user's emotion change as a scalar reward (GRPO without a judge).

For each reply the simulator (``simulator``: any name ``rapo.simulator.name`` takes, with
``simulator_args``) reacts as the person, and the reward is ``emotion_delta / scale`` in [-1, 1]; a
reply it could not react to is invalid (masked and counted). The reaction is kept in the sample's
info. This is RLVER's verifiable emotion reward cut to one turn, and the scalar baseline RAPO's
learning benchmark compares rank rewards and critiques against.

It lives with the simulators it wraps, above the reward layer, and is registered by name through the
``rapo_echo.rewards`` entry-point group (pyproject.toml), the door any reward plugin uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rapo_echo.rewards import RewardContext, RewardOutput
from rapo_echo.simulators.base import build_simulator, checked_reactions
from rapo_echo.types import Sample


class EmotionChangeReward:
    """``delta / scale`` of the simulated person's reaction to each reply."""

    name = "emotion_change"

    def __init__(
        self,
        ctx: RewardContext,
        simulator: str = "reaction",
        simulator_args: dict[str, Any] | None = None,
        scale: float = 10.0,
        seed: int = 0,
    ) -> None:
        if scale <= 0:
            raise ValueError(f"emotion_change: scale must be > 0, got {scale}")
        self.scale = float(scale)
        self.simulator_name = simulator
        self.simulator = build_simulator(
            simulator,
            simulator_args,
            engine=ctx.simulator,
            scale=self.scale,
            seed=seed,
            where="rewards: emotion_change: simulator",
        )

    def __call__(self, samples: Sequence[Sample]) -> list[RewardOutput | None]:
        if not samples:
            return []
        pairs = [(s.scenario, s.text) for s in samples]
        reactions = checked_reactions(
            self.simulator.react(pairs), len(pairs), scale=self.scale, name=self.simulator_name
        )
        out: list[RewardOutput | None] = []
        for r in reactions:
            if not r.valid or r.emotion_delta is None:
                out.append(None)
                continue
            info = {"message": r.message, "emotion_delta": r.emotion_delta, "thought": r.thought}
            out.append(RewardOutput(r.emotion_delta / self.scale, info=info))
        return out
