"""Paired comparison of per-case success between two evaluations of the same cases.

ESConv, SAGE and EPM record a 0/1 ``success`` per case. Two policies evaluated on the same cases are
compared case by case: of the ``n`` cases valid in both, ``wins`` succeeded only with the policy and
``losses`` only with the baseline. The success-rate difference is ``(wins - losses) / n`` with a 95%
Wald interval for paired proportions, ``se = sqrt(wins + losses - (wins - losses)**2 / n) / n``, and
the exact two-sided McNemar test (a sign test on the discordant cases) gives
``p = min(1, 2 * sum_{k <= min(wins, losses)} C(wins + losses, k) / 2**(wins + losses))``.
A large ``p`` says the difference is within what chance gives on this many cases, not that there is none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
