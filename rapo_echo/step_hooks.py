"""Step hooks: what a training run calls around each step besides the algorithm (docs/architecture.md,
"Step hooks").

A hook watches or annotates a run without being part of the loop every algorithm shares: persona
inference (:class:`rapo_echo.rewards.persona.PersonaInference`) fills the scenarios before the rollout;
the held-out judge (:class:`rapo_echo.judges.heldout.HeldoutJudge`) scores a sample of the replies after
it; the reward-hacking monitor (:class:`rapo_echo.monitor.RewardHackingMonitor`) flags the step's metrics.
The run (``training/run.py``) builds the hooks a config turns on and those an algorithm asks for
(:meth:`Algorithm.step_hooks <rapo_echo.algorithms.base.Algorithm.step_hooks>`), and calls them in that
order, on every process, at three points of each step ``step`` (1-based: the number the step's line in
``metrics.jsonl`` carries):

1. :meth:`StepHook.before_rollout` with this process's scenarios, before the algorithm's rollout, inside
   the policy's generation view (a hook may call the roles: the simulator, the judge). It may change the
   scenarios (their ``meta``); the metrics it returns are this process's, averaged over the processes
   with the step's other metrics.
2. :meth:`StepHook.after_rollout` with this process's samples, right after the rollout, in the same view.
   It may score them and add to each sample's ``info`` (written to ``samples.jsonl``); its metrics are
   averaged over the processes like the first.
3. :meth:`StepHook.after_step` after the update, with the step's metrics (averaged over the processes,
   the same on every rank, earlier hooks' additions included) and this process's samples. Its
   :class:`HookResult` adds metrics to the step's line, appends records to ``hooks/<name>.jsonl`` in the
   run directory (the main process writes its own), and may ask the run to stop: the run then
   checkpoints after this step and ends cleanly (``stopped_by`` says why; ``--resume`` continues).
   Processes stop together: one hook on one process asking is enough.

:meth:`StepHook.state_dict` (the main process's) is saved with every checkpoint and given back to
:meth:`StepHook.load_state_dict` on every process on ``--resume``, so a hook with a history resumes where
it stopped.
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
