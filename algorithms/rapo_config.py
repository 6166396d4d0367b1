"""The ``rapo`` section: RAPO's own switches (docs/algorithms/rapo.md): rank reward, the simulated
person who reacts, the group judge, and self-distillation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rapo_echo.config import Autocast, LogprobMode, Strict


class RapoJudgeConfig(Strict):
    """The group judge (GRM): ranks each group's reply -> reaction pairs and critiques the weak ones."""

    kind: Literal["model", "reactions"] = Field(
        "model",
        description="`model`: the LLM group judge on the `judge` engine; `reactions`: no model, ranks by the "
        "reactions' emotion change and critiques by quoting them.",
    )
    use_logprobs: LogprobMode = Field(
        "auto",
        description="Read the ranking from label-token probabilities (`auto`: when the engine has them).",
    )
    max_retries: int = Field(
        2, ge=0, le=10, description="Retries of an unparseable ranking, then the group is masked."
    )
    reverse_pass: bool = Field(
        False, description="Rank a second time in reversed order and average (position bias)."
    )
    shuffle: bool = Field(True, description="Shuffle the candidates before showing them.")
    orders: Literal["both", "random", "auto"] = Field(
        "both",
        description="Position bias: `both` ranks each group in its G cyclic shifts (every reply once in "
        "every slot) and averages; `random` one shuffled order; `auto` both until `auto_probe` decisions "
        "are measured, then both only while the first slot's share of rank 1 exceeds "
        "`auto_threshold` x 2 x chance.",
    )
    auto_probe: int = Field(32, ge=1, description="`orders: auto`: decisions measured in every order first.")
    auto_threshold: float = Field(
        0.6, ge=0.0, le=1.0, description="`orders: auto`: the bias above which every order is kept."
    )
    tie_eps: float = Field(0.02, ge=0.0, le=1.0, description="Label probabilities closer than this tie.")
    ties: Literal["chained", "leader", "none", "sequential", "pairwise"] = Field(
        "chained",
        description="How P(best) becomes ranks: `chained` (neighbours within `tie_eps` tie), `leader` (ties "
        "with a block's best only), `none`, `sequential` (G - 1 calls), `pairwise` (every pair,"
        " both orders).",
    )
    show_profile: bool = Field(True, description="Show the judge the person's hidden profile.")
    addressed: Literal["lower", "floor", "invalid", "strip", "flag"] = Field(
        "lower",
        description="A reply that addresses the judge (docs/judges.md): `lower` (ranked as written and with "
        "its suspect spans set aside, the worse rank kept), `floor` (the group's last rank without judging "
        "it), `invalid` (the group is masked), `strip` (rank the rest), `flag` (rank as is).",
    )
    addressed_context: Literal["lower", "strip", "invalid", "flag"] = Field(
        "lower",
        description="A dialogue turn, profile or reaction that addresses the judge: `lower` (shown as "
        "written; each reply keeps the worse of its ranks there and with the suspect spans set aside), "
        "`strip` it, mask the group (`invalid`), or `flag` it only.",
    )
    max_new_tokens: int = Field(384, ge=16, description="Tokens of a generated ranking.")
    critique_tokens: int = Field(64, ge=8, description="Tokens per critique.")
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
