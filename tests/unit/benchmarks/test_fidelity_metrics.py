"""The fidelity benchmark's statistics, worked by hand: the rank correlations (scipy.stats) against hand
values and an all-pairs count, and Spearman's rho against Pearson's r of the average ranks."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rapo_echo.benchmarks.fidelity.predictors import Baseline, question_share
from rapo_echo.benchmarks.fidelity.stats import (
    ascending_ranks,
    kendall_tau_b,
    pair_counts,
    pairwise_agreement,
    spearman,
    weighted_kendall_tau_b,
    weighted_spearman,
)
from rapo_echo.benchmarks.stats import bootstrap_ci

RATINGS = [1, 2, 3, 4, 5, 3, 2]


def test_a_prediction_equal_to_the_rating_agrees_perfectly():
    assert spearman(RATINGS, RATINGS) == pytest.approx(1.0)
    assert kendall_tau_b(RATINGS, RATINGS) == pytest.approx(1.0)
    assert pairwise_agreement([(RATINGS, RATINGS)]) == 1.0


def test_a_reversed_prediction_disagrees_perfectly():
    reversed_ = [-r for r in RATINGS]
    assert spearman(reversed_, RATINGS) == pytest.approx(-1.0)
    assert kendall_tau_b(reversed_, RATINGS) == pytest.approx(-1.0)
    assert pairwise_agreement([(reversed_, RATINGS)]) == 0.0


def test_ties_share_their_average_rank():
    assert ascending_ranks([10, 20, 20, 30]) == [1.0, 2.5, 2.5, 4.0]
    assert ascending_ranks([5, 5, 5]) == [2.0, 2.0, 2.0]


def test_spearman_with_ties_worked_by_hand():
    # ranks x: 1, 2.5, 2.5, 4; y: 1.5, 1.5, 3, 4; centred products sum to 3.75, both squares to 4.5
    assert spearman([1, 2, 2, 3], [1, 1, 2, 3]) == pytest.approx(3.75 / 4.5)


def test_kendall_tau_b_with_ties_worked_by_hand():
    # 6 pairs: 4 concordant, 0 discordant, 1 tied in x, 1 tied in y -> 4 / sqrt(5 * 5)
    assert kendall_tau_b([1, 2, 2, 3], [1, 1, 2, 3]) == pytest.approx(0.8)
    # pairs (0,1) concordant, (0,2) and (1,2) discordant; no ties -> (1 - 2) / 3
    assert kendall_tau_b([1, 2, 3], [2, 3, 1]) == pytest.approx(-1 / 3)


def tied_samples(seed: int, count: int, longest: int, tie: float):
    """``count`` random pairs of series of 2 to ``longest`` points: x on a 1-5 scale, y often ``tie``."""
    rng = random.Random(seed)
    for _ in range(count):
        n = rng.randint(2, longest)
        yield [rng.randint(1, 5) for _ in range(n)], [rng.choice([rng.random(), tie]) for _ in range(n)]


def test_kendall_tau_b_level_counting_matches_all_pairs():
    for x, y in tied_samples(3, 100, 25, 0.5):
        n = len(x)
        c = d = tx = ty = 0
        for i in range(n):
            for j in range(i + 1, n):
                s = (x[i] - x[j]) * (y[i] - y[j])
                c, d = c + (s > 0), d + (s < 0)
                tx, ty = tx + (x[i] == x[j]), ty + (y[i] == y[j])
        pairs = n * (n - 1) // 2
        denom = ((pairs - tx) * (pairs - ty)) ** 0.5
        expected = None if denom == 0 else (c - d) / denom
        got = kendall_tau_b(x, y)
        assert (got is None and expected is None) or got == pytest.approx(expected)


def test_undefined_statistics_are_none_not_zero():
    assert spearman([2, 2, 2], [1, 2, 3]) is None
    assert kendall_tau_b([2, 2, 2], [1, 2, 3]) is None
    assert spearman([1], [1]) is None
    assert pairwise_agreement([([1, 2], [3, 3])]) is None  # equal ratings make no pair


def test_pairwise_agreement_counts_a_predicted_tie_as_half():
    # pairs (0,1): prediction ties -> 0.5; (0,2) and (1,2): same order -> 1 each
    assert pair_counts([1, 1, 2], [1, 2, 3]) == (2.5, 3)
    assert pairwise_agreement([([7, 7, 7], [1, 2, 3])]) == 0.5


def test_pairwise_agreement_pools_pairs_within_dialogues_only():
    # each seeker's own scale cancels: dialogue A rates high, B low, both ordered right
    a = ([0.1, 0.2], [4, 5])
    b = ([0.9, 1.0], [1, 2])
    assert pairwise_agreement([a, b]) == 1.0
    assert spearman([0.1, 0.2, 0.9, 1.0], [4, 5, 1, 2]) < 0  # across dialogues it looks reversed


def test_bootstrap_is_seeded_and_reproducible():
    rng = random.Random(0)
    groups = [[rng.random() for _ in range(5)] for _ in range(30)]
    sums = np.array([sum(g) for g in groups])

    def stat(weights):  # the mean of the points of the drawn groups, each group as often as drawn
        return float(weights @ sums) / (5 * float(weights.sum()))

    first = bootstrap_ci(30, stat, n_boot=200, seed=7)
    assert first == bootstrap_ci(30, stat, n_boot=200, seed=7)
    assert first != bootstrap_ci(30, stat, n_boot=200, seed=8)
    lo, hi = first
    assert lo < stat(np.ones(30)) < hi
    assert bootstrap_ci(1, stat) == (None, None)
    # a weight vector is the resample of whole groups: rebuilding each resample from its drawn indices
    # (the slow way) gives the same interval
    draw = np.random.default_rng(7)
    slow = []
    for _ in range(200):
        values = [v for k in draw.integers(0, 30, size=30) for v in groups[k]]
        slow.append(sum(values) / len(values))
    assert first == pytest.approx(tuple(np.percentile(slow, [2.5, 97.5])))


def test_weighted_statistics_equal_the_plain_ones_on_repeated_points():
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(1, 12)
        x = [rng.choice([rng.random(), 0.5, 0.25]) for _ in range(n)]
        y = [rng.randint(1, 5) for _ in range(n)]
        w = [rng.randint(0, 3) for _ in range(n)]
        ex = [v for v, k in zip(x, w) for _ in range(k)]
        ey = [v for v, k in zip(y, w) for _ in range(k)]
        for weighted, plain in ((weighted_spearman, spearman), (weighted_kendall_tau_b, kendall_tau_b)):
            got, expected = weighted(x, y, w), plain(ex, ey)
            assert (got is None) == (expected is None), (x, y, w)
            if got is not None:
                assert got == pytest.approx(expected)


def test_baselines_are_reproducible_and_as_defined():
    assert question_share("How are you? I am here. Really?") == pytest.approx(2 / 3)
    assert question_share("") == 0.0
    from rapo_echo.benchmarks.fidelity.points import Item
    from rapo_echo.types import Scenario

    items = [Item(Scenario(f"s{i}", []), "Are you ok? Tell me more.", "") for i in range(3)]
    first = [p.value for p in Baseline("random", seed=1).predict(items)]
    assert first == [p.value for p in Baseline("random", seed=1).predict(items)]
    assert first != [p.value for p in Baseline("random", seed=2).predict(items)]
    assert [p.value for p in Baseline("length").predict(items)] == [6.0] * 3
    assert [p.value for p in Baseline("questions").predict(items)] == [0.5] * 3


def test_spearman_is_pearson_of_the_average_ranks():
    from rapo_echo.benchmarks.fidelity.stats import pearson

    for x, y in tied_samples(5, 50, 40, 0.25):
        expected = pearson(ascending_ranks(x), ascending_ranks(y))
        assert (spearman(x, y) is None) == (expected is None)
        if expected is not None:
            assert spearman(x, y) == pytest.approx(expected, abs=1e-12)
