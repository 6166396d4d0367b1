"""The benchmarks' statistics, by hand and against scipy: the Wilcoxon signed-rank test, the paired
bootstrap interval and the resamples every interval shares."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from rapo_echo.benchmarks.stats import (
    bootstrap_ci,
    paired_bootstrap_ci,
    resample_weights,
    signed_rank_null,
    wilcoxon_signed_rank,
)


def test_wilcoxon_by_hand():
    # |d| ranks 1..5; W+ = 1 + 2 + 4 + 5 = 12, W- = 3. Sign patterns (2^5 = 32) with W+ <= 3: {}, {1}, {2},
    # {3}, {1, 2}: 5, and as many with W+ >= 12 by symmetry, so p = 2 * 5/32
    assert wilcoxon_signed_rank([1, 2, -3, 4, 5]) == (3.0, pytest.approx(10 / 32))
    # one difference: W+ = 1 of {0, 1}, each 1/2: p = 1
    assert wilcoxon_signed_rank([2.5]) == (0.0, 1.0)
    # all five positive: only the all-plus pattern reaches W+ = 15, p = 2/32
    assert wilcoxon_signed_rank([1, 2, 3, 4, 5]) == (0.0, pytest.approx(2 / 32))
    # no non-zero difference: nothing to test
    assert wilcoxon_signed_rank([0, 0, 0]) == (0.0, 1.0)
    assert wilcoxon_signed_rank([]) == (0.0, 1.0)


def test_signed_rank_null_counts_by_hand():
    # ranks 1, 2, 3: sums of the 8 subsets: 0, 1, 2, 3, 3, 4, 5, 6
    assert list(signed_rank_null(3)) == [1, 1, 1, 2, 1, 1, 1]


@pytest.mark.parametrize(
    "d",
    [
        [1, 2, -3, 4, 5],  # exact, no ties
        [0.5, -1.5, 2.5, 3.5, -4.5, 6, 7, 8],
        [1, 1, 2, -2, 3, 0],  # ties and a zero, few: every sign pattern
        [1, 2, 2, 3, -1, 0, 4, 5, 6, 7, 8, 9, 10, 11, -3],  # ties, 15: the normal approximation
        list(np.random.default_rng(1).normal(0.3, 1, 60)),  # more than 50: the normal approximation
        list(np.random.default_rng(2).integers(-3, 4, 30)),  # many ties and zeros
        list(np.random.default_rng(3).normal(0, 1, 20)),  # exact, 20
    ],
)
def test_wilcoxon_matches_scipy(d):
    ours = wilcoxon_signed_rank(d)
    theirs = scipy.stats.wilcoxon(d)
    assert ours[0] == pytest.approx(float(theirs.statistic))
    assert ours[1] == pytest.approx(float(theirs.pvalue), rel=1e-9)


def test_paired_bootstrap_by_hand():
    # constant differences: every resample has the same mean
    assert paired_bootstrap_ci([0.5, 0.5, 0.5]) == pytest.approx((0.5, 0.5))
    # two cases 0 and 1: a resample's mean is 0 (1/4), 0.5 (1/2) or 1 (1/4); the 2.5 and 97.5 percentiles
    # of 1000 resamples are 0 and 1
    assert paired_bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
    assert paired_bootstrap_ci([1.0]) is None


def test_the_resamples_are_the_bootstrap_draws():
    weights = resample_weights(7, n_boot=50, seed=3)
    assert weights.shape == (50, 7) and np.all(weights.sum(axis=1) == 7)
    seen = []
    bootstrap_ci(7, lambda w: seen.append(w.copy()) or 0.0, n_boot=50, seed=3)
    assert np.array_equal(np.array(seen), weights)
    assert not np.array_equal(resample_weights(7, n_boot=50, seed=4), weights)
