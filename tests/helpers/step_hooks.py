"""A step hook written the way a user's package writes one (docs/extending.md, "A step hook"), and GRPO
with it turned on through the algorithm interface (``--algo tests.helpers.step_hooks:HookedGRPO``):
tests/integration/test_step_hooks.py trains it.

``ShortReplies`` marks each reply shorter than ``min_tokens`` in its ``info`` (written to
``samples.jsonl``), logs their share, keeps one record per short reply in ``hooks/short_replies.jsonl``,
counts the steps it has seen (its checkpointed state) and asks the run to stop after step ``stop_at``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rapo_echo.algorithms.grpo import GRPO
from rapo_echo.step_hooks import HookResult, StepHook
from rapo_echo.types import Sample, Scenario


class ShortReplies(StepHook):
    """Marks, counts and records short replies; stops the run after step ``stop_at``."""

    name = "short_replies"

    def __init__(self, min_tokens: int, stop_at: int) -> None:
        self.min_tokens = min_tokens
        self.stop_at = stop_at
        self.steps_seen = 0
        self.scenarios_seen = 0

    def before_rollout(self, scenarios: Sequence[Scenario], step: int) -> dict[str, float]:
        self.scenarios_seen += len(scenarios)
        return {"short_replies/scenarios_seen": float(self.scenarios_seen)}

    def after_rollout(self, samples: Sequence[Sample], step: int) -> dict[str, float]:
        for s in samples:
            s.info["short"] = len(s.completion_ids) < self.min_tokens
        return {"short_replies/share": sum(s.info["short"] for s in samples) / max(1, len(samples))}

    def after_step(self, step: int, metrics: dict[str, float], samples: Sequence[Sample]) -> HookResult:
        self.steps_seen += 1
        records = [{"reply": s.text, "tokens": len(s.completion_ids)} for s in samples if s.info["short"]]
        stop = f"step {step} reached (stop_at = {self.stop_at})" if step == self.stop_at else ""
        return HookResult({"short_replies/steps_seen": float(self.steps_seen)}, records, stop)

    def state_dict(self) -> dict[str, Any]:
        return {"steps_seen": self.steps_seen, "scenarios_seen": self.scenarios_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_seen = int(state.get("steps_seen", 0))
        self.scenarios_seen = int(state.get("scenarios_seen", 0))


class HookedGRPO(GRPO):
    """GRPO that turns :class:`ShortReplies` on through the algorithm interface (replies under 7 tokens;
    stop after step 2)."""

    name = "hooked_grpo"

    def step_hooks(self) -> list[StepHook]:
        return [ShortReplies(min_tokens=7, stop_at=2)]
