"""The checks a validated step must pass to replace the best so far (``validation.checks``).

A step is compared with the best on the held-out scenarios both scored (:class:`Comparison`); it
replaces the best when its paired gain is >= 0 and no check refuses it. Each check is a small class
found by name: the built-ins below, an entry point of the ``rapo_echo.validation_checks`` group, or
``module:Class`` (a subclass of :class:`Check`; the spec's other keys go to its constructor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from rapo_echo.config import CHECK_ENTRY_POINTS
from rapo_echo.errors import ConfigError
from rapo_echo.plugins import resolve_object

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pydantic import BaseModel

    from rapo_echo.algorithms.base import Algorithm

# name -> import string, imported on first use
CHECKS = {
    "min_gain": "rapo_echo.training.validation.checks:MinGain",
    "subset_floor": "rapo_echo.training.validation.checks:SubsetFloor",
    "rule_floor": "rapo_echo.training.validation.checks:RuleFloor",
    "variety_floor": "rapo_echo.training.validation.checks:VarietyFloor",
}

Gains = dict[str, dict[str, float]]


@dataclass
class Comparison:
    """A step against the best: the paired ``gain`` and its standard error ``gain_se``; and where the
    best kept per-scenario scores, the paired gains per file (``subsets``), per negative rule (drops in
    its firing rate, ``rule_gains``) and in Distinct-2 (``variety``, None without replies)."""

    gain: float
    gain_se: float
    subsets: Gains = field(default_factory=dict)
    rule_gains: Gains = field(default_factory=dict)
    variety: dict[str, float] | None = None


def replaces_best(gain: float, se: float, min_gain: float) -> bool:
    """Whether a step whose paired gain over the best is ``gain`` (standard error ``se``) becomes the
    best: ``gain >= 0`` at ``min_gain = 0`` (a tie goes to the later step), else ``gain > min_gain * se``
    (no decision without a standard error: fewer than two paired scenarios keep the best)."""
    if not math.isfinite(gain):
        return False
    if min_gain == 0:
        return gain >= 0
    return math.isfinite(se) and gain > min_gain * se


def vetoed_by(gains: Gains, floor: float | None) -> list[str]:
    """The names (files or rules) in ``gains`` on which a step loses more than ``floor`` standard errors
    (``gain < -floor * se``; a standard error of nan, one pair, counts as 0). None: no floor."""
    if floor is None:
        return []
    return [
        name
        for name, g in gains.items()
        if g["gain"] < -floor * (g["gain_se"] if math.isfinite(g["gain_se"]) else 0.0)
    ]


class Check:
    """One condition a step must meet to replace the best. ``refuses`` returns what it loses on (empty:
    it passes). A floor (``floor = True``) is checked only against a best with per-scenario scores, and
    what it refuses on is recorded in ``vetoed_by``; a gate (``floor = False``) judges the overall gain."""

    name: ClassVar[str] = ""
    floor: ClassVar[bool] = True

    def refuses(self, c: Comparison) -> list[str]:
        raise NotImplementedError

    def bind(self, algorithm: Algorithm | None) -> None:
        """Check the parameters against the run's algorithm (e.g. its simulated person's rules)."""


class MinGain(Check):
    """The paired gain must exceed ``se`` standard errors (at 0: gain >= 0, a tie goes to the later step)."""

    name = "min_gain"
    floor = False

    def __init__(self, se: float) -> None:
        self.se = se

    def refuses(self, c: Comparison) -> list[str]:
        return [] if replaces_best(c.gain, c.gain_se, self.se) else [self.name]


class SubsetFloor(Check):
    """With several held-out files: no file may lose more than ``se`` standard errors."""

    name = "subset_floor"

    def __init__(self, se: float) -> None:
        self.se = se

    def refuses(self, c: Comparison) -> list[str]:
        return vetoed_by(c.subsets, self.se)


class RuleFloor(Check):
    """No watched negative rule of the simulated person (``rules``; None: all) may fire more often than
    under the best by more than ``se`` standard errors; refusals read ``rule:NAME``."""

    name = "rule_floor"

    def __init__(self, se: float, rules: Sequence[str] | None = None) -> None:
        self.se = se
        self.rules = None if rules is None else list(rules)

    def bind(self, algorithm: Algorithm | None) -> None:
        negative = algorithm.negative_rules() if algorithm is not None else None
        if self.rules is None or negative is None:
            return
        unknown = [n for n in self.rules if n not in negative]
        if unknown:
            raise ConfigError(
                f"validation.checks: rule_floor rules: {unknown} are not negative rules of the simulated "
                f"person (its negative rules: {negative})"
            )

    def refuses(self, c: Comparison) -> list[str]:
        watched = {n: g for n, g in c.rule_gains.items() if self.rules is None or n in self.rules}
        return [f"rule:{name}" for name in vetoed_by(watched, self.se)]


class VarietyFloor(Check):
    """The replies' Distinct-2 may not fall below the best's by more than ``se`` jackknife standard errors."""

    name = "variety_floor"

    def __init__(self, se: float) -> None:
        self.se = se

    def refuses(self, c: Comparison) -> list[str]:
        return vetoed_by({"variety": c.variety}, self.se) if c.variety else []


def build_checks(specs: Sequence[BaseModel], algorithm: Algorithm | None = None) -> list[Check]:
    """The checks ``validation.checks`` names, built from their specs and bound to ``algorithm``."""
    checks = []
    for i, spec in enumerate(specs):
        params = spec.model_dump()
        name = params.pop("name")
        where = f"validation.checks.{i}"
        cls = resolve_object(name, group=CHECK_ENTRY_POINTS, builtins=CHECKS, kind="check", where=where)
        if not (isinstance(cls, type) and issubclass(cls, Check)):
            raise ConfigError(f"{where}: {name!r} is not a validation check (a subclass of Check)")
        try:
            check = cls(**params)
        except TypeError as exc:
            raise ConfigError(f"{where}: {name}: {exc}") from None
        check.bind(algorithm)
        checks.append(check)
    return checks
