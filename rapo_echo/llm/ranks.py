"""Average ranks of a group of scores, ties sharing the mean of the positions they cover.

Judges rank groups of replies with it and RAPO's rank rewards read those ranks
(:mod:`rapo_echo.algorithms.rank_rewards`); it lives here, below both. Pure function.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def average_ranks(
    scores: Sequence[float], *, tie_eps: float = 0.0, higher_is_better: bool = True, chain: bool = True
) -> list[float]:
    """1-based ranks of ``scores`` (1 = best), ties sharing their average rank.

    Scores are sorted best first. With ``chain`` (the default), neighbours in that order whose gap is
    below ``tie_eps`` (or exactly 0) join one tie block, so a chain of small gaps forms one block that
    may span far more than ``tie_eps``. Without it, a block starts at its best score (the leader) and
    takes every following score closer than ``tie_eps`` to the leader (or equal to it), so no block
    spans ``tie_eps`` or more. A block covering positions ``p..q`` gives each member ``(p + q) / 2``.
    """
    if tie_eps < 0:
        raise ValueError(f"tie_eps must be >= 0, got {tie_eps}")
    values = [float(s) for s in scores]
    if any(math.isnan(v) for v in values):
        raise ValueError(f"scores must not be NaN, got {values}")
    order = sorted(range(len(values)), key=lambda i: -values[i] if higher_is_better else values[i])
    ranks = [0.0] * len(values)
    start = 0
    for pos in range(1, len(order) + 1):
        if pos < len(order):
            anchor = order[pos - 1] if chain else order[start]
            gap = abs(values[order[pos]] - values[anchor])
            if gap == 0 or gap < tie_eps:
                continue
        shared = (start + 1 + pos) / 2  # positions start+1 .. pos, 1-based
        for i in order[start:pos]:
            ranks[i] = shared
        start = pos
    return ranks
