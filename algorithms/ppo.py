"""PPO (``--algo ppo``; docs/algorithms/ppo.md): single-turn PPO with a value head and GAE over any
reward plugins.

For each context the policy samples ``rollout.group_size`` replies (one by default: the value head is
the baseline, so no group is needed); the reward plugins score each reply. Before the update, the value
head reads the state before every reply token (a no-grad forward); the reply's reward sits at its last
token, and generalised advantage estimation (``ppo.gamma``, ``ppo.lam``) gives each token an advantage
and a return, whitened over the batch's tokens (``ppo.whiten``). The loss is the clipped policy loss
with those per-token advantages -- the shared ``loss`` section's clip range, KL to the reference,
entropy bonus and aggregation -- plus ``ppo.vf_coef`` times the clipped value loss (``ppo.value_clip``).

RLVER's PPO estimator is this algorithm's multi-turn user: its rows are whole dialogues, with a reward
at each turn's end, and it uses the value pass, the estimate and the loss below.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from rapo_echo.policy import pad_left_aligned
from rapo_echo.types import Scenario

from .base import PG, MicroBatch, Needs, Rollout, Totals, TrainItem, pad_rows
from .core import aggregate, gae_advantages, masked_whiten, value_loss
from .grpo import (
    GRPO,
    advantage_stats,
    pg_items,
    pg_loss,
    policy_gradient_needs,
    reward_stats,
    sample_replies,
)
from .ppo_config import PpoConfig

if TYPE_CHECKING:
    from rapo_echo.policy import Policy, TokenScores

    from .run_sections import RunConfig

    class PpoRunConfig(RunConfig):
        """The run config :func:`.run_config.run_config_class` builds for PPO (the type checker's view)."""

        ppo: PpoConfig


# The per-token fields of a PPO row: GAE's advantages and returns, the value head's values before the update.
ADVANTAGES, OLD_VALUES, RETURNS = "token_advantages", "old_values", "returns"
VALUE_FIELDS = (ADVANTAGES, OLD_VALUES, RETURNS)


def value_needs(cfg: RunConfig, **more: Any) -> Needs:
    """What PPO needs of the Learner: a value head and the value fields (and no group: the value head is
    the baseline), over the policy-gradient core's own needs."""
    return policy_gradient_needs(cfg, value_head=True, fields=VALUE_FIELDS, min_group_size=1, **more)


@torch.no_grad()
def fill_old_values(
    policy: Policy, items: Sequence[TrainItem], micro_batch_size: int, temperature: float
) -> None:
    """The value head's values of every completion position before the update (``OLD_VALUES``)."""
    for start in range(0, len(items), micro_batch_size):
        mb = items[start : start + micro_batch_size]
        batch = policy.batch([it.prompt_ids for it in mb], [it.completion_ids for it in mb])
        values = policy.scorer(batch.to(policy.device), temperature, with_values=True).values
        for it, v in zip(mb, batch.rows(values)):
            it.fields[OLD_VALUES] = v


def estimate(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, pc: PpoConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns ``[rows, T]`` of the masked tokens from per-token ``rewards`` and the
    value head's ``values``; the advantages whitened over every masked token with ``ppo.whiten``."""
    adv, ret = gae_advantages(rewards, values, mask, gamma=pc.gamma, lam=pc.lam)
    return (masked_whiten(adv, mask) if pc.whiten else adv), ret


def set_value_fields(items: Sequence[TrainItem], adv: torch.Tensor, ret: torch.Tensor) -> None:
    """Each item's row of the estimate as its ``ADVANTAGES`` and ``RETURNS`` fields (cut to its tokens)."""
    for row, it in enumerate(items):
        n = len(it.completion_ids)
        it.fields[ADVANTAGES] = adv[row, :n].tolist()
        it.fields[RETURNS] = ret[row, :n].tolist()


def ppo_loss(
    cfg: RunConfig, pc: PpoConfig, mb: MicroBatch, out: TokenScores, totals: Totals
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped policy loss with per-token advantages (:func:`.grpo.pg_loss`) plus ``vf_coef`` times
    the clipped value loss of the value head's values, aggregated like the policy loss."""
    assert out.values is not None, "PPO's loss needs the value head's values (Needs.value_head)"
    dev = out.logp.device
    adv, old, ret = (mb.fields[k].to(dev) for k in (ADVANTAGES, OLD_VALUES, RETURNS))
    loss, metrics = pg_loss(cfg, mb, out.logp, out.entropy, totals, advantages=adv)
    lc, mask, tot = cfg.loss, mb.kind_mask(PG), totals[PG]
    per, stats = value_loss(out.values, old, ret, mask, clip=pc.value_clip)
    norm = lc.norm_constant or cfg.rollout.max_new_tokens
    vl = aggregate(per, mask, lc.agg, total_tokens=tot["tokens"], total_seqs=tot["seqs"], norm_constant=norm)
    metrics["loss/value"] = vl.detach()
    metrics["value/clip_frac"] = stats["clip_frac"].detach() * (mask.sum() / max(tot["tokens"], 1.0))
    metrics["value/mean"] = (out.values.detach() * mask).sum() / max(tot["tokens"], 1.0)
    return loss + pc.vf_coef * vl, metrics


class PPO(GRPO):
    """Single-turn PPO: sampled replies, reward plugins, a value head and GAE (GRPO's requests and
    validation)."""

    name = "ppo"
    config = PpoConfig
    cfg: PpoRunConfig

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        # GRPO's rewards; one reply per context (the value head, not a group, is the baseline).
        return {
            "rewards": [{"name": "judge", "weight": 1.0}, {"name": "format", "weight": 0.5}],
            "rollout": {"group_size": 1},
        }

    @classmethod
    def needs(cls, cfg: RunConfig) -> Needs:
        # Its only learning signal is the configured rewards.
        return value_needs(cfg, rewards=True, roles=())

    def rollout(self, scenarios: list[Scenario], step: int) -> Rollout:
        samples, t_gen = sample_replies(self.ctx.policy, self.cfg, scenarios)
        t0 = time.perf_counter()
        self.ctx.rewards.score(samples)
        t_rew = time.perf_counter() - t0
        t0 = time.perf_counter()
        items = pg_items(samples, [0.0] * len(samples))  # the valid replies; advantages come per token
        flat: list[float] = []
        if items:
            r = self.cfg.rollout
            fill_old_values(self.ctx.policy, items, self.cfg.train.micro_batch, r.temperature)
            width = max(len(it.completion_ids) for it in items)
            values = pad_rows([it.fields[OLD_VALUES] for it in items], width)
            mask = pad_left_aligned([[1.0] * len(it.completion_ids) for it in items], width)
            rewards = torch.zeros_like(values)
            for row, it in enumerate(items):  # the reply's reward at its last token
                rewards[row, len(it.completion_ids) - 1] = float(samples[it.sample].reward)  # type: ignore[arg-type]  # pg_items keeps valid ones
            adv, ret = estimate(rewards, values, mask, self.cfg.ppo)
            set_value_fields(items, adv, ret)
            flat = adv[mask != 0].tolist()
            for it in items:
                samples[it.sample].info["advantage"] = statistics.fmean(it.fields[ADVANTAGES])
        metrics = {**reward_stats(samples, self.ctx.rewards.names), **advantage_stats(flat)}
        timings = {"generate": t_gen, "rewards": t_rew, "values": time.perf_counter() - t0}
        return Rollout(samples, items, metrics, timings)

    def loss(
        self, mb: MicroBatch, out: TokenScores, totals: Totals
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return ppo_loss(self.cfg, self.cfg.ppo, mb, out, totals)
