"""The per-GPU memory model and ``auto`` batch sizes: one home for both, so the trainer's
``train.micro_batch_size`` / ``rollout.max_batch_size`` and the ``train --dry-run`` plan
(:mod:`rapo_echo.training.plan`) come from the same arithmetic.

**Memory model** (bytes per GPU; ``b`` = the weights' element size, ``t`` = the trainable parameters'):

* weights: parameters x ``b`` (divided by the process count under ZeRO-3, where each rank gathers the
  rest for the rollout: the ``gathered`` term);
* reference: a frozen full copy, parameters x ``b``, when full fine-tuning scores a KL (``loss.beta`` >
  0); LoRA's reference is the base with the adapter off, no copy;
* gradients: trainable x ``t`` (divided by the process count under ZeRO-2/3);
* optimizer: AdamW's two moments, trainable x ``2t``; with fp32 master weights (DeepSpeed in bf16, or a
  16-bit policy's masters) 12 bytes a trainable parameter (master, two moments in fp32); divided by the
  process count under any ZeRO stage;
* training activations, per token of a sequence and per layer, the tensors a decoder layer keeps for
  its backward pass (no dropout: the policy's is off): the two RMSNorm inputs and the two projections'
  inputs (``4h``), queries and attention output (``2 * heads * head_dim``), keys and values
  (``2 * kv_heads * head_dim``), and the gated MLP's gate, up, activation and product (``4 * I``), all
  times ``b``. With gradient checkpointing, one ``h`` a layer plus one layer's worth. A sequence counts
  its reply plus its prompt's share of the group (the shared-prompt layout runs a prompt once per
  group); a micro-batch adds the LM head's chunk of float32 logits (:data:`LOGIT_CHUNK_TOKENS` x vocab,
  three live copies);
* a rollout row: its KV cache over the longest prompt plus the reply (``2 * layers * kv_heads *
  head_dim * b`` a token) and a few float32 vocabulary rows for sampling.

**Selection rule** (on a GPU; a CPU keeps the measured CPU values): :data:`TRAIN_SHARE` and
:data:`ROLLOUT_SHARE` of the memory left once the model and the state not yet allocated are set aside;
the *smallest* power of two that keeps the device busy (``train.micro_batch_tokens`` tokens, at least
:data:`ROLLOUT_ROWS_TARGET` rollout rows), capped by what fits (docs/scaling.md). When not even the
smallest fits, ``basis["fits"]`` is False.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch

CPU_MICRO_BATCH = 8  # measured best on the shared CPU workload (docs/results.md, "Performance")
CPU_ROLLOUT_BATCH = 64
TRAIN_SHARE = 0.45
ROLLOUT_SHARE = 0.3
MAX_MICRO_BATCH = 256
MAX_ROLLOUT_BATCH = 1024
MIN_ROLLOUT_BATCH = 8
ROLLOUT_ROWS_TARGET = 256
DEFAULT_MICRO_BATCH_TOKENS = 8192
SAMPLING_VOCAB_ROWS = 6  # float32 vocabulary rows per decoding row (logits, log-softmax, sampling)
LOGIT_CHUNK_TOKENS = 512  # TokenScorer's LM-head chunk (rapo_echo.policy.TokenScorer.chunk_size)
LOGIT_COPIES = 3  # float32 logits, their log-softmax and its gradient, live at once
MASTER_BYTES_PER_PARAM = 12  # fp32 master weight + two fp32 AdamW moments
STATE_TERMS = ("weights", "reference", "gradients", "optimizer", "vllm", "gathered")
# The memory a CUDA process holds before any tensor (context, cuBLAS workspace, allocator slack); the
# plan subtracts it from the card's size, the runtime measures free memory instead.
CUDA_CONTEXT_BYTES = 1 << 30


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs of a decoder-only transformer, read from its ``config.json``."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    biased: tuple[str, ...] = ()  # the linear layers (names of linear_shapes) that carry a bias

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        """From a transformers config (or any object with its attribute names)."""
        cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = cfg.num_attention_heads
        hidden = cfg.hidden_size
        return cls(
            layers=cfg.num_hidden_layers,
            hidden=hidden,
            intermediate=getattr(cfg, "intermediate_size", None) or 4 * hidden,
            heads=heads,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or hidden // heads,
            vocab=cfg.vocab_size,
            tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            biased=_biased_linears(cfg),
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer, by its usual module name."""
        h, i = self.hidden, self.intermediate
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def parameter_count(self) -> int:
        """Parameters of the model: embeddings (and an untied LM head), per layer the linear weights,
        their biases where the model has them and two norms, and the final norm."""
        shapes = self.linear_shapes()
        linear = sum(a * b for a, b in shapes.values())
        bias = sum(shapes[name][1] for name in self.biased)
        per_layer = linear + bias + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return embeddings + self.layers * per_layer + self.hidden

    def lora_parameter_count(self, r: int, targets: str | Iterable[str]) -> int:
        """Parameters of a rank-``r`` LoRA adapter on ``targets`` (``all-linear``: every linear layer of
        the decoder layers, as PEFT reads it; else module names, matched by their last part)."""
        shapes = self.linear_shapes()
        names = list(shapes) if targets == "all-linear" else [str(t).rsplit(".", 1)[-1] for t in targets]
        return self.layers * sum(r * (shapes[n][0] + shapes[n][1]) for n in names if n in shapes)

    def kv_bytes_per_token(self, elem_bytes: int) -> int:
        """KV cache bytes of one token over every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * elem_bytes

    def activation_bytes_per_token(self, elem_bytes: int, gradient_checkpointing: bool = False) -> int:
        """Training activations kept for the backward pass, per token (see the module docstring)."""
        per_layer = (
            4 * self.hidden
            + 2 * self.heads * self.head_dim
            + 2 * self.kv_heads * self.head_dim
            + 4 * self.intermediate
        ) * elem_bytes
        if gradient_checkpointing:
            return self.layers * self.hidden * elem_bytes + per_layer
        return self.layers * per_layer


def _biased_linears(cfg: Any) -> tuple[str, ...]:
    """Which linear layers carry a bias: Qwen2's query/key/value always; Llama-style configs say so with
    ``attention_bias`` (all four attention projections) and ``mlp_bias``."""
    names: tuple[str, ...] = ()
    if getattr(cfg, "model_type", "") == "qwen2":
        names += ("q_proj", "k_proj", "v_proj")
    elif getattr(cfg, "attention_bias", False):
        names += ("q_proj", "k_proj", "v_proj", "o_proj")
    if getattr(cfg, "mlp_bias", False):
        names += ("gate_proj", "up_proj", "down_proj")
    return names


@dataclass(frozen=True)
class Training:
    """How the policy is trained, as far as memory goes."""

    total_params: int  # every parameter, adapter included
    trainable_params: int
    weight_bytes: int  # element size of the (frozen) weights
    trainable_bytes: int  # element size of the trainable parameters (PEFT keeps adapters in fp32)
    reference_copy: bool = False  # a frozen full copy for the KL (full fine-tuning, beta > 0)
    zero_stage: int = 0
    world_size: int = 1
    master_weights: bool | None = None  # None: fp32 masters where the trainable parameters are 16-bit
    gathers_for_rollout: bool = True  # ZeRO-3 with an hf rollout gathers the whole model (vLLM: one tensor)

    @property
    def masters(self) -> bool:
        return self.trainable_bytes < 4 if self.master_weights is None else self.master_weights


def state_bytes(t: Training, vllm_bytes: int = 0) -> dict[str, int]:
    """Per-GPU bytes of the model state: weights, reference, gradients, optimizer, vLLM share, and under
    ZeRO-3 the weights gathered for the rollout."""
    world = max(1, t.world_size)
    weights = t.total_params * t.weight_bytes / (world if t.zero_stage >= 3 else 1)
    reference = weights if t.reference_copy else 0  # DeepSpeed shards it like the policy under ZeRO-3
    gradients = t.trainable_params * t.trainable_bytes / (world if t.zero_stage >= 2 else 1)
    per_param = MASTER_BYTES_PER_PARAM if t.masters else 2 * t.trainable_bytes
    optimizer = t.trainable_params * per_param / (world if t.zero_stage >= 1 else 1)
    # ZeRO-3: the rest of the weights, which every rank gathers for the rollout (audit D5)
    gathered = t.total_params * t.weight_bytes - weights if t.zero_stage >= 3 and t.gathers_for_rollout else 0
    values = (weights, reference, gradients, optimizer, vllm_bytes, gathered)
    return {k: math.ceil(v) for k, v in zip(STATE_TERMS, values)}


@dataclass(frozen=True)
class Workload:
    """The sequence sizes of a run (``rollout`` and ``train`` sections)."""

    prompt_tokens: int
    new_tokens: int
    group_size: int
    shared_prompt_forward: bool = True
    gradient_checkpointing: bool = False
    micro_batch_tokens: int = DEFAULT_MICRO_BATCH_TOKENS

    @property
    def train_tokens_per_sequence(self) -> float:
        prompt = self.prompt_tokens / self.group_size if self.shared_prompt_forward else self.prompt_tokens
        return prompt + self.new_tokens


def sequence_bytes(shape: ModelShape, w: Workload, elem_bytes: int) -> int:
    """Training activation bytes of one sequence."""
    per_token = shape.activation_bytes_per_token(elem_bytes, w.gradient_checkpointing)
    return round(per_token * w.train_tokens_per_sequence)


def logit_bytes(shape: ModelShape) -> int:
    """Bytes of the LM head's float32 logit chunk, once per micro-batch."""
    return LOGIT_COPIES * LOGIT_CHUNK_TOKENS * shape.vocab * 4


def row_bytes(shape: ModelShape, w: Workload, elem_bytes: int) -> int:
    """Bytes of one decoding row: its KV cache and the sampling rows."""
    kv = shape.kv_bytes_per_token(elem_bytes) * (w.prompt_tokens + w.new_tokens)
    return kv + SAMPLING_VOCAB_ROWS * shape.vocab * 4


def _power_of_two_at_most(x: float, low: int, high: int) -> int:
    n = low
    while n * 2 <= min(x, high):
        n *= 2
    return n


def _power_of_two_at_least(x: float, low: int, high: int) -> int:
    n = low
    while n < x and n < high:
        n *= 2
    return n


def smallest_saturating(want: float, budget: float, item: float, *, low: int, high: int) -> tuple[int, bool]:
    """(size, fits): the smallest power of two >= ``want`` (within [low, high]), capped by the largest
    whose ``size * item`` fits ``budget``; ``fits`` is False when not even ``low`` does."""
    wanted = _power_of_two_at_least(want, low, high)
    largest = _power_of_two_at_most(budget / item if item > 0 else high, low, high)
    return min(wanted, largest), low * item <= budget


def gpu_batch_sizes(
    *,
    free_bytes: int,
    shape: ModelShape,
    training: Training,
    workload: Workload,
    vllm_bytes: int = 0,
    allocated: Iterable[str] = ("weights", "reference"),
) -> tuple[int, int, dict[str, Any]]:
    """(micro-batch, rollout batch, basis) for a GPU with ``free_bytes`` free, where ``allocated`` names
    the state terms (:data:`STATE_TERMS`) already held in that memory; the others are set aside."""
    state = state_bytes(training, vllm_bytes)
    done = set(allocated)
    unknown = done - set(STATE_TERMS)
    if unknown:
        raise ValueError(f"allocated: unknown terms {sorted(unknown)}; known: {', '.join(STATE_TERMS)}")
    pending = sum(v for k, v in state.items() if k not in done)
    usable = max(0, free_bytes - pending)
    act = training.weight_bytes
    seq = sequence_bytes(shape, workload, act)
    logits = logit_bytes(shape)
    train_budget = TRAIN_SHARE * usable - logits
    micro, train_fits = smallest_saturating(
        workload.micro_batch_tokens / workload.train_tokens_per_sequence,
        train_budget,
        seq,
        low=1,
        high=MAX_MICRO_BATCH,
    )
    row = row_bytes(shape, workload, act)
    rollout, rollout_fits = smallest_saturating(
        ROLLOUT_ROWS_TARGET, ROLLOUT_SHARE * usable, row, low=MIN_ROLLOUT_BATCH, high=MAX_ROLLOUT_BATCH
    )
    basis = {
        "free_bytes": free_bytes,
        "state_bytes": state,
        "allocated": sorted(done),
        "pending_bytes": pending,
        "usable_bytes": usable,
        "train_bytes_per_sequence": seq,
        "train_tokens_per_sequence": round(workload.train_tokens_per_sequence, 2),
        "logit_chunk_bytes": logits,
        "rollout_bytes_per_row": row,
        "train_share": TRAIN_SHARE,
        "rollout_share": ROLLOUT_SHARE,
        "micro_batch_tokens": workload.micro_batch_tokens,
        "rollout_rows_target": ROLLOUT_ROWS_TARGET,
        "train_bytes": micro * seq + logits,
        "rollout_bytes": rollout * row,
        "fits": train_fits and rollout_fits,
        "prompt_tokens": workload.prompt_tokens,
        "new_tokens": workload.new_tokens,
    }
    return micro, rollout, basis


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


def _numel(p: torch.nn.Parameter) -> int:
    return int(getattr(p, "ds_numel", 0) or p.numel())  # a ZeRO-3 partition reports its full size


def training_of(
    lm: torch.nn.Module,
    *,
    reference_copy: bool,
    zero_stage: int = 0,
    world_size: int = 1,
    master_weights: bool | None = None,
    gathers_for_rollout: bool = True,
) -> Training:
    """The :class:`Training` of a loaded policy (sizes read from its parameters)."""
    params = list(lm.parameters())
    trainable = [p for p in params if p.requires_grad]
    frozen = [p for p in params if not p.requires_grad] or params
    return Training(
        total_params=sum(_numel(p) for p in params),
        trainable_params=sum(_numel(p) for p in trainable),
        weight_bytes=frozen[0].element_size(),
        trainable_bytes=(trainable or params)[0].element_size(),
        reference_copy=reference_copy,
        zero_stage=zero_stage,
        world_size=world_size,
        master_weights=master_weights,
        gathers_for_rollout=gathers_for_rollout,
    )


def workload_of(cfg: Any) -> Workload:
    """The :class:`Workload` of a run config (an SFT run's rows: prompt and reply within
    ``sft.max_length``)."""
    prompt, new = cfg.rollout.max_prompt_tokens, cfg.rollout.max_new_tokens
    sft = getattr(cfg, "sft", None)
    if sft is not None and hasattr(sft, "max_length"):
        prompt = min(prompt, sft.max_length - 1)
        new = sft.max_length - prompt
    return Workload(
        prompt_tokens=prompt,
        new_tokens=new,
        group_size=cfg.rollout.group_size,
        shared_prompt_forward=cfg.train.shared_prompt_forward,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        micro_batch_tokens=cfg.train.micro_batch_tokens,
    )


def resolve_batch_sizes(
    cfg: Any,
    lm: Any,
    device: torch.device,
    *,
    reference_copy: bool | None = None,
    zero_stage: int = 0,
    world_size: int = 1,
    master_weights: bool | None = None,
    allocated: Iterable[str] = ("weights", "reference"),
) -> BatchSizes:
    """Resolve the ``auto`` entries of ``cfg.train.micro_batch_size`` and
    ``cfg.rollout.max_batch_size`` for ``lm`` on ``device`` (set values are kept). ``reference_copy``
    (None: full fine-tuning with ``loss.beta`` > 0), the ZeRO stage, the process count and
    ``master_weights`` describe the optimizer state; ``allocated`` names the state terms already in
    the device's memory when this is called (a ``rollout.engine: vllm`` share not in it is set aside)."""
    micro, rollout = cfg.train.micro_batch_size, cfg.rollout.max_batch_size
    basis: dict[str, Any] = {}
    if device.type == "cuda" and "auto" in (micro, rollout):
        if reference_copy is None:
            reference_copy = not cfg.model.lora.enabled and cfg.loss.beta > 0
        free, total = free_device_memory(device)
        vllm = int(cfg.rollout.vllm_gpu_memory_utilization * total) if cfg.rollout.engine == "vllm" else 0
        gpu_micro, gpu_rollout, basis = gpu_batch_sizes(
            free_bytes=free,
            shape=ModelShape.of(lm.config),
            training=training_of(
                lm,
                reference_copy=reference_copy,
                zero_stage=zero_stage,
                world_size=world_size,
                master_weights=master_weights,
                gathers_for_rollout=cfg.rollout.engine != "vllm",
            ),
            workload=workload_of(cfg),
            vllm_bytes=vllm,
            allocated=allocated,
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
