"""The trainable policy: a causal LM (full fine-tuning or LoRA), its reference, and the module that
turns (prompt, completion) token ids into per-token log-probs for the loss."""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rapo_echo.config import ModelConfig, RolloutConfig
from rapo_echo.engines.hf import HFEngine
from rapo_echo.logprobs import chunked_gather_logprobs, chunked_token_logprobs, chunked_topk_logprobs
from rapo_echo.models import load_model, resolve
from rapo_echo.types import Conversation, Scenario, msg

log = logging.getLogger(__name__)


@dataclass
class TokenBatch:
    """Sequences right-aligned in one tensor: left padding, then prompt, then completion.

    The completion tokens of every row sit in the last ``n_targets`` columns (``target_mask`` marks
    which of those belong to the row's completion)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    target_mask: torch.Tensor
    n_targets: int

    @property
    def targets(self) -> torch.Tensor:
        return self.input_ids[:, -self.n_targets :]


def collate(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int
) -> TokenBatch:
    """Left-pad ``prompt + completion`` rows into a :class:`TokenBatch`."""
    if any(len(c) == 0 for c in completions):
        raise ValueError("every completion needs at least one token")
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    width = max(len(s) for s in seqs)
    n_targets = max(len(c) for c in completions)
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    tmask = torch.zeros((len(seqs), n_targets), dtype=torch.float32)
    for i, (s, c) in enumerate(zip(seqs, completions)):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
        tmask[i, n_targets - len(c) :] = 1.0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return TokenBatch(ids, mask, positions, tmask, n_targets)


def pad_right_aligned(values: Sequence[Sequence[float]], n_targets: int) -> torch.Tensor:
    """Per-token values (one list per row) right-aligned into [rows, n_targets], zeros elsewhere."""
    out = torch.zeros((len(values), n_targets), dtype=torch.float32)
    for i, v in enumerate(values):
        if len(v):
            out[i, n_targets - len(v) :] = torch.tensor(list(v), dtype=torch.float32)
    return out


class TokenScorer(nn.Module):
    """Wraps a causal LM; ``forward`` returns per-token log-probs (and entropies) of the completion
    tokens of a :class:`TokenBatch`. This is the module DDP / DeepSpeed wrap, so gradient sync sees
    every forward. The LM head runs in chunks on completion positions only."""

    def __init__(self, lm: nn.Module, chunk_size: int = 512) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        n_targets: int,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
        gather_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """(log-probs [B, n_targets], entropies [B, n_targets]) of the last ``n_targets`` tokens; with
        ``gather_ids`` [B, n_targets, k] also the log-probs at those ids (for logit distillation)."""
        hidden = self.hidden_states(input_ids, attention_mask, position_ids)[:, -n_targets - 1 : -1]
        head = self.lm.get_output_embeddings()
        softcap = getattr(self.lm.config, "final_logit_softcapping", None)
        logp, entropy = chunked_token_logprobs(
            hidden,
            head.weight,
            input_ids[:, -n_targets:],
            bias=getattr(head, "bias", None),
            temperature=temperature,
            softcap=softcap,
            chunk_size=self.chunk_size,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )
        if gather_ids is None:
            return logp, entropy
        gathered = chunked_gather_logprobs(
            hidden, head.weight, gather_ids, temperature=temperature, chunk_size=self.chunk_size
        )
        return logp, entropy, gathered

    def hidden_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Final hidden states of the decoder (before the LM head)."""
        decoder = self.lm.get_decoder()
        return decoder(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state

    @torch.no_grad()
    def topk(self, batch: TokenBatch, k: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most likely ids and log-probs at each completion position of ``batch``."""
        dev = next(self.lm.parameters()).device
        hidden = self.hidden_states(
            batch.input_ids.to(dev), batch.attention_mask.to(dev), batch.position_ids.to(dev)
        )
        head = self.lm.get_output_embeddings()
        return chunked_topk_logprobs(
            hidden[:, -batch.n_targets - 1 : -1],
            head.weight,
            k,
            temperature=temperature,
            chunk_size=self.chunk_size,
        )


class Policy:
    """The policy model, its tokenizer, its generation engine and its reference.

    * LoRA (``model.lora.enabled``): only the adapter trains; the reference is the same model with
      the adapter disabled, so no second copy is held in memory.
    * Full fine-tuning: the reference is a frozen copy, made only when ``need_reference``.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        rollout_cfg: RolloutConfig,
        *,
        need_reference: bool,
        device: str | None = None,
    ) -> None:
        self.cfg = model_cfg
        self.rollout_cfg = rollout_cfg
        self.resolved = resolve(model_cfg.name)
        lm, tokenizer = load_model(
            self.resolved,
            dtype=model_cfg.dtype,
            device=device or model_cfg.device,
            trust_remote_code=model_cfg.trust_remote_code,
            attn_implementation=model_cfg.attn_implementation,
        )
        self.tokenizer = tokenizer
        self.ref_lm: nn.Module | None = None
        if model_cfg.lora.enabled:
            lm = self._add_lora(lm, model_cfg)
        elif need_reference:
            self.ref_lm = copy.deepcopy(lm).eval().requires_grad_(False)
        if model_cfg.gradient_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if model_cfg.lora.enabled:
                lm.enable_input_require_grads()
        self.lm = lm
        self.need_reference = need_reference
        self.scorer = TokenScorer(lm)
        self.ref_scorer = TokenScorer(self.ref_lm) if self.ref_lm is not None else None
        self.engine = HFEngine(lm, tokenizer, name="policy", max_batch_size=rollout_cfg.max_batch_size)

    @staticmethod
    def _add_lora(lm: nn.Module, cfg: ModelConfig) -> nn.Module:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=cfg.lora.target_modules,
            task_type="CAUSAL_LM",
        )
        return get_peft_model(lm, lora)

    @property
    def pad_id(self) -> int:
        return self.engine.pad_id

    @property
    def is_lora(self) -> bool:
        return self.cfg.lora.enabled

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.lm.parameters() if p.requires_grad]

    # ------------------------------------------------------------------ prompts
    def conversation(self, scenario: Scenario) -> Conversation:
        """The policy's prompt for a scenario: the configured system prompt (unless the scenario has
        one) followed by the visible dialogue."""
        messages = list(scenario.messages)
        system = self.rollout_cfg.system_prompt
        if system and not (messages and messages[0]["role"] == "system"):
            messages = [msg("system", system), *messages]
        return messages

    def prompt_ids(self, scenario: Scenario | Conversation) -> list[int]:
        """Token ids of the prompt, dropping the oldest turns (never the system prompt or the last
        user message) until it fits ``rollout.max_prompt_tokens``."""
        conv = self.conversation(scenario) if isinstance(scenario, Scenario) else list(scenario)
        limit = self.rollout_cfg.max_prompt_tokens
        ids = self.engine.encode(conv)
        head = 1 if conv and conv[0]["role"] == "system" else 0
        while len(ids) > limit and len(conv) - head > 1:
            conv = conv[:head] + conv[head + 1 :]
            ids = self.engine.encode(conv)
        return ids[-limit:]

    # ------------------------------------------------------------------ scoring
    def reference_logprobs(self, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
        """Per-token log-probs under the reference (adapter off under LoRA), no gradient."""
        if not self.need_reference:
            raise RuntimeError("this policy was built without a reference (beta = 0)")
        dev = self.device
        args = (
            batch.input_ids.to(dev),
            batch.attention_mask.to(dev),
            batch.position_ids.to(dev),
            batch.n_targets,
            temperature,
        )
        with torch.no_grad():
            if self.is_lora:
                with self.lm.disable_adapter():
                    return self.scorer(*args)[0]
            assert self.ref_scorer is not None
            return self.ref_scorer(*args)[0]

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    # ------------------------------------------------------------------ saving
    def save(self, path: str | Path, *, merged: bool = False) -> None:
        """Save the model in Hugging Face format (adapter only under LoRA unless ``merged``) plus the
        tokenizer; plain transformers (or peft, for an adapter) loads the folder."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        model: Any = self.lm
        if self.is_lora and merged:
            model = copy.deepcopy(self.lm).merge_and_unload()
        elif self.is_lora:
            model.peft_config["default"].base_model_name_or_path = self.resolved.path
        model.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
