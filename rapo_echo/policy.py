"""The trainable policy: a causal LM (full fine-tuning or LoRA), its reference, and the module that
turns (prompt, completion) token ids into per-token log-probs for the loss."""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from rapo_echo.autosize import CPU_ROLLOUT_BATCH
from rapo_echo.checkpoint import VALUE_HEAD_FILE, read_weights
from rapo_echo.config import ModelConfig, RolloutConfig
from rapo_echo.distributed import (
    full_parameters,
    generation_view,
    inference_engine,
    is_zero3_partitioned,
    register_head_parameters,
)
from rapo_echo.engines.hf import HFEngine, left_pad
from rapo_echo.errors import ConfigError, RapoEchoError
from rapo_echo.logprobs import (
    check_logit_transform,
    chunked_gather_logprobs,
    chunked_token_logprobs,
    chunked_topk_logprobs,
    logit_transform,
)
from rapo_echo.models import load_model, pick_device, resolve, resolve_dtype
from rapo_echo.prompting import fit_prompt, policy_conversation
from rapo_echo.types import Conversation, Scenario

log = logging.getLogger(__name__)


@dataclass
class TokenBatch:
    """(prompt, completion) pairs prepared for scoring.

    ``inputs`` is what :class:`TokenScorer` takes. Per-token values of the completions are
    left-aligned: column ``j`` of a ``[rows, n_targets]`` tensor is completion token ``j`` of the row
    and ``target_mask`` marks the columns that exist.

    Two layouts: ``shared`` runs each distinct prompt once and lets its rows (a GRPO group) attend to
    its KV cache, so a prompt shared by G replies costs one forward instead of G; ``full`` runs each
    row's whole sequence (needed under gradient checkpointing, which turns the KV cache off).
    """

    inputs: dict[str, torch.Tensor]
    target_mask: torch.Tensor
    lengths: list[int]
    loss_mask: torch.Tensor | None = None  # [rows, n_targets]: target_mask times the items' loss masks

    def __post_init__(self) -> None:
        if self.loss_mask is None:
            self.loss_mask = self.target_mask

    @property
    def n_targets(self) -> int:
        return int(self.target_mask.shape[1])

    def to(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        return {k: v.to(device) for k, v in self.inputs.items()}

    def rows(self, values: torch.Tensor) -> list[list[float]]:
        """Per-row lists of a [rows, n_targets] tensor's values, cut to each completion's length."""
        values = values.detach().cpu()
        return [values[i, :n].tolist() for i, n in enumerate(self.lengths)]


def collate(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    *,
    shared: bool = True,
    loss_masks: Sequence[Sequence[int] | None] | None = None,
) -> TokenBatch:
    """Build a :class:`TokenBatch` (``shared`` prefix layout by default, else ``full``). ``loss_masks``
    (one per completion, None for all ones) mark the tokens that carry the loss in a multi-turn item;
    every completion token is still scored (the user's tokens are context the policy's follow)."""
    if any(len(c) == 0 for c in completions):
        raise ValueError("every completion needs at least one token")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    lengths = [len(c) for c in completions]
    n = max(lengths)
    tmask = torch.zeros((len(completions), n), dtype=torch.float32)
    targets = torch.full((len(completions), n), pad_id, dtype=torch.long)
    for i, c in enumerate(completions):
        tmask[i, : len(c)] = 1.0
        targets[i, : len(c)] = torch.tensor(list(c), dtype=torch.long)
    lmask = None
    if loss_masks is not None and any(m is not None for m in loss_masks):
        lmask = tmask.clone()
        for i, (c, m) in enumerate(zip(completions, loss_masks)):
            if m is not None:
                if len(m) != len(c):
                    raise ValueError(
                        f"row {i}: loss mask has {len(m)} entries for {len(c)} completion tokens"
                    )
                lmask[i, : len(c)] = torch.tensor([float(x != 0) for x in m])
    if shared:
        index: dict[tuple[int, ...], int] = {}
        rows = [index.setdefault(tuple(p), len(index)) for p in prompts]
        unique = list(index)
        pids, pmask = left_pad(unique, pad_id)
        inputs = {"prompt_ids": pids, "prompt_mask": pmask, "rows": torch.tensor(rows), "targets": targets}
        return TokenBatch(inputs, tmask, lengths, lmask)
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    ids, mask = left_pad(seqs, pad_id)
    width = ids.shape[1]
    where = torch.full((len(seqs), n), width - 1, dtype=torch.long)
    for i, c in enumerate(completions):
        where[i, : len(c)] = torch.arange(width - len(c) - 1, width - 1)  # hidden state predicting token j
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    inputs = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": positions,
        "where": where,
        "targets": targets,
    }
    return TokenBatch(inputs, tmask, lengths, lmask)


def pad_left_aligned(values: Sequence[Sequence[float]], n_targets: int) -> torch.Tensor:
    """Per-token values (one list per row) left-aligned into [rows, n_targets], zeros elsewhere."""
    out = torch.zeros((len(values), n_targets), dtype=torch.float32)
    for i, v in enumerate(values):
        if len(v):
            out[i, : len(v)] = torch.tensor(list(v), dtype=torch.float32)
    return out


class TokenScores(NamedTuple):
    """What :class:`TokenScorer` computes for the completion tokens of a batch, left-aligned ``[B, n]``:
    log-probs and entropies; the value head's values of the states before each token (``with_values``);
    the log-probs at the ids asked for (``gather_ids``: ``[B, n, k]``)."""

    logp: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor | None = None
    gathered: torch.Tensor | None = None


class ValueHead(nn.Module):
    """PPO's critic: a linear map of the policy's last hidden state to a value (it shares the trunk,
    so the value loss also trains it). Starts at zero, so every first value is 0."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Values [B, n] from hidden states [B, n, H] (computed in the head's own dtype)."""
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)


class TokenScorer(nn.Module):
    """Wraps a causal LM; ``forward`` returns per-token log-probs (and entropies) of the completion
    tokens of a :class:`TokenBatch`. This is the module DDP / DeepSpeed wrap, so gradient sync sees
    every forward. The LM head runs in chunks on completion positions only, with the model's own logit
    processing (:mod:`rapo_echo.logprobs`); :meth:`check` refuses a model whose logits it cannot
    reproduce. A :class:`ValueHead` (``value_head``, PPO) lives here too, so it is wrapped, synced and
    optimised with the model."""

    def __init__(self, lm: nn.Module, chunk_size: int = 512) -> None:
        super().__init__()
        self.lm = lm
        self.chunk_size = chunk_size
        self.value_head: nn.Module | None = None
        self.transform = logit_transform(lm.config)

    def check(self, probe_ids: Sequence[int]) -> float:
        """Check on a few token ids that the scorer's logits are the model's own (see
        :func:`rapo_echo.logprobs.check_logit_transform`); returns the largest difference. ZeRO-3
        weights (partitioned as they load) are gathered for it (every rank must call it)."""
        with full_parameters(self.lm):
            return check_logit_transform(self.lm, self.transform, list(probe_ids))

    def _head(self, temperature: float | torch.Tensor) -> dict[str, Any]:
        """The LM head's arguments to the chunked log-prob functions."""
        head = self.lm.get_output_embeddings()
        return {
            "weight": head.weight,
            "bias": getattr(head, "bias", None),
            "temperature": temperature,
            "transform": self.transform,
            "chunk_size": self.chunk_size,
        }

    def forward(
        self,
        inputs: dict[str, torch.Tensor],
        temperature: float | torch.Tensor = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
        gather_ids: torch.Tensor | None = None,
        with_values: bool = False,
    ) -> TokenScores:
        """Log-probs and entropies of the completion tokens (left-aligned), with ``with_values`` the value
        head's values and with ``gather_ids`` [B, n, k] the log-probs at those ids (for logit
        distillation): a :class:`TokenScores`. ``temperature``: one for every row, or one per row ([B])."""
        if with_values and self.value_head is None:
            raise ValueError("with_values needs a value head")
        hidden = self.target_hidden(inputs)
        head = self._head(temperature)
        logp, entropy = chunked_token_logprobs(
            hidden, targets=inputs["targets"], with_entropy=with_entropy, entropy_grad=entropy_grad, **head
        )
        values = self.value_head(hidden) if with_values and self.value_head is not None else None
        gathered = None
        if gather_ids is not None:
            gathered = chunked_gather_logprobs(hidden, ids=gather_ids, **head)
        return TokenScores(logp, entropy, values, gathered)

    def target_hidden(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Hidden states [B, n, H] that predict each completion token (either layout)."""
        decoder = self.lm.get_decoder()
        if "where" in inputs:
            hidden = decoder(
                input_ids=inputs["input_ids"],
                attention_mask=inputs["attention_mask"],
                position_ids=inputs["position_ids"],
                use_cache=False,
            ).last_hidden_state
            where = inputs["where"]
            return hidden.gather(1, where.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        from transformers import DynamicCache

        pmask, rows, targets = inputs["prompt_mask"], inputs["rows"], inputs["targets"]
        cache = DynamicCache(config=self.lm.config)
        positions = (pmask.cumsum(-1) - 1).clamp(min=0)
        prompt = decoder(
            input_ids=inputs["prompt_ids"],
            attention_mask=pmask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        cache.batch_select_indices(rows)  # each row reads its prompt's keys/values (differentiable)
        n = targets.shape[1]
        mask = torch.cat([pmask[rows], pmask.new_ones((rows.shape[0], n - 1))], dim=1)
        start = pmask.sum(-1)[rows]
        comp_pos = start[:, None] + torch.arange(n - 1, device=start.device)[None, :]
        first = prompt[:, -1][rows].unsqueeze(1)
        if n == 1:
            return first
        rest = decoder(
            input_ids=targets[:, :-1],
            attention_mask=mask,
            position_ids=comp_pos,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        return torch.cat([first, rest], dim=1)

    @torch.no_grad()
    def topk(self, batch: TokenBatch, k: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most likely ids and log-probs at each completion position of ``batch`` (left-aligned)."""
        dev = next(self.lm.parameters()).device
        hidden = self.target_hidden(batch.to(dev))
        return chunked_topk_logprobs(hidden, k=k, **self._head(temperature))


def disable_dropout(model: nn.Module) -> int:
    """Turn the model's own dropout off: ``p = 0`` on every ``nn.Dropout`` and 0 for the attention
    dropout rates that attention modules read in train mode, keeping LoRA's (``model.lora.dropout``).
    Train mode -- which the training forward needs for gradient checkpointing and LoRA dropout --
    then changes nothing else. Returns how many modules were changed."""
    changed = 0
    for name, module in model.named_modules():
        if "lora_dropout" in name.split("."):
            continue
        if isinstance(module, nn.Dropout) and module.p:
            module.p = 0.0
            changed += 1
        for attr in ("attention_dropout", "attn_dropout", "dropout"):
            if isinstance(getattr(module, attr, None), float) and getattr(module, attr):
                setattr(module, attr, 0.0)
                changed += 1
    return changed


class Policy:
    """The policy model, its tokenizer, its generation engine and its reference.

    * LoRA (``model.lora.enabled``): only the adapter trains; the reference is the same model with
      the adapter disabled, so no second copy is held in memory.
    * Full fine-tuning: the reference is a frozen copy, made only when ``need_reference``.

    Dropout has one rule: the model's own dropout is off (:func:`disable_dropout`) and the model
    rests in eval mode, so sampling and every scoring forward (old and reference log-probs, the
    ``token_kl`` teacher, roles sharing the weights) are dropout-free; only the training forward,
    where the loss is taken, runs in train mode (:meth:`training_mode`), which applies LoRA dropout
    (``model.lora.dropout``) and gradient checkpointing (``model.gradient_checkpointing``).
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        rollout_cfg: RolloutConfig,
        *,
        need_reference: bool,
        device: str | None = None,
        shared_prompt_forward: bool = True,
    ) -> None:
        self.cfg = model_cfg
        self.shared_prompt_forward = shared_prompt_forward and not model_cfg.gradient_checkpointing
        self.rollout_cfg = rollout_cfg
        self.truncations = 0  # prompts cut to fit rollout.max_prompt_tokens (see take_truncations)
        self.resolved = resolve(model_cfg.name)
        # ``auto`` becomes the dtype used (bfloat16 on a CUDA GPU with it), so config.yaml records it
        model_cfg.dtype = resolve_dtype(model_cfg.dtype, pick_device(device or model_cfg.device))
        # what a saved adapter names as its base (models.portable_name; the Learner sets it for its run)
        self.base_name: str | None = None
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
            self.ref_lm = self._reference_copy(lm, device or model_cfg.device)
        if model_cfg.gradient_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if model_cfg.lora.enabled:
                lm.enable_input_require_grads()
        disable_dropout(lm)
        self.lm = lm.eval()
        self.need_reference = need_reference
        self.scorer = TokenScorer(lm)
        self.scorer.check(tokenizer("How are you feeling today?", add_special_tokens=False)["input_ids"])
        self.ref_scorer = TokenScorer(self.ref_lm) if self.ref_lm is not None else None
        rows = rollout_cfg.max_batch_size
        self.engine = HFEngine(
            lm,
            tokenizer,
            name="policy",
            max_batch_size=rows if isinstance(rows, int) else CPU_ROLLOUT_BATCH,  # the trainer resolves auto
            decode_loop=rollout_cfg.decode,
        )
        # A separate rollout engine (a vLLM copy the trainer keeps in sync), or None.
        self.rollout_engine: Any = None
        self._rollout_engines: list[Any] = []  # the DeepSpeed engines a rollout reads (attach_deepspeed)
        self._rollout_sized: list[Any] = []  # engines sized like the rollout (sized_like_rollout)

    def sized_like_rollout(self, engine: Any) -> Any:
        """Register an engine over the policy's weights that decodes with the rollout's rows per batch
        (``rollout.max_batch_size``, resolved after ``prepare``, see :meth:`set_rollout_batch_size`);
        returns it."""
        engine.max_batch_size = self.engine.max_batch_size
        self._rollout_sized.append(engine)
        return engine

    def set_rollout_batch_size(self, rows: int) -> None:
        """Rows per decode batch for the policy's engine and the engines registered with
        :meth:`sized_like_rollout`."""
        for engine in (self.engine, *self._rollout_sized):
            engine.max_batch_size = rows

    def _reference_copy(self, lm: nn.Module, device: str) -> nn.Module:
        """The frozen full fine-tuning reference: a copy of ``lm``, or, when ZeRO-3 partitioned ``lm`` as
        it loaded (a deep copy of partitioned parameters is not a model), the same weights loaded again
        (partitioned the same way)."""
        if not is_zero3_partitioned(lm):
            return copy.deepcopy(lm).eval().requires_grad_(False)
        ref, _ = load_model(
            self.resolved,
            dtype=self.cfg.dtype,
            device=device,
            trust_remote_code=self.cfg.trust_remote_code,
            attn_implementation=self.cfg.attn_implementation,
        )
        return ref.eval().requires_grad_(False)

    def attach_deepspeed(self, accelerator: Any, wrapped: Any, roles: Sequence[Any] = ()) -> None:
        """After ``accelerator.prepare`` wrapped the scorer (``wrapped``) in a DeepSpeed engine: under
        ZeRO-3 the scorer's forward gathers the output head it applies (audit D2); a full fine-tuning
        reference becomes a DeepSpeed engine of its own, sharded under ZeRO-3 (audit D4); and
        :meth:`generation_view` learns which engines a rollout reads (the reference's too when one of
        ``roles`` generates with it). Every rank must call it."""
        self._rollout_engines = [wrapped]
        register_head_parameters(self.scorer, self.lm)
        if self.ref_scorer is not None and self.ref_lm is not None:
            ref = inference_engine(accelerator, self.ref_scorer)
            register_head_parameters(self.ref_scorer, self.ref_lm)
            self.ref_scorer = ref
            if any(getattr(r, "model", None) is self.ref_lm for r in roles):
                self._rollout_engines.append(ref)

    def generation_view(self) -> contextlib.AbstractContextManager[None]:
        """The context a rollout runs in: under ZeRO-3 the weights it reads are gathered once and
        DeepSpeed's hooks are off (:func:`rapo_echo.distributed.generation_view`); otherwise nothing."""
        return generation_view(self._rollout_engines)

    @contextlib.contextmanager
    def training_mode(self) -> Iterator[None]:
        """Train mode for a training forward and its backward (gradient checkpointing recomputes the
        forward during backward, so both must see the same mode); each module's mode is restored."""
        modes = [(m, m.training) for m in self.lm.modules()]
        self.lm.train()
        try:
            yield
        finally:
            for m, training in modes:
                m.training = training

    @property
    def generator(self) -> Any:
        """What samples rollouts: the separate rollout engine if set, else ``engine``."""
        return self.rollout_engine if self.rollout_engine is not None else self.engine

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
        try:
            return get_peft_model(lm, lora)
        except ValueError as exc:
            if "not found" not in str(exc) and "did not match" not in str(exc):
                raise
            names = sorted({n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if isinstance(m, nn.Linear)})
            raise ConfigError(
                f"model.lora.target_modules: {cfg.lora.target_modules!r} matches no module of this model "
                f"({exc}); its linear layers are named {', '.join(names)}; use some of these, or all-linear"
            ) from None

    @property
    def pad_id(self) -> int:
        return self.engine.pad_id

    def rollout_decode_shape(
        self, scenarios: Sequence[Scenario], *, dialogue_prompts: bool
    ) -> tuple[int, int]:
        """(rows, length) of one rollout chunk's decode, the shape the trainer pins: rows = the
        prompts of a chunk (``rollout.batch_size``, at most ``max_batch_size // group_size``) times
        ``group_size``; length = the longest prompt (of ``scenarios``, or ``rollout.max_prompt_tokens``
        when ``dialogue_prompts`` grow during the rollout) plus ``max_new_tokens``."""
        r = self.rollout_cfg
        rows = min(r.batch_size, max(1, self.engine.max_batch_size // r.group_size)) * r.group_size
        if dialogue_prompts or not scenarios:
            longest = r.max_prompt_tokens
        else:
            longest = max(len(self.prompt_ids(s)) for s in scenarios)
        return rows, longest + r.max_new_tokens

    @property
    def is_lora(self) -> bool:
        return self.cfg.lora.enabled

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters the optimizer updates (the model's, or its adapter's, and a value head's)."""
        return [p for p in self.scorer.parameters() if p.requires_grad]

    def add_value_head(self) -> ValueHead:
        """Attach a :class:`ValueHead` (float32, on the model's device) to the scorer; it is saved
        with every checkpoint (``value_head.safetensors``) and restored on resume."""
        if self.scorer.value_head is None:
            head = ValueHead(int(self.lm.config.hidden_size)).to(self.device)
            self.scorer.value_head = head
        return self.scorer.value_head  # type: ignore[return-value]  # set just above when None

    # ------------------------------------------------------------------ prompts
    def conversation(self, scenario: Scenario) -> Conversation:
        """The policy's prompt for a scenario: the configured system prompt (unless the scenario has
        one) followed by the visible dialogue."""
        return policy_conversation(scenario, self.rollout_cfg.system_prompt)

    def prompt_ids(self, scenario: Scenario | Conversation) -> list[int]:
        """Token ids of the prompt, cut to ``rollout.max_prompt_tokens`` by whole turns from the oldest
        (never the system prompt; see :func:`~rapo_echo.prompting.fit_prompt`); cuts are counted."""
        conv = self.conversation(scenario) if isinstance(scenario, Scenario) else list(scenario)
        ids, cut = fit_prompt(conv, self.engine.encode, self.rollout_cfg.max_prompt_tokens)
        self.truncations += cut
        return ids

    def take_truncations(self) -> int:
        """How many prompts were cut since the last call (and reset the count)."""
        n, self.truncations = self.truncations, 0
        return n

    # ------------------------------------------------------------------ scoring
    def reference_logprobs(self, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
        """Per-token log-probs under the reference (adapter off under LoRA), no gradient."""
        if not self.need_reference:
            raise RuntimeError("this policy was built without a reference (beta = 0)")
        inputs = batch.to(self.device)
        with torch.no_grad():
            if self.is_lora:
                with self.lm.disable_adapter():
                    return self.scorer(inputs, temperature)[0]
            assert self.ref_scorer is not None
            return self.ref_scorer(inputs, temperature)[0]

    def batch(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        loss_masks: Sequence[Sequence[int] | None] | None = None,
    ) -> TokenBatch:
        """A scoring batch in the fastest layout this model allows (shared prompts unless gradient
        checkpointing is on, which disables the KV cache the shared layout needs)."""
        return collate(
            prompts, completions, self.pad_id, shared=self.shared_prompt_forward, loss_masks=loss_masks
        )

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the LM head computes in (a LoRA adapter may be kept in float32 beside it)."""
        return self.lm.get_output_embeddings().weight.dtype

    # ------------------------------------------------------------------ saving
    def save(
        self,
        path: str | Path,
        *,
        merged: bool = False,
        state_dict: dict[str, Any] | None = None,
        value_state: dict[str, Any] | None = None,
    ) -> None:
        """Save the model in Hugging Face format (adapter only under LoRA unless ``merged``) plus the
        tokenizer; plain transformers (or peft, for an adapter) loads the folder. ``state_dict`` gives
        the weights when they live elsewhere (gathered from DeepSpeed ZeRO-3 partitions). A value head
        is written beside them as ``value_head.safetensors`` (``value_state``: its gathered weights)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        model: Any = self.lm
        if self.is_lora and merged:
            model = copy.deepcopy(self.lm).merge_and_unload()
        elif self.is_lora:
            model.peft_config["default"].base_model_name_or_path = self.base_name or self.resolved.path
        kwargs = {"state_dict": state_dict} if state_dict is not None and not merged else {}
        model.save_pretrained(path, safe_serialization=True, **kwargs)
        self.tokenizer.save_pretrained(path)
        if self.scorer.value_head is not None or value_state is not None:
            from safetensors.torch import save_file

            state = value_state if value_state is not None else self.scorer.value_head.state_dict()
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in state.items()}, str(path / VALUE_HEAD_FILE)
            )

    def load(self, folder: str | Path) -> None:
        """Load the weights a checkpoint folder holds into this policy: the adapter under LoRA, all weights
        otherwise, and the value head when this policy has one (a damaged file is named, with the way on)."""
        folder = Path(folder)
        if self.is_lora:
            from peft import set_peft_model_state_dict

            path = folder / "adapter_model.safetensors"
            if not path.is_file():
                raise RapoEchoError(f"checkpoint {folder} holds no adapter_model.safetensors")
            set_peft_model_state_dict(self.lm, read_weights(path))
            self._load_value_head(folder)
            return
        self._load_value_head(folder)
        files = sorted(f for f in folder.glob("*.safetensors") if f.name != VALUE_HEAD_FILE)
        if not files:
            raise RapoEchoError(f"checkpoint {folder} holds no *.safetensors weights")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(read_weights(f))
        missing, unexpected = self.lm.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(self.lm.config, "tie_word_embeddings", False) else set()
        missing = [m for m in missing if m not in tied]
        if missing or unexpected:
            raise RapoEchoError(
                f"checkpoint {folder} does not match the model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )

    def _load_value_head(self, folder: Path) -> None:
        """Restore a PPO value head saved beside the checkpoint's weights."""
        head = self.scorer.value_head
        if head is None:
            return
        path = folder / VALUE_HEAD_FILE
        if not path.is_file():
            raise RapoEchoError(
                f"checkpoint {folder} holds no {VALUE_HEAD_FILE}, but this run trains a value head"
            )
        head.load_state_dict(read_weights(path))
