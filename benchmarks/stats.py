"""The statistics of benchmark figures: percentile bootstrap intervals that resample groups (cases, or
the fidelity benchmark's dialogues) and the paired tests of two runs on the same cases.

A resample is a weight vector over the groups (how many times each was drawn; all ones is the sample
itself), seeded, so the same seed gives the same intervals; a statistic that is a weighted mean over
groups is then a matrix product over all resamples at once."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from rapo_echo.llm.ranks import average_ranks

N_BOOT = 1000  # resamples of a figure's interval
LEVEL = 0.95
EXACT_UP_TO = 50  # Wilcoxon: the exact null distribution up to this many differences (scipy's rule)
ENUMERATE_UP_TO = 13  # Wilcoxon with ties or zeros: every sign pattern up to this many (scipy's rule)


def resample_draws(n_groups: int, n_boot: int, seed: int) -> Iterator[np.ndarray]:
    """``n_boot`` resamples of the groups ``0..n_groups-1`` drawn with replacement, each as its weight
    vector (float counts), from ``numpy.random.default_rng(seed)`` one resample after the other."""
    rng = np.random.default_rng(seed)
    for _ in range(n_boot):
        yield np.bincount(rng.integers(0, n_groups, size=n_groups), minlength=n_groups).astype(float)


def resample_weights(n_groups: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """The resamples of :func:`resample_draws` as one ``(n_boot, n_groups)`` matrix."""
    return np.array(list(resample_draws(n_groups, n_boot, seed))).reshape(n_boot, n_groups)


def percentile_interval(
    values: Sequence[float], n_boot: int, level: float = LEVEL
) -> tuple[float, float] | None:
    """The percentile interval of the finite ``values`` of ``n_boot`` resamples; None when fewer than half
    of the resamples gave one."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if n_boot < 1 or len(finite) < n_boot / 2:
        return None
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return float(lo), float(hi)


def bootstrap_ci(
    n_groups: int,
    statistic: Callable[[np.ndarray], float | None],
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = LEVEL,
) -> tuple[float | None, float | None]:
    """Percentile interval of ``statistic`` over ``n_boot`` resamples of the groups ``0..n_groups-1``
    drawn with replacement (seeded: the same seed gives the same interval). ``statistic`` takes a resample
    as the weight vector of the groups (how many times each was drawn; all ones is the sample itself).
    Resamples where the statistic is undefined are left out; None when fewer than half of them are
    defined, or for fewer than two groups."""
    if n_groups < 2 or n_boot < 1:
        return None, None
    values = [statistic(w) for w in resample_draws(n_groups, n_boot, seed)]
    interval = percentile_interval([v for v in values if v is not None], n_boot, level)
    return interval if interval is not None else (None, None)


def paired_bootstrap_ci(
    differences: Sequence[float], *, n_boot: int = N_BOOT, seed: int = 0, level: float = LEVEL
) -> tuple[float, float] | None:
    """Percentile interval of the mean of per-case paired differences (``b - a`` of each case), the cases
    resampled with replacement; None for fewer than two cases."""
    d = np.asarray(differences, dtype=float)
    if len(d) < 2:
        return None
    weights = resample_weights(len(d), n_boot, seed)
    return percentile_interval(list(weights @ d / weights.sum(axis=1)), n_boot, level)


def signed_rank_null(n: int) -> np.ndarray:
    """How many of the ``2**n`` sign patterns of the ranks ``1..n`` give each rank sum ``0..n(n+1)/2``."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1
    for k in range(1, n + 1):
        counts[k:] = counts[k:] + counts[:-k].copy()
    return counts


def wilcoxon_signed_rank(differences: Sequence[float]) -> tuple[float, float]:
    """``(statistic, p)`` of the two-sided Wilcoxon signed-rank test of paired differences, as
    ``scipy.stats.wilcoxon`` gives them by default: the statistic is the smaller of the positive and the
    negative rank sum over the non-zero differences (zeros dropped, ties sharing their average rank); p
    comes from the exact null distribution for at most :data:`EXACT_UP_TO` differences with no ties or
    zeros, from all ``2**m`` sign patterns of the ``m`` non-zero ranks for at most :data:`ENUMERATE_UP_TO`
    differences with ties or zeros, and otherwise from the normal approximation
    ``z = (W+ - m(m+1)/4) / sqrt(m(m+1)(2m+1)/24 - sum(t^3 - t)/48)`` (tie groups of size ``t``, no
    continuity correction). No non-zero difference: statistic 0 and p 1."""
    total = len(differences)
    d = np.asarray([x for x in differences if x != 0], dtype=float)
    m = len(d)
    if m == 0:
        return 0.0, 1.0
    ranks = np.asarray(average_ranks(np.abs(d), higher_is_better=False))
    w_plus = float(ranks[d > 0].sum())
    statistic = min(w_plus, float(ranks.sum()) - w_plus)
    _, ties = np.unique(np.abs(d), return_counts=True)
    exact = total <= EXACT_UP_TO and m == total and bool(np.all(ties == 1))
    if exact:
        counts = signed_rank_null(m)
        k = round(w_plus)
        low, high = counts[: k + 1].sum() / counts.sum(), counts[k:].sum() / counts.sum()
        return statistic, float(min(1.0, 2 * min(low, high)))
    if total <= ENUMERATE_UP_TO:
        signs = (np.arange(2**m)[:, None] >> np.arange(m)) & 1  # every sign pattern of the m ranks
        null = signs @ ranks
        tol = 1e-9 * max(1.0, abs(w_plus))
        low, high = np.mean(null <= w_plus + tol), np.mean(null >= w_plus - tol)
        return statistic, float(min(1.0, 2 * min(low, high)))
    var = m * (m + 1) * (2 * m + 1) / 24 - float(np.sum(ties**3 - ties)) / 48
    if var <= 0:
        return statistic, 1.0
    z = (w_plus - m * (m + 1) / 4) / math.sqrt(var)
    return statistic, float(math.erfc(abs(z) / math.sqrt(2)))
