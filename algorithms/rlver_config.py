"""The ``rlver`` section: RLVER's own switches (docs/algorithms/rlver.md): the SAGE-style simulated user,
the estimator (GRPO or PPO with a value head), and thinking mode; and RLVER's prompts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rapo_echo.config import Strict

from .ppo_config import PpoConfig

RLVER_SYSTEM_PROMPT = (
    "You are chatting with a friend and you are good at lifting their mood with emotionally intelligent "
    "replies. Your aim is to make them feel better or to grow closer. Keep it warm, natural and everyday: "
    "short, casual, loose grammar, with interjections and colloquial words."
)
RLVER_THINKING_INSTRUCTION = (
    "Before each reply, think about how and what to answer and choose a strategy (its logic and its "
    "tone). Put your thinking inside <think></think>, then write the reply."
)


class RlverSimulatorConfig(Strict):
    """The SAGE-style simulated user of ``--algo rlver`` (``simulators/sage.py``)."""

    preset: Literal["rlver", "sage"] = Field(
        "rlver",
        description="`rlver`: start 30, change not clamped, ends at <= 0, 8 turns; `sage`: start 40, change "
        "clamped to +-10, ends below 10, 10 turns.",
    )
    max_turns: int | None = Field(
        None, ge=1, description="Policy replies the user reacts to (None: the preset's)."
    )
    initial_emotion: float | None = Field(
        None,
        gt=0.0,
        lt=100.0,
        description="Starting emotion, above 0 and below 100 (the sage preset also needs >= 10, its floor; "
        "None: the preset's, rlver 30, sage 40).",
    )
    temperature: float = Field(0.7, ge=0.0, le=5.0, description="The simulator's sampling temperature.")
    max_new_tokens: int = Field(512, ge=16, description="Tokens per simulator call.")
    max_retries: int = Field(
        2, ge=0, le=10, description="Retries of an unparseable output, then the dialogue is masked."
    )
    emotion_readout: Literal["text", "logprobs", "auto"] = Field(
        "auto",
        description="`text`: the analysis's integer `shift`; `logprobs`: the expectation over -10..+10 from "
        "label probabilities after a free analysis line's `Change:` (read from the analysis request's own "
        "top log-probs where a server returns them, else one more forward; usable with small simulators); "
        "`auto` (default): logprobs when the engine has them (hf, vllm, servers with log-probs), else text.",
    )
    plain_reply: bool = Field(
        True,
        description="The user's message alone, one line (default; usable with small simulators), instead of "
        "SAGE's reasoning fields (false: a JSON object of decisions, draft, rewrite and message).",
    )
    end_at_max_emotion: bool | None = Field(
        None,
        description="End a dialogue when the user's emotion reaches 100, as SAGE's evaluation loop does "
        "(None: the preset's; rlver no, as RLVER's released rollout, which ends only on goodbye, emotion "
        "<= 0 or the turn limit; sage yes).",
    )


class RlverConfig(Strict):
    """RLVER's own switches."""

    simulator: RlverSimulatorConfig = Field(
        default_factory=RlverSimulatorConfig, description="The SAGE-style simulated user."
    )
    estimator: Literal["grpo", "ppo"] = Field(
        "grpo",
        description="`grpo`: `loss.advantage` over each profile's dialogues; `ppo`: value head and GAE.",
    )
    ppo: PpoConfig = Field(
        default_factory=PpoConfig, description="`estimator: ppo`: PPO's settings (those of `--algo ppo`)."
    )
    dense_reward: bool = Field(
        False, description="Our extension, PPO only: each turn's emotion change / 100 at the turn's end."
    )
    reward: Literal["final", "per_turn"] = Field(
        "final",
        description="GRPO: `final` (the final emotion / 100 for the whole dialogue, RLVER's) or `per_turn` "
        "(each turn's emotion change / 100; a turn's advantage is its return-to-go minus the leave-one-out "
        "mean of the group's returns from that turn, unbiased whatever the turn count; docs/algorithms/"
        "rlver.md).",
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="`reward: per_turn`: the discount of later turns.")
    max_dialogue_tokens: int = Field(
        10000,
        ge=16,
        description="Tokens after the first prompt; the dialogue ends when spent (RLVER: 10,000).",
    )
    thinking: bool = Field(False, description="Thinking mode: `<think>...</think>` before each reply.")
    thinking_instruction: str = Field(
        RLVER_THINKING_INSTRUCTION, description="Appended to the system prompt in thinking mode."
    )

    @model_validator(mode="after")
    def _dense_needs_ppo(self) -> RlverConfig:
        if self.dense_reward and self.estimator != "ppo":
            raise ValueError("dense_reward needs estimator: ppo (GRPO compares whole dialogues)")
        if self.reward == "per_turn" and self.estimator != "grpo":
            raise ValueError("reward: per_turn is GRPO's; PPO's per-turn rewards are dense_reward: true")
        return self
