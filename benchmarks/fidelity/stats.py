"""Rank statistics of the fidelity benchmark: average ranks, Spearman's rho and Kendall's tau-b (through
``scipy.stats``) and within-dialogue pairwise agreement (definitions: docs/fidelity.md); their intervals
resample whole dialogues with the benchmarks' one bootstrap (:func:`rapo_echo.benchmarks.stats.bootstrap_ci`).

The bootstrap stays ours rather than ``scipy.stats.bootstrap``: a resample of dialogues may leave a
statistic undefined (one rating level left), and such resamples are dropped, while scipy's interval
needs a value from every resample. The statistics have weighted forms (:class:`RankedPoints`, a weight
per point: how many times its dialogue was drawn) that equal the plain ones on the data with every point
repeated its weight's number of times, computed with numpy over all points at once
(``perf/bench_fidelity_summary.py``).

Ties: tied values share their average rank; Kendall's tau-b corrects for ties on either side; in pairwise
agreement a pair the prediction ties counts 0.5, a pair the ratings tie is not a pair. A statistic that
is undefined (fewer than two values, or one side constant) is ``None``, never 0."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rapo_echo.llm.ranks import average_ranks

TIE_CREDIT = 0.5  # what a pair the prediction ties counts in pairwise agreement


def ascending_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, lowest value first, tied values sharing the mean of the ranks they span (the one
    average-rank rule, :func:`rapo_echo.llm.ranks.average_ranks`)."""
    return average_ranks(values, higher_is_better=False)


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson's r; None for fewer than two pairs or a constant side."""
    if len(x) != len(y):
        raise ValueError(f"pearson: {len(x)} values against {len(y)}")
    n = len(x)
    if n < 2:
        return None
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx <= 0 or syy <= 0:
        return None
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho (``scipy.stats.spearmanr``: Pearson's r of the average ranks); None for fewer than
    two pairs or a constant side."""
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} values against {len(y)}")
    if _undefined(x, y):
        return None
    return float(scipy_stats().spearmanr(x, y).statistic)


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b (``scipy.stats.kendalltau``, variant b) = (C - D) / sqrt((P - Tx) (P - Ty)) over all
    pairs, with C / D the concordant / discordant pairs, P all pairs, Tx / Ty the pairs tied in x / in y;
    None for fewer than two pairs or a constant side."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_b: {len(x)} values against {len(y)}")
    if _undefined(x, y):
        return None
    return float(scipy_stats().kendalltau(x, y, variant="b").statistic)


def _undefined(x: Sequence[float], y: Sequence[float]) -> bool:
    return len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2


def scipy_stats():
    """``scipy.stats`` (imported on first use: it takes a second)."""
    import scipy.stats

    return scipy.stats


def pair_counts(predictions: Sequence[float], ratings: Sequence[float]) -> tuple[float, int]:
    """(agreement credit, pairs) within one dialogue: over the pairs of points with different ratings,
    1 when the prediction orders them as the ratings do, :data:`TIE_CREDIT` when it ties them, else 0."""
    credit, pairs = 0.0, 0
    for i in range(len(ratings)):
        for j in range(i + 1, len(ratings)):
            if ratings[i] == ratings[j]:
                continue
            pairs += 1
            d = (predictions[i] - predictions[j]) * (ratings[i] - ratings[j])
            credit += 1.0 if d > 0 else TIE_CREDIT if d == 0 else 0.0
    return credit, pairs


def pairwise_agreement(groups: Sequence[tuple[Sequence[float], Sequence[float]]]) -> float | None:
    """Within-dialogue pairwise agreement pooled over dialogues: the summed credit of
    :func:`pair_counts` over all dialogues' pairs / the number of pairs (None without pairs). Each
    group is one dialogue's ``(predictions, ratings)``; a seeker's own use of the scale cancels out."""
    credit, pairs = 0.0, 0
    for p, r in groups:
        c, n = pair_counts(p, r)
        credit, pairs = credit + c, pairs + n
    return credit / pairs if pairs else None


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """The dot product of two vectors, without BLAS: ``a @ b`` hands a vector of 30k to BLAS threads, which
    on a busy machine took a thousand times longer than this loop."""
    return float(np.einsum("i,i->", a, b))


class RankedPoints:
    """Points ``(x, y)`` with each side's distinct values found once, so that :meth:`spearman` and
    :meth:`kendall_tau_b` of any weighting (a bootstrap resample: how many times each point was drawn)
    cost a few array passes. A weighting's statistics equal the plain ones on the data with every point
    repeated its weight's number of times (weight 0 leaves it out)."""

    MAX_LEVELS = 64  # Kendall by levels of the coarser side; beyond this, on the repeated points

    def __init__(self, x: Sequence[float], y: Sequence[float]) -> None:
        self.x, self.y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        if self.x.shape != self.y.shape:
            raise ValueError(f"RankedPoints: {len(self.x)} values against {len(self.y)}")
        self.ux, self.ix = np.unique(self.x, return_inverse=True)
        self.uy, self.iy = np.unique(self.y, return_inverse=True)

    @staticmethod
    def _ranks(inverse: np.ndarray, size: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(each point's average rank among the weighted points, the weight of each distinct value)."""
        count = np.bincount(inverse, weights=w, minlength=size)
        below = np.cumsum(count) - count
        return (below + (count + 1) / 2)[inverse], count

    def spearman(self, weights: Sequence[float]) -> float | None:
        """Spearman's rho: the weighted Pearson r of the weighted average ranks (as :func:`spearman`)."""
        w = np.asarray(weights, dtype=float)
        total = float(w.sum())
        if total < 2:
            return None
        ra, _ = self._ranks(self.ix, len(self.ux), w)
        rb, _ = self._ranks(self.iy, len(self.uy), w)
        da, db = ra - dot(w, ra) / total, rb - dot(w, rb) / total
        sxx, syy = dot(w, da * da), dot(w, db * db)
        if sxx <= 1e-12 or syy <= 1e-12:
            return None
        return max(-1.0, min(1.0, dot(w, da * db) / math.sqrt(sxx * syy)))

    def kendall_tau_b(self, weights: Sequence[float]) -> float | None:
        """Kendall's tau-b (as :func:`kendall_tau_b`): C - D counted level by level of the side with fewer
        distinct values, with cumulative weights over the other side's sorted values."""
        w = np.asarray(weights, dtype=float)
        total = float(w.sum())
        if total < 2:
            return None
        (ia, na), (ib, nb) = (self.ix, len(self.ux)), (self.iy, len(self.uy))
        if na < nb:
            (ia, na), (ib, nb) = (ib, nb), (ia, na)  # b: the side with fewer distinct values
        if nb > self.MAX_LEVELS:
            reps = w.astype(int)
            return kendall_tau_b(np.repeat(self.x, reps), np.repeat(self.y, reps))
        pairs = total * (total - 1) / 2
        count_a = np.bincount(ia, weights=w, minlength=na)
        count_b = np.bincount(ib, weights=w, minlength=nb)
        tied_a, tied_b = dot(count_a, count_a - 1) / 2, dot(count_b, count_b - 1) / 2
        denom = math.sqrt(max(pairs - tied_a, 0.0) * max(pairs - tied_b, 0.0))
        if denom == 0:
            return None
        per_level = np.bincount(ib * na + ia, weights=w, minlength=nb * na).reshape(nb, na)
        running = np.cumsum(per_level, axis=1)
        below = running - per_level  # weight of the level's points with a smaller a
        above = per_level.sum(axis=1, keepdims=True) - running
        diff = np.cumsum(below - above, axis=0)  # summed over the levels up to each one
        s = float(np.sum(per_level[1:] * diff[:-1]))
        return s / denom


def weighted_spearman(x: Sequence[float], y: Sequence[float], weights: Sequence[float]) -> float | None:
    """Spearman's rho of the points ``(x, y)`` each repeated ``weights`` times (:class:`RankedPoints`)."""
    return RankedPoints(x, y).spearman(weights)


def weighted_kendall_tau_b(x: Sequence[float], y: Sequence[float], weights: Sequence[float]) -> float | None:
    """Kendall's tau-b of the points ``(x, y)`` each repeated ``weights`` times (:class:`RankedPoints`)."""
    return RankedPoints(x, y).kendall_tau_b(weights)
