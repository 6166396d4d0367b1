"""The ``model`` section: the trainable policy and its LoRA adapter."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rapo_echo.config.base import Device, Dtype, Strict
from rapo_echo.errors import ConfigError

# The attention implementations transformers knows by name (a hub kernel ``org/name`` is also accepted).
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")


class LoraConfig(Strict):
    """LoRA adapter of the policy (``model.lora``); under LoRA the reference is the base, adapter off."""

    enabled: bool = Field(False, description="Train a LoRA adapter instead of every weight.")
    r: int = Field(16, ge=1, le=1024, description="LoRA rank.")
    alpha: float = Field(32.0, gt=0, description="LoRA scaling alpha.")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="LoRA dropout (applied in the training forward only)."
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Modules the adapter wraps: a list of names, or every linear layer."
    )


class ModelConfig(Strict):
    """The trainable policy."""

    name: str = Field(
        "default",
        description="Policy model: `default` (the embedded SmolLM2-135M), a folder, a .gguf file or a hub"
        " id.",
    )
    dtype: Dtype = Field(
        "auto",
        description="Weights' dtype (`auto`: bfloat16 on a CUDA GPU that has it, else float32; TF32 matmuls"
        " for float32 on CUDA). 16-bit full fine-tuning keeps float32 master weights.",
    )
    device: Device = Field("auto", description="`auto`, `cpu`, `cuda`, `cuda:N` or `mps`.")
    trust_remote_code: bool = Field(False, description="Allow the model's own code from its repository.")
    attn_implementation: str | None = Field(
        None, description="transformers attention implementation (e.g. `sdpa`; None: its default)."
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass to save memory."
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapter.")

    @field_validator("attn_implementation")
    @classmethod
    def _attn(cls, v: str | None) -> str | None:
        if v is None or v in ATTN_IMPLEMENTATIONS or "/" in v:
            return v
        raise ValueError(
            f"unknown attention implementation; use one of {', '.join(ATTN_IMPLEMENTATIONS)}, a hub kernel "
            "id (org/name), or leave it out for transformers' default"
        )


def check_device(device: str, key: str, where: str = "") -> None:
    """Refuse a device this machine does not have (``cuda``, ``cuda:N``, ``mps``) at load, so a run never
    trains on the CPU while its config.yaml says otherwise."""
    if device in ("auto", "cpu"):
        return
    import torch

    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        if index >= count:
            have = f"{count} CUDA device(s) (cuda:0 to cuda:{count - 1})" if count else "no CUDA device"
            raise ConfigError(
                f"invalid config:\n  {where}{key}: got {device!r}, but this machine has {have}; "
                "use auto or cpu, or a device it has"
            )
    elif device == "mps" and not (torch.backends.mps.is_available()):
        raise ConfigError(
            f"invalid config:\n  {where}{key}: got 'mps', but this machine has no MPS device; use auto or cpu"
        )
