"""Reward plugins used by the tests, loaded by dotted path like a user's own module would be."""

from __future__ import annotations

from typing import ClassVar

from rapo_echo.rewards import RewardOutput


def every_other_invalid(prompts, completions, **columns):
    """TRL-style function: scores alternate between 1.0 and None (invalid)."""
    return [1.0 if i % 2 == 0 else None for i in range(len(completions))]


def words(prompts, completions, completion_ids, profile, **columns):
    """TRL-style function: number of words of the reply; checks the columns it is given."""
    assert len(completion_ids) == len(completions) == len(profile)
    return [float(len(c[0]["content"].split())) for c in completions]


class Critic:
    """Class plugin using the run context: scores 1 and writes a critique."""

    is_reward_plugin = True

    def __init__(self, ctx, bonus: float = 0.0) -> None:
        self.ctx = ctx
        self.bonus = bonus

    def __call__(self, samples):
        return [RewardOutput(1.0 + self.bonus, critique=f"critique of {s.scenario.id}") for s in samples]


def never_valid(prompts, completions, **columns):
    """TRL-style function of a judge that never scores: every sample invalid."""
    return [None for _ in completions]


class NeedsKey:
    """Class plugin that reads its API key from the environment variable named by ``key_env`` (a
    config holds the name, never the key); records each key it was built with."""

    is_reward_plugin = True
    seen: ClassVar[list[str]] = []

    def __init__(self, key_env: str) -> None:
        import os

        self.key = os.environ.get(key_env, "")
        NeedsKey.seen.append(self.key)

    def __call__(self, samples):
        return [float(len(s.completion_ids) % 2) for s in samples]


def length_or_none_on_rank_one(prompts, completions, **columns):
    """TRL-style function: reply length in words, but None (invalid) for every sample of the process
    with RANK 1, so that rank has nothing to train on (the DDP test of
    tests/integration/test_training_math.py)."""
    import os

    if os.environ.get("RANK") == "1":
        return [None] * len(completions)
    return [float(len(c[0]["content"].split())) for c in completions]
