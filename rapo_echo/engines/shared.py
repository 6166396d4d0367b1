"""Engines that share the policy's weights (``engine: policy`` for a simulator or judge)."""

from __future__ import annotations

import contextlib
from typing import Any

from rapo_echo.engines.hf import HFEngine


class FrozenBaseEngine(HFEngine):
    """The policy's model with its LoRA adapter switched off for every call: a role that shares the
    policy's memory but always sees the frozen base model, so it does not drift with training."""

    def _mode(self) -> contextlib.ExitStack:
        """The engine's mode for every forward (eval, autocast), with the adapter off."""
        stack = super()._mode()
        stack.enter_context(self.model.disable_adapter())
        return stack


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
