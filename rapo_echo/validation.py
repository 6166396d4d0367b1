"""Held-out validation during training, and keeping the best-validated model.

With ``validation.data`` set, the trainer asks the algorithm for the policy's greedy replies to those
held-out scenarios and scores them the way the run is rewarded (:meth:`Algorithm.validate`: RAPO the
simulated person's emotion change, GRPO the reward plugins) before the first step and after every
checkpoint, and appends one line per validation to ``validation.jsonl``. With ``validation.keep_best``
the best-scoring weights so far live in ``best/`` (``best/best.json`` says which step; the base, step 0,
counts), and ``final/`` is made from them: a run whose policy drifts ends no worse, on its validation
set, than the best point it passed. A later step wins a tie.

Validation leaves the run's random state as it found it, so a run with validation trains the same
steps as one without, and a resumed run the same as an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rapo_echo.atomic import replace_dir
from rapo_echo.checkpoint import rng_state, set_rng_state
from rapo_echo.data import load_scenarios
from rapo_echo.errors import ConfigError
from rapo_echo.jsonl import append_jsonl, keep_jsonl, read_jsonl

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rapo_echo.algorithms.base import Algorithm
    from rapo_echo.config import RunConfig
    from rapo_echo.policy import Policy
    from rapo_echo.types import Scenario

log = logging.getLogger(__name__)

VALIDATION_FILE = "validation.jsonl"
BEST_DIR = "best"
BEST_FILE = "best.json"


def validation_scenarios(cfg: RunConfig, algo_cls: type[Algorithm]) -> list[Scenario] | None:
    """The held-out scenarios of ``validation.data`` (None when unset), checked before any model loads."""
    vc = cfg.validation
    if not vc.data:
        return None
    if algo_cls.validation_key is None:
        raise ConfigError(
            f"validation.data: --algo {cfg.algo} has no single-reply score to validate with (validation "
            "works with rapo and grpo); remove validation.data"
        )
    scenarios = load_scenarios(vc.data, vc.format, limit=vc.limit)
    if not scenarios:
        raise ConfigError(f"validation.data: {vc.data} holds no scenarios")
    return scenarios


@contextmanager
def random_state_kept(algorithm: Algorithm) -> Iterator[None]:
    """Run the body, then put back Python's, NumPy's and torch's random state and the algorithm's own
    (a simulator drawing its next message consumes them)."""
    state, algo_state = rng_state(), algorithm.state_dict()
    try:
        yield
    finally:
        set_rng_state(state)
        algorithm.load_state_dict(algo_state)


class Validator:
    """Validates the policy on held-out scenarios and keeps the best weights (``keep_best``)."""

    def __init__(
        self, cfg: RunConfig, scenarios: list[Scenario], algorithm: Algorithm, policy: Policy, run_dir: Path
    ) -> None:
        vc = cfg.validation
        self.scenarios = scenarios
        self.algorithm = algorithm
        self.policy = policy
        self.key = algorithm.validation_key
        self.max_new_tokens = vc.max_new_tokens or cfg.rollout.max_new_tokens
        self.keep_best = vc.keep_best
        self.file = run_dir / VALIDATION_FILE
        self.best_dir = run_dir / BEST_DIR

    def best(self) -> dict[str, Any] | None:
        """``best/best.json`` (``step``, ``key``, ``value``), or None before the first validation."""
        path = self.best_dir / BEST_FILE
        return json.loads(path.read_text()) if path.is_file() else None

    def has(self, step: int) -> bool:
        """Whether ``validation.jsonl`` already holds a validation of ``step``."""
        return any(isinstance(r, dict) and r.get("step") == step for _, r in read_jsonl(self.file))

    def run(self, step: int) -> dict[str, float]:
        """Validate the policy as it is after ``step`` steps; record it and, with ``keep_best``, save
        its weights to ``best/`` when it scores at least as well as the best so far."""
        with random_state_kept(self.algorithm), torch.no_grad():
            metrics = self.algorithm.validate(self.scenarios, self.max_new_tokens)
        self.policy.take_truncations()  # validation prompts are not the run's
        append_jsonl(self.file, [{"step": step, **metrics}])
        value = metrics.get(self.key, float("nan"))
        log.info("validation after step %d: %s = %.4f", step, self.key, value)
        best = self.best()
        if self.keep_best and math.isfinite(value) and (best is None or value >= best["value"]):
            self._save_best(step, value)
        return metrics

    def _save_best(self, step: int, value: float) -> None:
        tmp = self.best_dir.with_name(BEST_DIR + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.policy.save(tmp, merged=False)
        (tmp / BEST_FILE).write_text(json.dumps({"step": step, "key": self.key, "value": value}) + "\n")
        replace_dir(tmp, self.best_dir)

    def resumed_at(self, step: int) -> None:
        """On resume from ``step``: forget validations after it (they will be redone); a best from after
        it is dropped with a warning (its weights are not the resumed run's past)."""
        keep_jsonl(self.file, lambda r: not isinstance(r, dict) or r.get("step", 0) <= step)
        best = self.best()
        if best is not None and best["step"] > step:
            log.warning(
                "best/ holds step %d, after the resumed checkpoint (step %d): dropped", best["step"], step
            )
            shutil.rmtree(self.best_dir)

    def restore_best(self, step: int) -> int | None:
        """With ``keep_best``: load the best weights into the policy when they are not the current
        step's; returns their step (None when the current weights stay)."""
        from rapo_echo.trainer import load_model_weights

        best = self.best() if self.keep_best else None
        if best is None or best["step"] == step:
            return None
        load_model_weights(self.policy, self.best_dir)
        log.info(
            "final/ holds the best-validated model, step %d (%s = %.4f), not step %d",
            best["step"],
            best["key"],
            best["value"],
            step,
        )
        return int(best["step"])
