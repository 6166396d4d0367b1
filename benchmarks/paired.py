"""Paired comparison of two evaluations of the same cases, case by case (docs/reading-results.md, Paired
comparisons).

A 0/1 ``success`` with one repeat per case: of the ``n`` cases valid in both, ``wins`` succeeded only
with the policy and ``losses`` only with the baseline; the difference ``(wins - losses) / n`` gets the
95% Wald interval for paired proportions, ``se = sqrt(wins + losses - (wins - losses)**2 / n) / n``, and
the exact two-sided McNemar p, ``min(1, 2 * sum_{k <= min(wins, losses)} C(wins + losses, k) /
2**(wins + losses))``. Every other figure (:func:`paired_figure`): the difference of the per-case means,
a paired bootstrap interval and the Wilcoxon signed-rank p (:mod:`rapo_echo.benchmarks.stats`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rapo_echo.benchmarks.figures import CaseGrid, Figure
from rapo_echo.benchmarks.stats import paired_bootstrap_ci, wilcoxon_signed_rank

Z95 = 1.959963984540054
SUCCESS = "success"


def mcnemar_exact_p(wins: int, losses: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (1.0 when there are none)."""
    if wins < 0 or losses < 0:
        raise ValueError(f"counts must be >= 0, got {wins}, {losses}")
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2**n
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedSuccess:
    """Success of a policy against a baseline on the cases both evaluated validly."""

    n: int
    baseline_successes: int
    successes: int
    wins: int  # the policy succeeded, the baseline failed
    losses: int  # the baseline succeeded, the policy failed

    @property
    def difference(self) -> float:
        return (self.wins - self.losses) / self.n

    @property
    def interval(self) -> tuple[float, float]:
        """95% Wald interval of the success-rate difference."""
        d = self.wins - self.losses
        se = math.sqrt(max(0.0, self.wins + self.losses - d * d / self.n)) / self.n
        return self.difference - Z95 * se, self.difference + Z95 * se

    @property
    def p(self) -> float:
        return mcnemar_exact_p(self.wins, self.losses)


def _successes(records: Sequence[dict[str, Any]]) -> dict[str, bool]:
    return {
        str(r["id"]): bool(r["metrics"][SUCCESS])
        for r in records
        if r.get("valid") and SUCCESS in r.get("metrics", {})
    }


def paired_success(
    baseline: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]]
) -> PairedSuccess | None:
    """Compare two evaluations' records case by case (None when no case is valid in both)."""
    a, b = _successes(baseline), _successes(other)
    shared = [i for i in a if i in b]
    if not shared:
        return None
    return PairedSuccess(
        n=len(shared),
        baseline_successes=sum(a[i] for i in shared),
        successes=sum(b[i] for i in shared),
        wins=sum(b[i] and not a[i] for i in shared),
        losses=sum(a[i] and not b[i] for i in shared),
    )


MCNEMAR = "exact McNemar"
WILCOXON = "Wilcoxon signed-rank"


@dataclass(frozen=True)
class PairedFigure:
    """One figure of two runs compared on the cases both have a value for: the baseline's and the
    other's mean, their difference (other - baseline) with its 95% interval, p and the test's name."""

    figure: str
    n: int
    baseline: float
    other: float
    difference: float
    interval: tuple[float, float] | None
    p: float
    test: str
    discordant: tuple[int, int] | None = None  # McNemar: cases only the other won, only the baseline won


def case_means(records: Sequence[dict[str, Any]], figure: Figure) -> tuple[dict[str, float], bool]:
    """Each case's mean of the figure over its valid repeats (cases without a value left out), and
    whether every case has exactly one value."""
    grid = CaseGrid(records)
    values = grid.values(figure)
    counts = (~np.isnan(values)).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, np.nansum(values, axis=1) / np.maximum(counts, 1), np.nan)
    out = {c: float(m) for c, m in zip(grid.cases, means) if not math.isnan(m)}
    return out, bool(np.all(counts[counts > 0] == 1))


def paired_figure(
    key: str, figure: Figure, baseline: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]]
) -> PairedFigure | None:
    """``figure`` of two runs compared case by case (see the module doc); None when no case has a value
    in both. A count figure is compared as its mean (its rate)."""
    a, single_a = case_means(baseline, figure)
    b, single_b = case_means(other, figure)
    shared = [c for c in a if c in b]
    if not shared:
        return None
    xa, xb = np.array([a[c] for c in shared]), np.array([b[c] for c in shared])
    binary = single_a and single_b and set(np.unique(np.concatenate([xa, xb]))) <= {0.0, 1.0}
    if binary:
        wins, losses = int(np.sum((xb == 1) & (xa == 0))), int(np.sum((xa == 1) & (xb == 0)))
        c = PairedSuccess(len(shared), int(xa.sum()), int(xb.sum()), wins, losses)
        interval, p, test, discordant = c.interval, c.p, MCNEMAR, (wins, losses)
    else:
        d = xb - xa
        interval, p, test = paired_bootstrap_ci(d), wilcoxon_signed_rank(d)[1], WILCOXON
        discordant = None
    means = (float(xa.mean()), float(xb.mean()), float((xb - xa).mean()))
    return PairedFigure(key, len(shared), *means, interval, p, test, discordant)


def paired_figures(
    figures: Mapping[str, Figure], baseline: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]]
) -> list[PairedFigure]:
    """Every figure that is a mean over cases (counts left out: their rate is there) compared case by
    case, in the benchmark's order."""
    out = []
    for key, figure in figures.items():
        if figure.count:
            continue
        compared = paired_figure(key, figure, baseline, other)
        if compared is not None:
            out.append(compared)
    return out
