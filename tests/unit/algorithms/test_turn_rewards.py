"""Per-turn rewards without a turn-count bias (algorithms/turn_rewards.py): returns and leave-one-out
baselines by hand, then the bias test where the policy controls when to stop. A one-parameter policy
goes on to another turn with probability p = sigmoid(theta) and earns a reward at every turn it takes;
over every group of dialogues (exact enumeration, no sampling), the expected policy gradient of our
advantages equals the true gradient of the expected return, while per-turn-index normalisation
(MT-GRPO style, verl-project/verl#7244) misses it: it charges every decision to go on the turn's group
mean reward."""

from __future__ import annotations

import itertools
import math

import pytest

from rapo_echo.algorithms.turn_rewards import returns_to_go, turn_advantages


def test_returns_to_go_by_hand() -> None:
    assert returns_to_go([1.0, 2.0, 3.0]) == [6.0, 5.0, 3.0]
    assert returns_to_go([1.0, 2.0, 3.0], gamma=0.5) == [1.0 + 0.5 * 2.0 + 0.25 * 3.0, 2.0 + 1.5, 3.0]
    assert returns_to_go([]) == []


def test_leave_one_out_baselines_by_hand() -> None:
    # group 0: returns-to-go [3, 2, 1] (three turns), [5] (one turn), [2, 2] (two); group 1 alone
    rewards = [[1.0, 1.0, 1.0], [5.0], [0.0, 2.0], [4.0], None]
    adv = turn_advantages(rewards, [0, 0, 0, 1, 0])
    # dialogue 0: t0 3 - (5 + 2)/2 = -0.5; t1 2 - (0 + 2)/2 = 1 (dialogue 1 ended: 0); t2 1 - 0 = 1
    assert adv[0] == pytest.approx([-0.5, 1.0, 1.0])
    assert adv[1] == pytest.approx([5 - (3 + 2) / 2])
    assert adv[2] == pytest.approx([2 - (3 + 5) / 2, 2 - (2 + 0) / 2])
    assert adv[3] == [0.0] and adv[4] == []  # alone in its group: no signal; invalid: nothing


def per_turn_index_advantages(rewards: list[list[float]]) -> list[list[float]]:
    """The biased construction: subtract the mean reward of each turn index over the group's dialogues that
    reached it, then sum those over the turns the dialogue has left."""
    turns = max(len(r) for r in rewards)
    means = []
    for k in range(turns):
        reached = [r[k] for r in rewards if len(r) > k]
        means.append(sum(reached) / len(reached))
    return [[sum(r[k] - means[k] for k in range(t, len(r))) for t in range(len(r))] for r in rewards]


def expected_gradient(p: float, max_turns: int, group: int, estimator, reward=lambda t: 1.0) -> float:
    """E[sum_t A[t] d/dtheta log pi(a_t)] per dialogue, exactly: every dialogue length T in 1..max_turns
    (T - 1 decisions to go on, then a stop unless the turn limit ended it) for every group member."""
    lengths = range(1, max_turns + 1)

    def prob(n: int) -> float:
        return p ** (n - 1) * ((1 - p) if n < max_turns else 1.0)

    def score(n: int, t: int) -> float:  # d/dtheta log pi of turn t's decision, p = sigmoid(theta)
        if t < n - 1:
            return 1 - p  # went on
        return -p if n < max_turns else 0.0  # stopped; at the limit there was no decision

    total = 0.0
    for combo in itertools.product(lengths, repeat=group):
        weight = math.prod(prob(n) for n in combo)
        rewards = [[reward(t) for t in range(n)] for n in combo]
        adv = estimator(rewards)
        total += weight * sum(a * score(combo[0], t) for t, a in enumerate(adv[0]))
    return total


def true_gradient(p: float, max_turns: int, reward=lambda t: 1.0) -> float:
    """d/dtheta of E[sum of rewards] = sum_t r(t) p^t, with dp/dtheta = p (1 - p)."""
    return sum(reward(t) * t * p ** (t - 1) * p * (1 - p) for t in range(1, max_turns))


def ours(rewards: list[list[float]]) -> list[list[float]]:
    return turn_advantages(rewards, [0] * len(rewards))


@pytest.mark.parametrize(("p", "max_turns", "group"), [(0.5, 3, 2), (0.3, 4, 3), (0.8, 3, 4)])
def test_our_advantages_are_unbiased_when_the_policy_decides_when_to_stop(p, max_turns, group) -> None:
    grad = true_gradient(p, max_turns)
    assert grad > 0  # every extra turn earns a reward: going on should be reinforced
    assert expected_gradient(p, max_turns, group, ours) == pytest.approx(grad, abs=1e-12)
    # and with rewards that change from turn to turn
    varying = lambda t: [0.5, -0.2, 1.5, 0.7][t]  # noqa: E731
    assert expected_gradient(p, max_turns, group, ours, varying) == pytest.approx(
        true_gradient(p, max_turns, varying), abs=1e-12
    )


@pytest.mark.parametrize(("p", "max_turns", "group"), [(0.5, 3, 2), (0.3, 4, 3), (0.8, 3, 4)])
def test_per_turn_index_normalisation_is_biased_by_the_turn_count(p, max_turns, group) -> None:
    # with the same reward at every turn, every per-index mean equals it: the advantages are all 0, and the
    # gain of going on (true gradient > 0) is charged away in full
    assert expected_gradient(p, max_turns, group, per_turn_index_advantages) == pytest.approx(0.0, abs=1e-12)
    assert true_gradient(p, max_turns) > 0.05
    shifted = lambda t: 2.0 + [0.5, -0.2, 1.5, 0.7][t]  # noqa: E731
    biased = expected_gradient(p, max_turns, group, per_turn_index_advantages, shifted)
    assert abs(biased - true_gradient(p, max_turns, shifted)) > 0.05
