"""``rapo-echo data hard-prompts``: keep the RL prompts the policy does not already win (Echo-N1 selects
prompts by best-of-N sampling plus a pairwise reward-model filter; docs/algorithms/echo_n1.md).

Per chunk of prompts (scenarios with their reference, e.g. the output of ``data references``): the policy
samples ``n`` replies per prompt with the training prompt (one batched call), and the training reward
scores them (``reward``: ``empathy``, the pairwise judge against each scenario's reference, or
``echo_n1``, which routes chit-chat prompts to the humanlike judge; the reward's own batched calls). A
prompt is kept when its ``criterion`` stays at or below ``threshold``: ``best``, the best of the ``n``
scores (kept only if even the best reply does not beat the reference), or ``mean``, their mean. A prompt
none of whose replies could be scored is left out and counted.

The dataset, ``prompts.jsonl``, is the kept scenarios in our scenarios format (reference kept,
``meta.hard_best`` / ``meta.hard_mean`` added): ``train --set data.path=.../prompts.jsonl``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field

from rapo_echo.config import Flag
from rapo_echo.datagen.contexts import scenario_row
from rapo_echo.datagen.settings import ReplySettings
from rapo_echo.engines.base import ChatEngine
from rapo_echo.prompting import policy_conversation
from rapo_echo.rewards import RewardContext, as_output, build_reward
from rapo_echo.types import Sample, SamplingParams, Scenario


class HardPromptSettings(ReplySettings):
    """`data hard-prompts`' switches (documented with their sources in docs/algorithms/echo_n1.md)."""

    n: int = Field(4, ge=1, description="Replies sampled per prompt (best-of-N).")
    criterion: Literal["best", "mean"] = Field(
        "best",
        description="`best`: keep when even the best reply does not win; `mean`: when the mean is low.",
    )
    threshold: float = Field(0.5, ge=0.0, le=1.0, description="Keep a prompt when its criterion <= this.")
    reward: Literal["empathy", "echo_n1"] = Field(
        "empathy",
        description="The pairwise filter: the `empathy` reward or `echo_n1` (chit-chat goes to humanlike).",
    )
    reward_args: Annotated[dict[str, Any], Flag(metavar="JSON")] = Field(
        default_factory=dict, description="The reward's args, as in a run config (`{...}` or KEY=VALUE)."
    )

    def resolved_reward_args(self) -> dict[str, Any]:
        """The reward's args: references from the scenarios only (never written by a model here), no
        instruction-bias probe, then ``reward_args`` on top."""
        own = {"reference": "scenario", "injection_probe": 0}
        if self.reward == "empathy":
            return {**own, **self.reward_args}
        nested = dict(self.reward_args)
        nested["empathy"] = {**own, **nested.get("empathy", {})}
        return nested


def protocol() -> dict[str, str]:
    """The judges' prompts' fingerprint (a resume with other judge prompts is refused)."""
    from rapo_echo.judges import empathy, humanlike

    texts = [empathy.NEEDS_SYSTEM, empathy.COMPARE_SYSTEM, humanlike.SYSTEM, humanlike.CONTEXT_RULE]
    return {"prompts": hashlib.sha256("\0".join(texts).encode()).hexdigest()[:12]}


def keep(
    scores: Sequence[float | None], criterion: str, threshold: float
) -> tuple[bool, float | None, float | None]:
    """(kept, best, mean) of one prompt's scores (None: unscored, left out of both); not kept when no
    score is known."""
    known = [s for s in scores if s is not None]
    if not known:
        return False, None, None
    best, mean = max(known), sum(known) / len(known)
    return (best if criterion == "best" else mean) <= threshold, best, mean


class HardPrompts:
    """The pipeline (:class:`rapo_echo.datagen.runner.Pipeline`)."""

    name = "hard-prompts"
    dataset_file = "prompts.jsonl"

    def __init__(self, policy: ChatEngine, judge: ChatEngine, settings: HardPromptSettings) -> None:
        self.policy, self.s = policy, settings
        ctx = RewardContext(policy=policy, judge=judge)
        self.reward = build_reward(settings.reward, settings.resolved_reward_args(), ctx, where="--reward")
        self.chunks = 0

    def run_chunk(self, contexts: Sequence[Scenario]) -> list[dict[str, Any]]:
        s = self.s
        self.chunks += 1
        params = SamplingParams(
            max_new_tokens=s.max_new_tokens, temperature=s.temperature, n=s.n, seed=s.seed + self.chunks
        )
        prompts = [policy_conversation(sc, s.system_prompt) for sc in contexts]
        groups = self.policy.generate(prompts, params)
        samples = [
            Sample(
                sc, group=g, prompt_ids=[], completion_ids=list(gen.token_ids), logprobs=None, text=gen.text
            )
            for g, (sc, gens) in enumerate(zip(contexts, groups))
            for gen in gens
        ]
        outputs = [as_output(v, f"reward {self.reward.name!r}") for v in self.reward(samples)]
        records = []
        for g in range(len(contexts)):
            mine = [(smp, out) for smp, out in zip(samples, outputs) if smp.group == g]
            scores = [out.score for _, out in mine]
            kept, best, mean = keep(scores, s.criterion, s.threshold)
            records.append(
                {
                    "status": "kept" if kept else ("unscored" if best is None else "solved"),
                    "best": best,
                    "mean": mean,
                    "scores": scores,
                    "replies": [smp.text for smp, _ in mine],
                    "invalid": [out.info.get("invalid") for _, out in mine if out.score is None],
                }
            )
        return records

    def export(
        self, items: Sequence[tuple[Scenario, dict[str, Any]]]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        rows = [
            scenario_row(sc, hard_best=r["best"], hard_mean=r["mean"])
            for sc, r in items
            if r["status"] == "kept"
        ]
        bests = [r["best"] for _, r in items if r["best"] is not None]
        figures = {
            "status": dict(Counter(r["status"] for _, r in items)),
            "kept": len(rows),
            "kept_share": len(rows) / len(items) if items else None,
            "mean_best": sum(bests) / len(bests) if bests else None,
        }
        return rows, figures
