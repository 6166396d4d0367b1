"""Rejection-sampling fine-tuning (RFT): an algorithm that is not part of rapo-echo, written the way a
user's own package writes one, registered by entry point and trained by
tests/unit/algorithms/test_plugin_algorithm.py (docs/extending.md walks through it).

For each context the policy samples a group of replies and the reward plugins score them; the best
valid reply of each group (at least ``rft.min_reward``, when set) is learnt by maximum likelihood under
its own context. Its rows are a kind of their own: not policy-gradient rows (no ratio, no reference, no
sampler comparison), scored at temperature 1, normalised over the mini-batch's kept tokens.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from pydantic import Field

from rapo_echo.algorithms.base import Algorithm, LossKind, MicroBatch, Needs, Rollout, Totals, TrainItem
from rapo_echo.algorithms.grpo import reward_stats, reward_validation, sample_replies
from rapo_echo.config import Strict
from rapo_echo.policy import TokenScores
from rapo_echo.types import Scenario, ValidationResult


class RftConfig(Strict):
    """RFT's own switches (the ``rft`` section of a run config)."""

    min_reward: float | None = Field(
        None, description="Keep a group's best reply only when its reward reaches this (None: always)."
    )
    coef: float = Field(1.0, gt=0.0, description="Scale of the negative log-likelihood.")


# A group's best reply, learnt under its context: its own normaliser, the model's own distribution.
BEST = LossKind("best", policy_gradient=False, temperature=1.0)


class RFT(Algorithm):
    """Rejection sampling: the best reply of each group, learnt by maximum likelihood."""

    name = "rft"
    config = RftConfig
    progress_keys = ("reward/mean", "loss/nll")
    validation_key = "val/reward"

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"rewards": [{"name": "judge", "weight": 1.0}]}

    @classmethod
    def needs(cls, cfg: Any) -> Needs:
        # Rows of its own kind, nothing else from the Learner; it learns from the reward plugins only and
        # needs a group to choose from.
        return Needs(kinds=(BEST,), rewards=True, min_group_size=2)

    def rollout(self, scenarios: list[Scenario], step: int) -> Rollout:
        samples, seconds = sample_replies(self.ctx.policy, self.cfg, scenarios)
        self.ctx.rewards.score(samples)
        best: dict[int, int] = {}
        for i, s in enumerate(samples):  # the first of the best valid replies of each group
            if not (s.valid and s.completion_ids):
                continue
            if s.group not in best or s.reward > samples[best[s.group]].reward:  # type: ignore[operator]  # valid samples only
                best[s.group] = i
        floor = self.cfg.rft.min_reward
        kept = [i for i in best.values() if floor is None or samples[i].reward >= floor]
        items = [
            TrainItem(s.prompt_ids, s.completion_ids, kind=BEST, group=s.group, sample=i)
            for i, s in ((i, samples[i]) for i in kept)
        ]
        for i in kept:
            samples[i].info["rft_kept"] = True
        metrics = reward_stats(samples, self.ctx.rewards.names)
        metrics["rft/kept"] = float(len(items))
        rewards = [float(samples[i].reward) for i in kept]  # type: ignore[arg-type]  # valid samples only
        metrics["rft/best_reward"] = statistics.fmean(rewards) if rewards else float("nan")
        return Rollout(samples, items, metrics, {"generate": seconds})

    def loss(
        self, mb: MicroBatch, out: TokenScores, totals: Totals
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = mb.kind_mask(BEST)
        nll = -(out.logp * mask).sum() / max(totals[BEST]["tokens"], 1.0)
        return self.cfg.rft.coef * nll, {"loss/nll": nll.detach()}

    def validate(self, scenarios: list[Scenario], max_new_tokens: int, turns: int = 1) -> ValidationResult:
        return reward_validation(self.ctx, scenarios, max_new_tokens)
