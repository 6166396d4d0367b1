"""The ``train`` section: optimizer, schedule, batching, checkpoints and stop rules."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rapo_echo.config.base import AutoLR, AutoSize, Strict


class TrainConfig(Strict):
    """Optimisation and bookkeeping of a run."""

    max_steps: int = Field(100, ge=1, description="Training steps (one rollout and its updates each).")
    lr: AutoLR = Field(
        "auto",
        description="Learning rate, or `auto`: from the model's size and LoRA (1e-4 full / 1e-3 LoRA at"
        " 135M).",
    )
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0, description="AdamW beta2.")
    adam_eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon.")
    scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning-rate schedule."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps of the schedule.")
    inner_epochs: int = Field(1, ge=1, le=64, description="Passes over one rollout (old log-probs stored).")
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per pass.")
    micro_batch_size: AutoSize = Field(
        "auto",
        description="Sequences per forward/backward (`auto`: 8 on a CPU, sized from free memory on a GPU).",
    )
    micro_batch_tokens: int = Field(
        8192,
        ge=1,
        description="`micro_batch_size: auto` on a GPU: the smallest power of two of sequences holding this "
        "many tokens (enough to keep the device busy), capped by what fits in memory.",
    )
    max_grad_norm: float | None = Field(
        1.0, gt=0.0, description="Gradient clipping norm (None: no clipping)."
    )
    seed: int = Field(
        0, ge=0, le=2**32 - 1, description="Seed of every random generator (0 to 2**32 - 1, numpy's range)."
    )
    save_every: int = Field(50, ge=1, description="Checkpoint every this many steps (and at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept on disk (older ones are deleted).")
    save_optimizer: bool = Field(
        True,
        description="Checkpoints hold the optimizer state (a resume continues exactly; twice the weights' "
        "size under AdamW). Off: weights, schedule, RNG and data position only (a resume restarts AdamW's "
        "moments). `final/` never holds it.",
    )
    max_nonfinite: int = Field(3, ge=1, description="Non-finite losses in a row before the run stops.")
    max_invalid_steps: int = Field(
        3,
        ge=1,
        description="Steps in a row without one valid sample (every reward invalid) before the run stops.",
    )
    shared_prompt_forward: bool = Field(
        True,
        description="One prompt forward per group sharing it (off, or with gradient checkpointing: each "
        "sequence whole).",
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads (None: torch's default).")
    stop_on_alarm: bool = Field(
        False,
        description="End the run cleanly (checkpoint, resumable) at the first step a monitor signature fires"
        " (docs/monitor.md).",
    )

    @property
    def micro_batch(self) -> int:
        """``micro_batch_size`` as the Learner sized it (``auto`` is resolved before the first rollout)."""
        if isinstance(self.micro_batch_size, str):
            raise RuntimeError("train.micro_batch_size: 'auto' is read before the Learner sized it")
        return self.micro_batch_size
