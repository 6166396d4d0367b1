"""GRPO: a group of replies per context, scored by the reward plugins, group-relative advantages.

Echo-N1's dual generative reward models run as ``--algo grpo`` with their reward plugin."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from rapo_echo.algorithms.base import PG, Algorithm, Rollout, TrainItem
from rapo_echo.types import Sample, SamplingParams, Scenario, ValidationResult


def reward_stats(samples: list[Sample], names: list[str]) -> dict[str, float]:
    """Mean/std of the combined reward and of each named reward over valid samples, plus counts."""
    import statistics

    out: dict[str, float] = {}
    valid = [s.reward for s in samples if s.reward is not None]
    out["reward/mean"] = statistics.fmean(valid) if valid else float("nan")
    out["reward/std"] = statistics.pstdev(valid) if len(valid) > 1 else 0.0
    for name in names:
        vals = [s.rewards[name] for s in samples if s.rewards.get(name) is not None]
        out[f"reward/{name}/mean"] = statistics.fmean(vals) if vals else float("nan")  # type: ignore[arg-type]
        out[f"reward/{name}/std"] = statistics.pstdev(vals) if len(vals) > 1 else 0.0  # type: ignore[arg-type]
        out.update(route_shares(samples, name))
    out["invalid"] = float(sum(1 for s in samples if s.reward is None))
    lengths = [len(s.completion_ids) for s in samples]
    out["reply_len/mean"] = statistics.fmean(lengths) if lengths else 0.0
    out["truncated"] = float(sum(1 for s in samples if s.finish_reason == "length"))
    return out


def route_shares(samples: list[Sample], name: str) -> dict[str, float]:
    """``reward/NAME/route/R``: the share of samples a routing reward (Echo-N1) sent to judge ``R``,
    from the ``route`` in its info; nothing for a reward that does not route."""
    infos = [info for s in samples if isinstance(info := s.info.get(name), dict)]
    routes = [r for info in infos if isinstance(r := info.get("route"), str)]
    known = {r for info in infos for r in info.get("routes", ()) if isinstance(r, str)} | set(routes)
    return {f"reward/{name}/route/{r}": routes.count(r) / len(routes) for r in sorted(known) if routes}


def advantage_stats(advantages: list[float]) -> dict[str, float]:
    import statistics

    if not advantages:
        return {}
    return {
        "adv/mean": statistics.fmean(advantages),
        "adv/std": statistics.pstdev(advantages) if len(advantages) > 1 else 0.0,
        "adv/max": max(advantages),
        "adv/min": min(advantages),
    }


class GRPO(Algorithm):
    """Group Relative Policy Optimization over the configured reward plugins."""

    name = "grpo"
    # Its only learning signal is the configured rewards: an empty list (or every weight 0) trains on 0.
    needs_rewards = True

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {"rewards": [{"name": "judge", "weight": 1.0}, {"name": "format", "weight": 0.5}]}

    def sampling_params(self) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            n=r.group_size,
        )

    def sample_group(self, scenarios: list[Scenario]) -> tuple[list[Sample], float]:
        """``group_size`` replies per scenario in one batched engine call; returns samples and seconds.

        With ``rollout.greedy_member`` the first reply of each group is decoded greedily (a second
        call) and the other ``group_size - 1`` are sampled; the greedy reply keeps no sampler
        log-probs (they are not the rollout temperature's), so the trainer scores it itself."""
        policy = self.ctx.policy
        t0 = time.perf_counter()
        prompt_ids = [policy.prompt_ids(s) for s in scenarios]
        params = self.sampling_params()
        greedy = self.cfg.rollout.greedy_member
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

    def rollout(self, scenarios: list[Scenario], step: int) -> Rollout:
        samples, t_gen = self.sample_group(scenarios)
        t0 = time.perf_counter()
        self.ctx.rewards.score(samples)
        t_rew = time.perf_counter() - t0
        adv = self.advantages([s.reward for s in samples], [s.group for s in samples])
        items = self.pg_items(samples, adv)
        metrics = {
            **reward_stats(samples, self.ctx.rewards.names),
            **advantage_stats([a for a, s in zip(adv, samples) if s.valid]),
        }
        return Rollout(samples, items, metrics, {"generate": t_gen, "rewards": t_rew})

    validation_key = "val/reward"

    def validate(self, scenarios: list[Scenario], max_new_tokens: int, turns: int = 1) -> ValidationResult:
        """The reward plugins' combined reward of the greedy replies (``val/reward``), per reward and
        the invalid count (``val/invalid``: replies no reward could score, left out of the mean). Single
        replies only (``turns`` is 1: there is no simulated person to answer them)."""
        samples = self.greedy_replies(scenarios, max_new_tokens)
        self.ctx.rewards.score(samples)
        stats = reward_stats(samples, self.ctx.rewards.names)
        out = {"val/reward": stats["reward/mean"], "val/invalid": stats["invalid"]}
        out.update(
            {"val/" + k: v for k, v in stats.items() if k.startswith("reward/") and k.endswith("/mean")}
        )
        out["val/reply_len"] = stats["reply_len/mean"]
        return ValidationResult(out, [s.reward for s in samples], replies=[[s.text] for s in samples])

    @staticmethod
    def pg_items(samples: list[Sample], advantages: list[float]) -> list[TrainItem]:
        """Training items of the valid samples with at least one token (invalid ones are masked out)."""
        items = []
        for i, (s, a) in enumerate(zip(samples, advantages)):
            s.info["advantage"] = a
            if s.valid and s.completion_ids:
                items.append(
                    TrainItem(
                        s.prompt_ids,
                        s.completion_ids,
                        a,
                        kind=PG,
                        group=s.group,
                        sample=i,
                        sampler_logprobs=s.logprobs,
                    )
                )
        return items
