"""Held-out validation during training, and keeping the best-validated model.

With ``validation.data`` set, the policy's greedy replies to held-out scenarios are scored the way the
run is rewarded, before the first step and after every checkpoint (one line each in ``validation.jsonl``).
A step is compared with the best so far on the scenarios both scored (paired); with ``keep_best`` it
replaces the best when its gain is >= 0 and it passes ``validation.checks`` (:mod:`.checks`). Validation
leaves the run's random state as it found it.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import statistics
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rapo_echo import progress
from rapo_echo.atomic import replace_dir
from rapo_echo.checkpoint import rng_state, set_rng_state
from rapo_echo.data import load_scenarios
from rapo_echo.errors import ConfigError
from rapo_echo.jsonl import append_jsonl, keep_jsonl, read_jsonl
from rapo_echo.rundir import BEST_DIR, BEST_FILE, VALIDATION_FILE
from rapo_echo.variety import distinct_n, paired_distinct_gain

from .checks import Check, Comparison, build_checks, replaces_best

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from rapo_echo.algorithms.base import Algorithm
    from rapo_echo.policy import Policy
    from rapo_echo.types import Scenario

    from ..run_config import RunConfig

log = logging.getLogger(__name__)

@dataclass
class HeldOut:
    """The held-out scenarios, and which of them each file of ``validation.data`` gave (positions)."""

    scenarios: list[Scenario]
    subsets: dict[str, range]


def validation_scenarios(cfg: RunConfig, algo_cls: type[Algorithm]) -> HeldOut | None:
    """The held-out scenarios of ``validation.data`` (None when unset), checked before any model loads;
    ``validation.limit`` keeps the first scenarios over all files (a file left with none is no subset)."""
    vc = cfg.validation
    if not vc.data:
        return None
    if algo_cls.validation_key is None:
        raise ConfigError(
            f"validation.data: --algo {cfg.algo} has no single-reply score to validate with (validation "
            "works with rapo and grpo); remove validation.data"
        )
    if vc.turns > 1 and not algo_cls.validation_dialogues:
        raise ConfigError(
            f"validation.turns: --algo {cfg.algo} validates single replies (it has no simulated person "
            "to answer them); set validation.turns: 1"
        )
    sources = [vc.data] if isinstance(vc.data, str) else list(vc.data)
    scenarios: list[Scenario] = []
    subsets: dict[str, range] = {}
    for src in sources:
        start = len(scenarios)
        scenarios += load_scenarios(src, vc.format)
        subsets[src] = range(start, min(len(scenarios), vc.limit or len(scenarios)))
    scenarios = scenarios[: vc.limit]
    if not scenarios:
        raise ConfigError(f"validation.data: {vc.data} holds no scenarios")
    return HeldOut(scenarios, {src: r for src, r in subsets.items() if len(r)})


def paired_gain(new: list[float | None], best: list[float | None]) -> tuple[float, float, int]:
    """Mean and standard error of ``new - best`` over the scenarios both scored (neither None), and how
    many that is: ``(nan, nan, 0)`` when none, standard error ``nan`` for one."""
    if len(new) != len(best):
        raise ValueError(f"paired_gain: {len(new)} scores against {len(best)}")
    diffs = [a - b for a, b in zip(new, best) if a is not None and b is not None]
    if not diffs:
        return float("nan"), float("nan"), 0
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return statistics.fmean(diffs), se, len(diffs)


def _named_gains(pairs: Iterable[tuple[str, list[float | None], list[float | None]]]) -> dict[str, Any]:
    """``{name: {"gain", "gain_se", "n"}}`` of :func:`paired_gain` for each ``(name, new, best)``; names
    with no pair are left out."""
    out = {}
    for name, new, best in pairs:
        gain, se, n = paired_gain(new, best)
        if n:
            out[name] = {"gain": gain, "gain_se": se, "n": n}
    return out


def subset_gains(
    new: list[float | None], best: list[float | None], subsets: dict[str, range]
) -> dict[str, dict[str, float]]:
    """Per subset: the paired ``gain`` of ``new`` over ``best``, its ``gain_se`` and ``n`` (pairs);
    subsets with no pair are left out."""
    return _named_gains(
        (name, [new[i] for i in where], [best[i] for i in where]) for name, where in subsets.items()
    )


def rule_rises(new: Mapping[str, Any], best: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per negative rule in either record: how much less often it fires under ``new`` than under
    ``best`` (``gain``, negative when it fires more often), paired by scenario, with ``gain_se`` and
    ``n``; a rule a record does not list fired on none of its scored scenarios (0 there)."""

    def rates(rec: Mapping[str, Any], name: str) -> list[float | None]:
        listed = rec.get("rules", {}).get(name)
        return listed if listed is not None else [0.0 if x is not None else None for x in rec["scores"]]

    names = sorted({*new.get("rules", {}), *best.get("rules", {})})
    return _named_gains((name, rates(best, name), rates(new, name)) for name in names)


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
        self, cfg: RunConfig, held_out: HeldOut, algorithm: Algorithm, policy: Policy, run_dir: Path
    ) -> None:
        vc = cfg.validation
        self.scenarios = held_out.scenarios
        self.subsets = held_out.subsets
        self.checks: list[Check] = build_checks(vc.checks, algorithm)
        self.algorithm = algorithm
        self.policy = policy
        assert algorithm.validation_key is not None  # validation_scenarios refuses an algorithm without one
        self.key = algorithm.validation_key
        self.max_new_tokens = vc.max_new_tokens or cfg.rollout.max_new_tokens
        self.turns = vc.turns
        self.keep_best = vc.keep_best
        self.file = run_dir / VALIDATION_FILE
        self.best_dir = run_dir / BEST_DIR

    def best(self) -> dict[str, Any] | None:
        """``best/best.json`` (``step``, ``key``, ``value``, per-scenario ``scores``), or None before the
        first validation."""
        path = self.best_dir / BEST_FILE
        return json.loads(path.read_text()) if path.is_file() else None

    def has(self, step: int) -> bool:
        """Whether ``validation.jsonl`` already holds a validation of ``step``."""
        return any(isinstance(r, dict) and r.get("step") == step for _, r in read_jsonl(self.file))

    def cost(self, step: int) -> str:
        """What a validation costs, said before it starts (the one before step 1 runs before any training):
        the policy's greedy replies, and the scoring calls on top."""
        when = "before step 1" if step == 0 else f"after step {step}"
        n, turns = len(self.scenarios), self.turns
        return (
            f"{when}: {n * turns} greedy replies ({n} held-out scenarios x {turns} turn{'s' * (turns > 1)}) "
            f"of up to {self.max_new_tokens} tokens, each then scored by the run's simulator or judge"
        )

    def run(self, step: int) -> dict[str, float]:
        """Validate the policy as it is after ``step`` steps; record it (its per-scenario scores too)
        and, with ``keep_best``, save its weights to ``best/`` when it replaces the best so far (see the
        module doc); returns the metrics, with the paired ``val/gain`` and ``val/gain_se`` over the best."""
        log.info("validation %s", self.cost(step))
        replies = len(self.scenarios) * self.turns  # the bar stays open while they run: theirs nest under it
        with (
            progress.task(f"validation ({replies} replies)", unit="set"),
            random_state_kept(self.algorithm),
            torch.no_grad(),
        ):
            result = self.algorithm.validate(self.scenarios, self.max_new_tokens, self.turns)
        self.policy.take_truncations()  # validation prompts are not the run's
        metrics, scores = dict(result.metrics), list(result.scores)
        if len(scores) != len(self.scenarios):
            raise ValueError(
                f"{type(self.algorithm).__name__}.validate gave {len(scores)} scores for "
                f"{len(self.scenarios)} held-out scenarios"
            )
        value = metrics.get(self.key, float("nan"))
        best = self.best()
        replace = best is None and math.isfinite(value)
        row: dict[str, Any] = {"rules": dict(result.rules)} if result.rules else {}
        if result.replies:
            metrics["val/distinct_2"] = 100.0 * distinct_n([t for r in result.replies for t in r], 2)
            row["replies"] = [list(r) for r in result.replies]
        if best is not None:
            gain, se = self._gain(scores, value, best)
            metrics.update({"val/gain": gain, "val/gain_se": se})
            comparison = Comparison(gain, se)
            gates = [c for c in self.checks if not c.floor]
            replace = replaces_best(gain, se, 0.0) and not any(c.refuses(comparison) for c in gates)
            log.info(
                "validation after step %d: %s = %.4f, %+.4f (standard error %.4f) over step %d",
                step, self.key, value, gain, se, best["step"],
            )  # fmt: skip
            if "scores" in best:
                vetoes = self._vetoes(row, scores, best, comparison)
                if vetoes:
                    row["vetoed_by"] = vetoes
                    if replace:
                        log.info(
                            "step %d does not replace the best (step %d): it loses beyond the floor on %s",
                            step, best["step"], ", ".join(vetoes),
                        )  # fmt: skip
                    replace = False
        else:
            log.info("validation after step %d: %s = %.4f", step, self.key, value)
        append_jsonl(self.file, [{"step": step, **metrics, **row, "scores": scores}])
        if self.keep_best and replace:
            self._save_best(step, value, scores, row.get("rules", {}), row.get("replies"))
        return metrics

    def _vetoes(
        self, row: dict[str, Any], scores: list[float | None], best: dict[str, Any], c: Comparison
    ) -> list[str]:
        """Adds the per-file gains (``subsets``), the rules' drops in firing rate (``rule_gains``) and the
        change in Distinct-2 (``variety``) over the best to ``row`` and to ``c``; returns what the floors
        of ``validation.checks`` refuse (files, ``rule:NAME``, ``variety``)."""
        if len(self.subsets) > 1:
            row["subsets"] = c.subsets = subset_gains(scores, best["scores"], self.subsets)
        rises = rule_rises({"scores": scores, **row}, best)
        if rises:
            row["rule_gains"] = c.rule_gains = rises
        if row.get("replies") and best.get("replies"):
            gain, se, n = paired_distinct_gain(row["replies"], best["replies"])
            if n:
                row["variety"] = c.variety = {"gain": gain, "gain_se": se, "n": n}
        return [name for check in self.checks if check.floor for name in check.refuses(c)]

    def _gain(self, scores: list[float | None], value: float, best: dict[str, Any]) -> tuple[float, float]:
        """The paired gain of ``scores`` over the best and its standard error; a best saved without
        per-scenario scores (by an older version) is compared by its mean, with no standard error."""
        if "scores" not in best:
            return value - best["value"], float("nan")
        gain, se, _ = paired_gain(scores, best["scores"])
        return gain, se

    def _save_best(
        self,
        step: int,
        value: float,
        scores: list[float | None],
        rules: dict[str, list[float | None]],
        replies: list[list[str]] | None,
    ) -> None:
        tmp = self.best_dir.with_name(BEST_DIR + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.policy.save(tmp, merged=False)
        best = {"step": step, "key": self.key, "value": value, "scores": scores, "rules": rules}
        best |= {"replies": replies} if replies is not None else {}
        (tmp / BEST_FILE).write_text(json.dumps(best) + "\n")
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
        best = self.best() if self.keep_best else None
        if best is None or best["step"] == step:
            return None
        self.policy.load(self.best_dir)
        log.info(
            "final/ holds the best-validated model, step %d (%s = %.4f), not step %d",
            best["step"],
            best["key"],
            best["value"],
            step,
        )
        return int(best["step"])
