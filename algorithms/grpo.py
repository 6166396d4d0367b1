"""GRPO: a group of replies per context, scored by the reward plugins, group-relative advantages, the
clipped policy loss with a KL to the reference.

Echo-N1's dual generative reward models run as ``--algo grpo`` with their reward plugin. The pieces
other algorithms reuse are functions here: sampling a group (:func:`sample_replies`), the group
advantages (:func:`group_advantages`), the GRPO objective (:func:`pg_loss`), greedy replies and their
reward-plugin validation, and the rollout metrics."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from rapo_echo.types import Sample, SamplingParams, Scenario, ValidationResult
from rapo_echo.variety import distinct_n

from .base import PG, AlgoContext, Algorithm, MicroBatch, Needs, RoleRequest, Rollout, Totals, TrainItem
from .core import aggregate
from .registries import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES

if TYPE_CHECKING:
    from rapo_echo.policy import Policy, TokenScores

    from .run_sections import RunConfig


# ---------------------------------------------------------------------------- sampling


def sampling_params(cfg: RunConfig) -> SamplingParams:
    """The rollout's sampling settings, ``rollout.group_size`` replies per prompt."""
    r = cfg.rollout
    return SamplingParams(
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        n=r.group_size,
    )


def sample_replies(policy: Policy, cfg: RunConfig, scenarios: list[Scenario]) -> tuple[list[Sample], float]:
    """``rollout.group_size`` replies per scenario in one batched engine call; returns samples and seconds.

    With ``rollout.greedy_member`` the first reply of each group is decoded greedily (a second call)
    and the other ``group_size - 1`` are sampled; the greedy reply keeps no sampler log-probs (they are
    not the rollout temperature's), so the Learner scores it itself."""
    t0 = time.perf_counter()
    prompt_ids = [policy.prompt_ids(s) for s in scenarios]
    params = sampling_params(cfg)
    greedy = cfg.rollout.greedy_member
    if greedy:
        params = dataclasses.replace(params, n=params.n - 1)
    gens = policy.generator.generate_ids(prompt_ids, params)
    if greedy:
        greedy_params = dataclasses.replace(params, n=1, temperature=0.0)
        firsts = policy.generator.generate_ids(prompt_ids, greedy_params)
        gens = [[dataclasses.replace(g[0], logprobs=None), *rest] for g, rest in zip(firsts, gens)]
    samples = [
        Sample(
            scenario=sc,
            group=gi,
            prompt_ids=g.prompt_ids or p,
            completion_ids=g.token_ids,
            logprobs=g.logprobs,
            text=g.text,
            finish_reason=g.finish_reason,
            info={"greedy": True} if greedy and k == 0 else {},
        )
        for gi, (sc, p, group) in enumerate(zip(scenarios, prompt_ids, gens))
        for k, g in enumerate(group)
    ]
    return samples, time.perf_counter() - t0


def greedy_replies(policy: Policy, scenarios: list[Scenario], max_new_tokens: int) -> list[Sample]:
    """One greedy reply per scenario, as the policy is used after training."""
    prompt_ids = [policy.prompt_ids(s) for s in scenarios]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, n=1)
    gens = policy.generator.generate_ids(prompt_ids, params)
    return [
        Sample(
            scenario=sc,
            group=i,
            prompt_ids=g[0].prompt_ids or p,
            completion_ids=g[0].token_ids,
            logprobs=None,
            text=g[0].text,
            finish_reason=g[0].finish_reason,
        )
        for i, (sc, p, g) in enumerate(zip(scenarios, prompt_ids, gens))
    ]


def pg_items(samples: list[Sample], advantages: list[float]) -> list[TrainItem]:
    """Training items of the valid samples with at least one token (invalid ones are masked out); each
    sample's advantage is also kept in its ``info`` (``samples.jsonl``)."""
    for s, a in zip(samples, advantages):
        s.info["advantage"] = a
    return [
        TrainItem(s.prompt_ids, s.completion_ids, a, group=s.group, sample=i, sampler_logprobs=s.logprobs)
        for i, (s, a) in enumerate(zip(samples, advantages))
        if s.valid and s.completion_ids
    ]


# ---------------------------------------------------------------------------- the GRPO objective


def group_advantages(cfg: RunConfig, rewards: Sequence[float | None], groups: Sequence[int]) -> list[float]:
    """Advantages from ``loss.advantage`` over each group's valid rewards; invalid (None) rewards get 0."""
    valid = torch.tensor([r is not None for r in rewards])
    r = torch.tensor([0.0 if v is None else float(v) for v in rewards], dtype=torch.float64)
    g = torch.tensor(list(groups), dtype=torch.long)
    est = ADVANTAGE_ESTIMATORS.get(cfg.loss.advantage, "loss.advantage")
    return est(r, g, valid, eps=cfg.loss.std_eps).tolist()


def pg_loss(
    cfg: RunConfig,
    mb: MicroBatch,
    logp: torch.Tensor,
    entropy: torch.Tensor,
    totals: Totals,
    advantages: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO objective over the ``pg`` rows: the clipped policy loss (``loss.policy_loss``) + beta *
    KL to the reference - the entropy bonus, aggregated (``loss.agg``) with the mini-batch totals so
    micro-batch losses add up exactly. ``advantages`` replaces the rows' own ([rows] or per token
    [rows, n_targets], as PPO's)."""
    lc = cfg.loss
    mask = mb.kind_mask(PG)
    tot = totals[PG]
    metrics: dict[str, torch.Tensor] = {}
    if tot["seqs"] == 0:
        return logp.sum() * 0.0, metrics
    norm = lc.norm_constant or cfg.rollout.max_new_tokens

    def agg(x: torch.Tensor) -> torch.Tensor:
        return aggregate(
            x, mask, lc.agg, total_tokens=tot["tokens"], total_seqs=tot["seqs"], norm_constant=norm
        )

    eps = {k: v for k, v in (("eps_low", lc.eps_low), ("eps_high", lc.eps_high)) if v is not None}
    adv = mb.advantages if advantages is None else advantages
    policy_loss = POLICY_LOSSES.get(lc.policy_loss, "loss.policy_loss")
    pg_tok, stats = policy_loss(logp, mb.old_logp, adv, mask, **eps)
    per = pg_tok
    metrics["loss/pg"] = agg(pg_tok).detach()
    share = mask.sum() / tot["tokens"]
    metrics["clip_frac"] = stats["clip_frac"].detach() * share
    if mb.ref_logp is not None:  # kept for the KL term, or for the monitor alone (monitor.reference_kl)
        kl = KL_ESTIMATORS.get(lc.kl_estimator, "loss.kl_estimator")(logp, mb.ref_logp, mask=mask)
        metrics["kl"] = (kl * mask).sum().detach() / tot["tokens"]
        if lc.beta > 0:
            per = per + lc.beta * kl
            metrics["loss/kl"] = lc.beta * agg(kl).detach()
    if lc.entropy_coef > 0:
        per = per - lc.entropy_coef * entropy
    metrics["entropy"] = (entropy.detach() * mask).sum() / tot["tokens"]
    loss = agg(per)
    metrics["loss/grpo"] = loss.detach()
    return loss, metrics


def policy_gradient_needs(cfg: RunConfig, **more: Any) -> Needs:
    """The Needs of a policy-gradient algorithm on the ``loss`` section: a reference when the KL term is on
    (or the monitor watches the KL, ``monitor.reference_kl``), an entropy gradient when its bonus is;
    ``more`` adds to them."""
    reference = cfg.loss.beta > 0 or cfg.monitor.reference_kl
    return Needs(reference=reference, entropy_grad=cfg.loss.entropy_coef > 0, **more)


# ---------------------------------------------------------------------------- metrics and validation


def reward_stats(samples: list[Sample], names: list[str]) -> dict[str, float]:
    """Mean/std of the combined reward and of each named reward over valid samples, plus counts."""
    out: dict[str, float] = {}
    valid = [s.reward for s in samples if s.reward is not None]
    out["reward/mean"] = statistics.fmean(valid) if valid else float("nan")
    out["reward/std"] = statistics.pstdev(valid) if len(valid) > 1 else 0.0
    for name in names:
        vals = [v for s in samples if (v := s.rewards.get(name)) is not None]
        out[f"reward/{name}/mean"] = statistics.fmean(vals) if vals else float("nan")
        out[f"reward/{name}/std"] = statistics.pstdev(vals) if len(vals) > 1 else 0.0
        out.update(route_shares(samples, name))
    out["invalid"] = float(sum(1 for s in samples if s.reward is None))
    lengths = [len(s.completion_ids) for s in samples]
    out["reply_len/mean"] = statistics.fmean(lengths) if lengths else 0.0
    out["truncated"] = float(sum(1 for s in samples if s.finish_reason == "length"))
    out.update(reply_variety(samples))
    return out


def reply_variety(samples: list[Sample]) -> dict[str, float]:
    """How varied the step's replies are (the monitor's ``replies_converge``): ``reply/distinct_2``, the
    Distinct-2 of all replies together (:func:`rapo_echo.variety.distinct_n`), and ``reply/top_share``, the
    mean over groups of the share of a group's replies that are its most frequent (whitespace-normalised)
    text: 1/G when all differ, 1 when the group says one thing."""
    if not samples:
        return {}
    groups: dict[int, list[str]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(" ".join(s.text.split()))
    shares = [Counter(texts).most_common(1)[0][1] / len(texts) for texts in groups.values()]
    return {
        "reply/distinct_2": distinct_n([s.text for s in samples], 2),
        "reply/top_share": statistics.fmean(shares),
    }


def route_shares(samples: list[Sample], name: str) -> dict[str, float]:
    """``reward/NAME/route/R``: the share of samples a routing reward (Echo-N1) sent to judge ``R``,
    from the ``route`` in its info; nothing for a reward that does not route."""
    infos = [info for s in samples if isinstance(info := s.info.get(name), dict)]
    routes = [r for info in infos if isinstance(r := info.get("route"), str)]
    known = {r for info in infos for r in info.get("routes", ()) if isinstance(r, str)} | set(routes)
    return {f"reward/{name}/route/{r}": routes.count(r) / len(routes) for r in sorted(known) if routes}


def advantage_stats(advantages: list[float]) -> dict[str, float]:
    if not advantages:
        return {}
    return {
        "adv/mean": statistics.fmean(advantages),
        "adv/std": statistics.pstdev(advantages) if len(advantages) > 1 else 0.0,
        "adv/max": max(advantages),
        "adv/min": min(advantages),
    }


def reward_validation(ctx: AlgoContext, scenarios: list[Scenario], max_new_tokens: int) -> ValidationResult:
    """The reward plugins' combined reward of the greedy replies (``val/reward``), per reward and the
    invalid count (``val/invalid``: replies no reward could score, left out of the mean). Single replies
    only: there is no simulated person to answer them."""
    samples = greedy_replies(ctx.policy, scenarios, max_new_tokens)
    ctx.rewards.score(samples)
    stats = reward_stats(samples, ctx.rewards.names)
    out = {"val/reward": stats["reward/mean"], "val/invalid": stats["invalid"]}
    out.update({"val/" + k: v for k, v in stats.items() if k.startswith("reward/") and k.endswith("/mean")})
    out["val/reply_len"] = stats["reply_len/mean"]
    return ValidationResult(out, [s.reward for s in samples], replies=[[s.text] for s in samples])


# ---------------------------------------------------------------------------- the algorithm


class GRPO(Algorithm):
    """Group Relative Policy Optimization over the configured reward plugins."""

    name = "grpo"
    validation_key = "val/reward"

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"rewards": [{"name": "judge", "weight": 1.0}, {"name": "format", "weight": 0.5}]}

    @classmethod
    def needs(cls, cfg: RunConfig) -> Needs:
        # Its only learning signal is the configured rewards: an empty list (or every weight 0) trains on 0.
        return policy_gradient_needs(cfg, rewards=True, roles=())

    @classmethod
    def requests(cls, cfg: RunConfig) -> list[RoleRequest]:
        return []  # its rewards' requests only (the plan counts them)

    def sample_group(self, scenarios: list[Scenario]) -> tuple[list[Sample], float]:
        """This step's groups of replies (:func:`sample_replies`) and the seconds they took."""
        return sample_replies(self.ctx.policy, self.cfg, scenarios)

    def rollout(self, scenarios: list[Scenario], step: int) -> Rollout:
        samples, t_gen = self.sample_group(scenarios)
        t0 = time.perf_counter()
        self.ctx.rewards.score(samples)
        t_rew = time.perf_counter() - t0
        adv = group_advantages(self.cfg, [s.reward for s in samples], [s.group for s in samples])
        items = pg_items(samples, adv)
        metrics = {
            **reward_stats(samples, self.ctx.rewards.names),
            **advantage_stats([a for a, s in zip(adv, samples) if s.valid]),
        }
        return Rollout(samples, items, metrics, {"generate": t_gen, "rewards": t_rew})

    def loss(
        self, mb: MicroBatch, out: TokenScores, totals: Totals
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return pg_loss(self.cfg, mb, out.logp, out.entropy, totals)

    def validate(self, scenarios: list[Scenario], max_new_tokens: int, turns: int = 1) -> ValidationResult:
        """The reward plugins' reward of the greedy replies (:func:`reward_validation`)."""
        return reward_validation(self.ctx, scenarios, max_new_tokens)
