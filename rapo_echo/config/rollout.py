"""The ``rollout`` section: how the policy samples, and the default system prompt."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rapo_echo.config.base import AutoSize, OpenShare, Share, Strict

DEFAULT_SYSTEM_PROMPT = (
    "You are a warm, emotionally supportive listener. Reply to the person in two or three sentences: "
    "acknowledge their feelings, show you understood, and gently invite them to say more."
)


VLLM_MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses a higher temperature


class RolloutConfig(Strict):
    """How the policy samples: ``batch_size`` scenarios per step, ``group_size`` replies each."""

    batch_size: int = Field(4, ge=1, description="Scenarios (contexts or profiles) per step.")
    group_size: int = Field(4, ge=1, le=256, description="Replies (RLVER: dialogues) per scenario, G.")
    max_new_tokens: int = Field(64, ge=1, le=32768, description="Tokens per reply (RLVER: per turn).")
    temperature: float = Field(1.0, gt=0.0, le=5.0, description="Sampling temperature of the policy.")
    top_p: Share = Field(1.0, description="Nucleus sampling bound (1: off).")
    top_k: int = Field(0, ge=0, description="Top-k sampling bound (0: off).")
    max_prompt_tokens: int = Field(
        1024, ge=16, description="Longer prompts lose whole turns from the oldest (never the system prompt)."
    )
    greedy_member: bool = Field(
        False,
        description="One reply of each group decoded greedily instead of sampled (GRPO, RAPO; needs "
        "`group_size` >= 2).",
    )
    system_prompt: str | None = Field(DEFAULT_SYSTEM_PROMPT, description="The policy's system prompt.")
    max_batch_size: AutoSize = Field(
        "auto",
        description="Sequences decoded at once (`auto`: 64 on a CPU, sized from free memory on a GPU).",
    )
    decode: Literal["auto", "dynamic", "static", "compiled"] = Field(
        "auto",
        description="The `hf` sampler's decode loop: `auto` (compiled on CUDA, else dynamic), `dynamic` "
        "(growing KV cache), `static` (pre-allocated KV cache), `compiled` (static + torch.compile).",
    )
    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="The policy's sampler: `hf` (the training model) or `vllm` (an in-process vLLM copy, its "
        "weights loaded from the policy after every step; temperature at most 2).",
    )
    vllm_gpu_memory_utilization: OpenShare = Field(
        0.3,
        description="`engine: vllm`: share of GPU memory the vLLM copy may take (autosize sets it aside).",
    )
    overlap_remote: bool = Field(
        True,
        description="Multi-turn rollouts (RLVER) with a served simulator: the policy samples the next turn "
        "of the dialogues whose answers are back while the others are still in flight (faster when the "
        "server's latency varies; which dialogues share a policy batch then depends on its timing, so "
        "sampled turns are not bit-reproducible). `false`: every turn in lockstep.",
    )

    @model_validator(mode="after")
    def _greedy_needs_a_group(self) -> RolloutConfig:
        if self.greedy_member and self.group_size < 2:
            raise ValueError("greedy_member needs group_size >= 2 (the greedy reply plus sampled ones)")
        if self.engine == "vllm" and self.temperature > VLLM_MAX_TEMPERATURE:
            most = VLLM_MAX_TEMPERATURE
            raise ValueError(f"temperature {self.temperature:g}: vLLM (engine: vllm) takes at most {most:g}")
        return self
