"""The ``rapo`` section: RAPO's own switches (docs/algorithms/rapo.md): rank reward, the simulated
person who reacts, the group judge, and self-distillation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rapo_echo.config import Autocast, GroupJudgeConfig, LogprobMode, Strict


class RapoJudgeConfig(GroupJudgeConfig):
    """RAPO's judge: the group judge's settings, which kind of judge ranks, and which replies it critiques."""

    kind: Literal["model", "reactions"] = Field(
        "model",
        description="`model`: the LLM group judge on the `judge` engine; `reactions`: no model, ranks by the "
        "reactions' emotion change and critiques by quoting them.",
    )
    critique_for: Literal["selected", "all"] = Field(
        "selected", description="Critique only the replies to be rewritten, or `all`."
    )


class RapoSimulatorConfig(Strict):
    """The simulated person ("echo"): their next message, emotion change and inner thought."""

    name: str = Field(
        "reaction",
        description="`reaction` (the LLM reaction simulator on the `simulator` engine), `hidden_preference` "
        "(rule-based, no model), an entry point of `rapo_echo.simulators`, or `module:Class`.",
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the simulator's constructor."
    )
    use_logprobs: LogprobMode = Field(
        "auto", description="`reaction`: read the 1-7 emotion answer from label probabilities."
    )
    max_new_tokens: int = Field(48, ge=4, description="`reaction`: tokens of the person's next message.")
    thought_tokens: int = Field(24, ge=4, description="`reaction`: tokens of the inner thought.")
    temperature: float = Field(0.7, ge=0.0, le=5.0, description="`reaction`: sampling temperature.")
    max_retries: int = Field(2, ge=0, le=10, description="`reaction`: retries of an unparseable answer.")
    with_thought: bool = Field(
        True, description="`reaction`: write the inner thought (one more batched call)."
    )


class SelfDistillConfig(Strict):
    """Self-distillation: weak replies are rewritten by the policy from their critique, and the better
    reply is learnt under the plain context."""

    enabled: bool = Field(True, description="Self-distillation on (off: GRPO on rank rewards).")
    rewrite_prompt: Literal["followup", "system"] = Field(
        "followup",
        description="Where the rewrite request goes: `followup` (a user turn after the weak reply) or"
        " `system` "
        "(the system message; the policy answers the person directly).",
    )
    select: Literal["bottom_half", "all_but_best", "below_threshold"] = Field(
        "bottom_half",
        description="Which replies are rewritten (`below_threshold`: reward below `threshold`).",
    )
    threshold: float = Field(0.5, description="`select: below_threshold`: the reward bound.")
    loss: Literal["nll", "adv_nll", "in_group", "token_kl"] = Field(
        "nll",
        description="`nll` (ILF), `adv_nll` (RLTF-SD, weighted by the rewrite's reward gain), `in_group` "
        "(Critique-GRPO), `token_kl` (SDPO-style logit matching with a teacher that sees the critique).",
    )
    coef: float = Field(0.5, ge=0.0, description="lambda: loss = GRPO loss + lambda * SD loss.")
    verify: bool = Field(
        False,
        description="Re-simulate and re-rank each group with its rewrites; keep those that beat their"
        " original.",
    )
    max_new_tokens: int | None = Field(
        None, ge=1, description="Tokens per rewrite (None: `rollout.max_new_tokens`)."
    )
    temperature: float = Field(0.7, ge=0.0, le=5.0, description="Sampling temperature of the rewrites.")
    shaping_gamma: float = Field(0.1, gt=0.0, description="`in_group`: gamma of -A p / (p + gamma).")
    adv_nll_floor: float = Field(
        -5.0,
        le=0.0,
        description="`adv_nll`, negative weight: -w max(log p, floor), so unlikelihood stops at exp(floor).",
    )
    top_k_logits: int = Field(100, ge=1, description="`token_kl`: logits matched, plus a tail bucket.")
    jsd_alpha: float = Field(0.5, ge=0.0, le=1.0, description="`token_kl`: alpha of the generalized JSD.")
    teacher_demo: bool = Field(
        False,
        description="`token_kl`: also show the teacher the group's best-ranked reply as a demonstration.",
    )
    max_per_group: int | None = Field(None, ge=1, description="At most this many rewrites per group.")
    only_failed: bool = Field(
        False,
        description="Guard (SRPO): only replies the person felt no better after (emotion change <= 0) are"
        " rewritten and distilled.",
    )
    ref_kl: float = Field(
        0.0,
        ge=0.0,
        description="Guard (SDPG): this x a KL estimate to the reference (`loss.kl_estimator`) on the"
        " distilled tokens joins the SD loss.",
    )
    max_ref_logratio: float | None = Field(
        None,
        gt=0.0,
        description="Guard: a distilled token whose log-prob is more than this from the reference's gives no"
        " SD gradient (None: no cap).",
    )
    min_beat: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="Guard (decay): the SD coefficient x min(1, EMA of the share of rewrites that beat their"
        " original / this); re-ranks the rewrites (None: no decay; no effect on `token_kl`).",
    )
    beat_ema: float = Field(
        0.8, ge=0.0, lt=1.0, description="`min_beat`: the moving average's weight on the past."
    )
    autocast: Autocast = Field(
        "auto", description="Precision of rewrite generation (`auto`: bfloat16 where the hardware has it)."
    )


class RapoConfig(Strict):
    """RAPO's own switches."""

    rank_reward: Literal["linear", "gopo"] = Field(
        "linear",
        description="`linear`: r = (G - rank) / (G - 1), ties share the average rank; `gopo`: the rank"
        " itself "
        "is the advantage, A = 2 - 4 (rank - 1) / (G - 1).",
    )
    emotion_mix: float = Field(
        0.0, ge=0.0, le=1.0, description="reward = (1 - mix) r + mix (delta / scale + 1) / 2."
    )
    emotion_scale: float = Field(10.0, gt=0.0, description="The emotion change's range: [-scale, +scale].")
    simulator: RapoSimulatorConfig = Field(
        default_factory=RapoSimulatorConfig, description="The simulated person."
    )
    judge: RapoJudgeConfig = Field(default_factory=RapoJudgeConfig, description="The group judge.")
    sd: SelfDistillConfig = Field(default_factory=SelfDistillConfig, description="Self-distillation.")
