"""Engines that share the policy's weights (``engine: policy`` for a simulator or judge)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from rapo_echo.engines.hf import HFEngine
from rapo_echo.types import Conversation, Generation, SamplingParams


class FrozenBaseEngine(HFEngine):
    """The policy's model with its LoRA adapter switched off for every call: a role that shares the
    policy's memory but always sees the frozen base model, so it does not drift with training."""

    def __init__(self, peft_model: Any, tokenizer: Any, **kw: Any) -> None:
        super().__init__(peft_model, tokenizer, **kw)

    @contextlib.contextmanager
    def _adapter_off(self) -> Iterator[None]:
        with self.model.disable_adapter():
            yield

    def generate_ids(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Generation]]:
        with self._adapter_off():
            return super().generate_ids(prompt_ids, params)

    def score_ids(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        with self._adapter_off():
            return super().score_ids(prompt_ids, completion_ids)

    def choice_logprobs(
        self, prompts: Sequence[Conversation], options: Sequence[str]
    ) -> list[dict[str, float]]:
        with self._adapter_off():
            return super().choice_logprobs(prompts, options)

    def stream(self, prompt: Conversation, params: SamplingParams) -> Iterator[str]:
        with self._adapter_off():
            yield from super().stream(prompt, params)


def role_engine(policy: Any, role: str, max_batch_size: int = 64, autocast: Any = None) -> HFEngine:
    """The engine for a role configured as ``engine: policy``.

    Under LoRA: the base model (adapter off) in the same memory. Under full fine-tuning: the frozen
    reference copy when the run keeps one, else the live policy (documented: it then changes as
    the policy trains). ``autocast`` (e.g. bfloat16) speeds the role up without touching the
    policy's own fp32 sampling."""
    kw = {"max_batch_size": max_batch_size, "autocast": autocast}
    if policy.is_lora:
        return FrozenBaseEngine(policy.lm, policy.tokenizer, name=f"{role}:policy-base", **kw)
    if policy.ref_lm is not None:
        return HFEngine(policy.ref_lm, policy.tokenizer, name=f"{role}:policy-ref", **kw)
    return HFEngine(policy.lm, policy.tokenizer, name=f"{role}:policy-live", **kw)
