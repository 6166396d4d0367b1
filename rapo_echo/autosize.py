"""``auto`` batch sizes: ``train.micro_batch_size`` and ``rollout.max_batch_size`` sized from the
device's free memory and the model on a GPU, the tuned CPU values on a CPU.

On a GPU, after ``accelerator.prepare`` (so the measure sees the model as it trains: its reference,
DeepSpeed's shards, float32 master weights and buffers), the free memory is measured and what the
optimizer step will still allocate is set aside (:func:`pending_optimizer_bytes`: gradients and
AdamW's two moments, sharded over the ranks under ZeRO), and under ZeRO-3 the rest of the 16-bit
weights, which every rank gathers for the rollout (audit D5). Of the rest, :data:`TRAIN_SHARE` goes
to training activations and :data:`ROLLOUT_SHARE` to the rollout's KV cache (the static decode
buffers stay allocated between steps, so the two shares must add up to less than all of it). Per
sequence, training keeps about ``34 * hidden * layers`` activation bytes per token at 16 bits
(Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", without
the attention-score term that SDPA does not store) over the prompt's share (prompts run once per
group) plus the reply; a rollout row holds its KV cache for the longest prompt plus the reply and a
few vocabulary-wide float rows for sampling. Both sizes are rounded down to a power of two and
clamped. The resolved values and the figures behind them are written to the run directory
(``config.yaml`` holds the values, ``resolved.json`` the basis).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

CPU_MICRO_BATCH = 8  # measured best on the shared CPU workload (docs/results.md, "Performance")
CPU_ROLLOUT_BATCH = 64
TRAIN_SHARE = 0.45
ROLLOUT_SHARE = 0.3
MAX_MICRO_BATCH = 256
MAX_ROLLOUT_BATCH = 1024
ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN = 34  # at 16-bit; scaled by the dtype's size / 2
SAMPLING_VOCAB_ROWS = 6  # float32 vocabulary rows per decoding row (logits, log-softmax, sampling)


@dataclass
class BatchSizes:
    """Resolved sizes and what they were computed from (written to ``resolved.json``)."""

    micro_batch_size: int
    rollout_max_batch_size: int
    device: str
    basis: dict[str, Any]


def free_device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device (``torch.cuda.mem_get_info``)."""
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def _power_of_two_at_most(x: float, low: int, high: int) -> int:
    n = low
    while n * 2 <= min(x, high):
        n *= 2
    return n


def pending_optimizer_bytes(
    trainable_params: int,
    param_bytes: int,
    *,
    deepspeed: bool = False,
    zero_stage: int = 0,
    world: int = 1,
    bucket_elements: int = 0,
) -> int:
    """Bytes the first optimizer step will still allocate after ``prepare`` (an estimate for AdamW).

    Without DeepSpeed: the gradients in the weights' dtype and AdamW's two moments, float32 when the
    weights are 16-bit (they train through float32 master weights, whose copies exist already, see
    :mod:`rapo_echo.master_weights`), else in the weights' dtype. Under DeepSpeed (its float32 master
    partition exists after ``prepare``; torch's AdamW makes its moments at the first step): the two
    float32 moments of this rank's partition (``trainable / world`` from ZeRO-1 on) and the float32
    gradient partition, plus, from ZeRO-2 on, the reduce bucket of ``bucket_elements`` 16-bit values,
    or under ZeRO-1 the whole 16-bit gradients."""
    if not deepspeed:
        moment = 4 if param_bytes < 4 else param_bytes
        return trainable_params * (param_bytes + 2 * moment)
    shard = math.ceil(trainable_params / world) if zero_stage >= 1 else trainable_params
    grads = bucket_elements * param_bytes if zero_stage >= 2 else trainable_params * param_bytes
    return 2 * 4 * shard + 4 * shard + grads


def gpu_batch_sizes(
    *,
    free_bytes: int,
    model_config: Any,
    trainable_params: int,
    param_bytes: int,
    prompt_tokens: int,
    new_tokens: int,
    group_size: int,
    shared_prompt_forward: bool,
    gradient_checkpointing: bool,
    optimizer_bytes: int | None = None,
    gathered_bytes: int = 0,
) -> tuple[int, int, dict[str, Any]]:
    """(micro-batch, rollout batch, basis) for a GPU with ``free_bytes`` free after loading.
    ``optimizer_bytes``: what the optimizer step will still allocate (default: an unsharded AdamW on
    16-bit weights without master copies, 3 x the trainable weights' bytes; see
    :func:`pending_optimizer_bytes`); ``gathered_bytes``: weights gathered for the rollout on top of
    what is resident (ZeRO-3)."""
    cfg = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    layers, hidden = cfg.num_hidden_layers, cfg.hidden_size
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or hidden // cfg.num_attention_heads
    optimizer = trainable_params * param_bytes * 3 if optimizer_bytes is None else optimizer_bytes
    usable = max(0, free_bytes - optimizer - gathered_bytes)
    scale = param_bytes / 2
    per_token = ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN * hidden * layers * scale
    if gradient_checkpointing:
        per_token = hidden * layers * param_bytes + per_token / layers  # layer inputs + one layer
    prompt_share = prompt_tokens / group_size if shared_prompt_forward else prompt_tokens
    seq_bytes = per_token * (prompt_share + new_tokens)
    micro = _power_of_two_at_most(TRAIN_SHARE * usable / seq_bytes, 1, MAX_MICRO_BATCH)
    kv_per_token = 2 * layers * heads * head_dim * param_bytes
    row_bytes = kv_per_token * (prompt_tokens + new_tokens) + SAMPLING_VOCAB_ROWS * cfg.vocab_size * 4
    rollout = _power_of_two_at_most(ROLLOUT_SHARE * usable / row_bytes, 8, MAX_ROLLOUT_BATCH)
    basis = {
        "free_bytes": free_bytes,
        "optimizer_bytes": optimizer,
        "gathered_bytes": gathered_bytes,
        "train_bytes_per_sequence": round(seq_bytes),
        "rollout_bytes_per_row": round(row_bytes),
        "train_share": TRAIN_SHARE,
        "rollout_share": ROLLOUT_SHARE,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
    }
    return micro, rollout, basis


def full_numel(param: torch.Tensor) -> int:
    """A parameter's element count, its full size for a ZeRO-3 partitioned one (``ds_numel``)."""
    return int(getattr(param, "ds_numel", 0) or param.numel())


def resolve_batch_sizes(
    cfg: Any,
    lm: Any,
    device: torch.device,
    *,
    deepspeed: bool = False,
    zero_stage: int = 0,
    world: int = 1,
    bucket_elements: int = 0,
) -> BatchSizes:
    """Resolve the ``auto`` entries of ``cfg.train.micro_batch_size`` and
    ``cfg.rollout.max_batch_size`` for ``lm`` on ``device`` (set values are kept); call it after
    ``prepare``, with the DeepSpeed layout (``deepspeed``, ``zero_stage``, ``world`` ranks, the
    ``bucket_elements`` of its reduce bucket) when there is one."""
    micro, rollout = cfg.train.micro_batch_size, cfg.rollout.max_batch_size
    basis: dict[str, Any] = {}
    if device.type == "cuda" and "auto" in (micro, rollout):
        params = list(lm.parameters())
        trainable = sum(full_numel(p) for p in params if p.requires_grad)
        param_bytes = params[0].element_size()
        pending = pending_optimizer_bytes(
            trainable,
            param_bytes,
            deepspeed=deepspeed,
            zero_stage=zero_stage,
            world=world,
            bucket_elements=bucket_elements,
        )
        gathered = 0
        if zero_stage == 3:  # the rollout gathers every weight; this rank holds 1/world of them
            gathered = sum(full_numel(p) * p.element_size() for p in params) * (world - 1) // world
        gpu_micro, gpu_rollout, basis = gpu_batch_sizes(
            free_bytes=free_device_memory(device)[0],
            model_config=lm.config,
            trainable_params=trainable,
            param_bytes=param_bytes,
            optimizer_bytes=pending,
            gathered_bytes=gathered,
            prompt_tokens=cfg.rollout.max_prompt_tokens,
            new_tokens=cfg.rollout.max_new_tokens,
            group_size=cfg.rollout.group_size,
            shared_prompt_forward=cfg.train.shared_prompt_forward,
            gradient_checkpointing=cfg.model.gradient_checkpointing,
        )
        micro = gpu_micro if micro == "auto" else micro
        rollout = gpu_rollout if rollout == "auto" else rollout
    else:
        micro = CPU_MICRO_BATCH if micro == "auto" else micro
        rollout = CPU_ROLLOUT_BATCH if rollout == "auto" else rollout
    return BatchSizes(int(micro), int(rollout), str(device), basis)


def as_record(sizes: BatchSizes, asked: dict[str, Any]) -> dict[str, Any]:
    """The ``resolved.json`` record: what was asked, what was used, and why."""
    return {
        "asked": asked,
        "train.micro_batch_size": sizes.micro_batch_size,
        "rollout.max_batch_size": sizes.rollout_max_batch_size,
        **{k: v for k, v in asdict(sizes).items() if k in ("device", "basis")},
    }
