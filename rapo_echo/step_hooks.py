"""Step hooks: what a training run calls around each step besides the algorithm (persona inference, the
held-out judge, the reward-hacking monitor). When each method is called, on which processes, and what
the run does with its results: docs/architecture.md, "Step hooks".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rapo_echo.types import Sample, Scenario


@dataclass
class HookResult:
    """What a hook gives back after a step: ``metrics`` added to the step's metrics line; ``records``
    appended to ``hooks/<name>.jsonl`` (each written with the step), e.g. the samples that show an alarm;
    ``stop`` non-empty: the run checkpoints after this step and stops, and this text says why."""

    metrics: dict[str, float] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    stop: str = ""


class StepHook:
    """A step hook (see the module doc). Each method does nothing unless a subclass overrides it."""

    # names its records file (``hooks/<name>.jsonl``) and its state in a checkpoint; unique in a run
    name: ClassVar[str] = "hook"

    def before_rollout(self, scenarios: Sequence[Scenario], step: int) -> dict[str, float]:
        """Before the rollout of step ``step``: may annotate ``scenarios``; this process's metrics."""
        return {}

    def after_rollout(self, samples: Sequence[Sample], step: int) -> dict[str, float]:
        """After the rollout: may score ``samples`` and add to their ``info``; this process's metrics."""
        return {}

    def after_step(self, step: int, metrics: dict[str, float], samples: Sequence[Sample]) -> HookResult:
        """After the update: what to add to the step's metrics and records, and whether to stop."""
        return HookResult()

    def state_dict(self) -> dict[str, Any]:
        """The hook's state for a checkpoint (JSON-serialisable); restored by :meth:`load_state_dict`."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (``--resume``)."""
        return None
