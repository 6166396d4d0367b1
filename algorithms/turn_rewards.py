"""Per-turn rewards for multi-turn RL without a turn-count bias (``rlver.reward: per_turn``;
docs/algorithms/rlver.md, "Per-turn rewards").

Each policy turn ``t`` of dialogue ``i`` earns ``r[i][t]`` (RLVER: the emotion change that turn caused,
/ 100, dense as in CTC-GRPO, arXiv 2606.15532). A turn's advantage is its discounted return-to-go minus
a baseline that none of the dialogue's own actions can move:

    G[i][t] = sum_{k >= t} gamma^(k - t) r[i][k]
    A[i][t] = G[i][t] - mean_{j != i, j valid in i's group} G[j][t]      (G[j][t] = 0 once j has ended)

The baseline is the leave-one-out mean of the other dialogues' returns from the same turn index, a
dialogue that has already ended counting 0 (it earns nothing more). It depends only on the other,
independently sampled dialogues, so ``E[A grad log pi] = E[G grad log pi]``: the policy gradient is
unbiased however the number of turns comes about, including when the policy's own replies decide when
the dialogue stops. The per-turn-index normalisation of MT-GRPO-style estimators, which subtracts the
mean reward of each turn index over the dialogues that reached it and sums those terms over the turns a
dialogue has left, subtracts as many baselines as the dialogue has turns: an action-dependent baseline
that adds a hidden penalty of the intermediate rewards' group mean to every decision to go on
(verl-project/verl#7244); ``tests/unit/algorithms/test_turn_rewards.py`` shows both by exact
enumeration. At ``t = 0`` with ``gamma = 1`` the advantage is the leave-one-out (RLOO) advantage of the
whole dialogue's summed reward. No standard-deviation scaling: dividing by a spread the dialogue itself
enters would break the argument (Dr. GRPO).
"""

from __future__ import annotations

from collections.abc import Sequence


def returns_to_go(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """``G[t] = r[t] + gamma G[t + 1]``, back from the last turn."""
    out = [0.0] * len(rewards)
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        acc = rewards[t] + gamma * acc
        out[t] = acc
    return out


def turn_advantages(
    rewards: Sequence[Sequence[float] | None], groups: Sequence[int], gamma: float = 1.0
) -> list[list[float]]:
    """Per dialogue, the advantage of each of its turns (module doc). ``rewards[i]`` is dialogue ``i``'s
    per-turn rewards, None for an invalid dialogue (its advantages are []; it is no one's baseline); a
    dialogue with no other valid one in its group gets 0 at every turn (no baseline, no signal)."""
    returns = [None if r is None else returns_to_go(r, gamma) for r in rewards]
    out: list[list[float]] = []
    for i, g in enumerate(returns):
        if g is None:
            out.append([])
            continue
        others = [o for j, o in enumerate(returns) if j != i and groups[j] == groups[i] and o is not None]
        if not others:
            out.append([0.0] * len(g))
            continue
        out.append(
            [g[t] - sum(o[t] if t < len(o) else 0.0 for o in others) / len(others) for t in range(len(g))]
        )
    return out
