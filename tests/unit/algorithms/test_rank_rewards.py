"""Rank -> reward functions (algorithms/rank_rewards.py) against values worked out by hand."""

from __future__ import annotations

import pytest

from rapo_echo.algorithms.rank_rewards import gopo_advantages, linear_rank_rewards, mix_emotion, rank_of_extra
from rapo_echo.llm.ranks import average_ranks


def approx(values):
    return pytest.approx(values, abs=1e-12)


# ---------------------------------------------------------------------------- average_ranks
def test_average_ranks_distinct_scores():
    # scores 0.1 0.7 0.4 -> best first: 0.7 (index 1), 0.4 (index 2), 0.1 (index 0) -> ranks [3, 1, 2]
    assert average_ranks([0.1, 0.7, 0.4]) == [3.0, 1.0, 2.0]


def test_average_ranks_exact_ties_share_the_mean_position():
    # scores 5 3 3 1: 5 -> position 1; the two 3s cover positions 2 and 3 -> (2 + 3) / 2 = 2.5; 1 -> 4
    assert average_ranks([5, 3, 3, 1]) == [1.0, 2.5, 2.5, 4.0]
    # all equal: positions 1..4 -> (1 + 4) / 2 = 2.5 each
    assert average_ranks([2, 2, 2, 2]) == [2.5, 2.5, 2.5, 2.5]


def test_average_ranks_lower_is_better():
    # ranks-as-scores 1.5 1.5 3 (lower better): the two 1.5 cover positions 1-2 -> 1.5; 3 -> 3
    assert average_ranks([1.5, 1.5, 3.0], higher_is_better=False) == [1.5, 1.5, 3.0]
    # 4 1 2 (lower better) -> 1 is best (index 1), then 2 (index 2), then 4 (index 0)
    assert average_ranks([4, 1, 2], higher_is_better=False) == [3.0, 1.0, 2.0]


def test_average_ranks_tie_eps_chains_neighbours():
    # sorted best first: 0.50 (i0), 0.49 (i2), 0.47 (i1), 0.10 (i3)
    # gaps: 0.01 < 0.025 (tie), 0.02 < 0.025 (tie), 0.37 (break) -> block {i0, i2, i1} covers positions
    # 1..3 -> rank 2 each; i3 -> 4
    assert average_ranks([0.50, 0.47, 0.49, 0.10], tie_eps=0.025) == [2.0, 2.0, 2.0, 4.0]
    # with tie_eps 0.015 only the 0.01 gap ties: {i0, i2} -> (1 + 2) / 2 = 1.5; i1 -> 3; i3 -> 4
    assert average_ranks([0.50, 0.47, 0.49, 0.10], tie_eps=0.015) == [1.5, 3.0, 1.5, 4.0]


def test_average_ranks_without_chaining_ties_only_near_the_leader():
    # sorted 0.50, 0.49, 0.47, 0.45, 0.10 with tie_eps 0.025: chained, every gap (0.01, 0.02, 0.02) is
    # small, so 0.50..0.45 form one block of positions 1-4 -> 2.5 each (a block spanning 0.05).
    scores = [0.50, 0.47, 0.49, 0.45, 0.10]
    assert average_ranks(scores, tie_eps=0.025) == [2.5, 2.5, 2.5, 2.5, 5.0]
    # not chained: the leader 0.50 takes 0.49 (0.01 < 0.025) but not 0.47 (0.03) -> positions 1-2: 1.5;
    # 0.47 leads the next block and takes 0.45 (0.02) -> positions 3-4: 3.5; 0.10 -> 5
    assert average_ranks(scores, tie_eps=0.025, chain=False) == [1.5, 3.5, 1.5, 3.5, 5.0]
    assert average_ranks([3, 3, 1], chain=False) == [1.5, 1.5, 3.0]  # exact ties still tie


def test_average_ranks_edge_cases_and_errors():
    assert average_ranks([]) == []
    assert average_ranks([0.3]) == [1.0]
    with pytest.raises(ValueError, match="NaN"):
        average_ranks([0.1, float("nan")])
    with pytest.raises(ValueError, match="tie_eps"):
        average_ranks([0.1], tie_eps=-1)


# ---------------------------------------------------------------------------- linear / GOPO
def test_linear_rank_rewards_with_ties():
    # G = 4: (4 - 1)/3 = 1, (4 - 2.5)/3 = 0.5, 0.5, (4 - 4)/3 = 0
    assert linear_rank_rewards([1, 2.5, 2.5, 4]) == approx([1.0, 0.5, 0.5, 0.0])
    # G = 3, ranks [2, 1, 3]: (3 - 2)/2 = 0.5, (3 - 1)/2 = 1, 0
    assert linear_rank_rewards([2, 1, 3]) == approx([0.5, 1.0, 0.0])
    assert linear_rank_rewards([1]) == [1.0]


def test_gopo_advantages_with_ties():
    # G = 4: 2 - 4*0/3 = 2, 2 - 4*1.5/3 = 0, 0, 2 - 4*3/3 = -2 (sum 0)
    assert gopo_advantages([1, 2.5, 2.5, 4]) == approx([2.0, 0.0, 0.0, -2.0])
    # G = 5, ranks 1..5: 2, 2 - 4/4 = 1, 0, -1, -2
    assert gopo_advantages([3, 1, 5, 2, 4]) == approx([0.0, 2.0, -2.0, 1.0, -1.0])
    assert gopo_advantages([1]) == [0.0]


@pytest.mark.parametrize("fn", [linear_rank_rewards, gopo_advantages])
def test_rank_functions_reject_bad_ranks(fn):
    with pytest.raises(ValueError, match="ranks"):
        fn([])
    with pytest.raises(ValueError, match=r"\[1, 3\]"):
        fn([1, 2, 4])  # rank 4 in a group of 3
    with pytest.raises(ValueError, match=r"\[1, 2\]"):
        fn([0, 1])


# ---------------------------------------------------------------------------- emotion mix
def test_mix_emotion_by_hand():
    # mix 0.25, scale 10:
    #   r = 1,   delta = +10 -> 0.75*1   + 0.25*(1 + 1)/2   = 0.75 + 0.25   = 1.0
    #   r = 0.5, delta = -4  -> 0.75*0.5 + 0.25*(-0.4+1)/2  = 0.375 + 0.075 = 0.45
    #   r = 0,   delta = 0   -> 0        + 0.25*0.5         = 0.125
    out = mix_emotion([1.0, 0.5, 0.0], [10.0, -4.0, 0.0], mix=0.25, scale=10.0)
    assert out == approx([1.0, 0.45, 0.125])


def test_mix_emotion_none_delta():
    # mix > 0: a missing delta makes the reward invalid (None), never a silent 0;
    # delta 2 on scale 4 -> (2/4 + 1)/2 = 0.75 -> 0.5*0.5 + 0.5*0.75 = 0.625
    out = mix_emotion([1.0, 0.5], [None, 2.0], mix=0.5, scale=4.0)
    assert out[0] is None
    assert out[1] == pytest.approx(0.625, abs=1e-12)
    # mix == 0: the rank reward passes through whatever the delta is
    assert mix_emotion([1.0, 0.5], [None, 2.0], mix=0.0, scale=4.0) == [1.0, 0.5]


def test_mix_emotion_errors():
    with pytest.raises(ValueError, match="mix"):
        mix_emotion([1.0], [0.0], mix=1.5, scale=10)
    with pytest.raises(ValueError, match="scale"):
        mix_emotion([1.0], [0.0], mix=0.5, scale=0)
    with pytest.raises(ValueError, match="2 rank rewards but 1"):
        mix_emotion([1.0, 0.0], [0.0], mix=0.5, scale=10)
    with pytest.raises(ValueError, match="delta 1 is 12"):
        mix_emotion([1.0, 0.0], [0.0, 12.0], mix=0.5, scale=10)


# ---------------------------------------------------------------------------- verification helper
def test_rank_of_extra():
    # group of 3 + a correction at index 3; ranks [2, 4, 3, 1]: correction (1) minus original 1 (4) = -3
    assert rank_of_extra([2, 4, 3, 1], extra=3, original=1) == -3.0
    # tie: 2.5 - 2.5 = 0
    assert rank_of_extra([1, 2.5, 2.5], extra=2, original=1) == 0.0
    with pytest.raises(IndexError, match="extra index 5"):
        rank_of_extra([1, 2], extra=5, original=0)
