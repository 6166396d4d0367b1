"""Reward plugins used by the tests, loaded by dotted path like a user's own module would be."""

from __future__ import annotations

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

    def __init__(self, ctx, bonus: float = 0.0) -> None:
        self.ctx = ctx
        self.bonus = bonus

    def __call__(self, samples):
        return [RewardOutput(1.0 + self.bonus, critique=f"critique of {s.scenario.id}") for s in samples]


def length_or_none_on_rank_one(prompts, completions, **columns):
    """TRL-style function: reply length in words, but None (invalid) for every sample of the process
    with RANK 1, so that rank has nothing to train on (the DDP test of tests/test_training_math.py)."""
    import os

    if os.environ.get("RANK") == "1":
        return [None] * len(completions)
    return [float(len(c[0]["content"].split())) for c in completions]
