"""``train.lr: auto``: a learning rate inversely proportional to the model's size, between two anchors
(the line between them is a rule of thumb: larger models want smaller steps), LoRA ``LORA_FACTOR`` x.

* 135M parameters: full fine-tuning at 1e-4 and LoRA at 1e-3 learn a verifiable reward within 12 GRPO
  steps, 1e-5 does not (``studies/sweep_defaults.py``, docs/performance.md);
* 7-8B models: full-parameter RL runs use about 1e-6 (RLVER's recipe, Critique-GRPO), the floor,
  reached at 13.5B parameters.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

REFERENCE_PARAMS = 135_000_000
FULL_LR_AT_REFERENCE = 1e-4
FULL_LR_FLOOR = 1e-6
LORA_FACTOR = 10.0


def auto_lr(params: int, lora: bool) -> float:
    """The ``auto`` learning rate for a model of ``params`` parameters (the base model's, adapters not
    counted), trained in full or through LoRA."""
    if params <= 0:
        raise ValueError(f"params must be > 0, got {params}")
    full = min(FULL_LR_AT_REFERENCE, max(FULL_LR_FLOOR, FULL_LR_AT_REFERENCE * REFERENCE_PARAMS / params))
    return full * LORA_FACTOR if lora else full


def base_parameter_count(named_parameters: Iterable[tuple[str, Any]]) -> int:
    """Parameters of the base model: LoRA adapters left out, shared (tied) tensors counted once, and
    ZeRO-3 partitioned tensors by their full size (``ds_numel``)."""
    seen: set[int] = set()
    total = 0
    for name, p in named_parameters:
        if "lora_" in name or id(p) in seen:
            continue
        seen.add(id(p))
        total += int(getattr(p, "ds_numel", 0) or p.numel())
    return total


def count_parameters_of(path: str, *, trust_remote_code: bool = False) -> int:
    """Parameters of the model at ``path`` without loading its weights (built on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return base_parameter_count(model.named_parameters())


def lr_record(asked: Any, used: float, params: int | None, lora: bool) -> dict[str, Any]:
    """What ``resolved.json`` says about the learning rate."""
    record: dict[str, Any] = {"asked": asked, "used": used}
    if asked == "auto":
        record["basis"] = {
            "params": params,
            "lora": lora,
            "rule": f"min({FULL_LR_AT_REFERENCE:g}, max({FULL_LR_FLOOR:g}, {FULL_LR_AT_REFERENCE:g} * "
            f"{REFERENCE_PARAMS:d} / params))" + (f" * {LORA_FACTOR:g} (LoRA)" if lora else ""),
        }
    return record


def resolve_lr(train: Any, lora: bool, model: Any) -> dict[str, Any]:
    """Replace ``train.lr: auto`` by the rate for ``model``'s size (in place); what ``resolved.json``
    says about it (:func:`lr_record`)."""
    if train.lr != "auto":
        return lr_record(train.lr, train.lr, None, lora)
    params = base_parameter_count(model.named_parameters())
    train.lr = auto_lr(params, lora)
    log.info(
        "auto learning rate: train.lr=%g (%d parameters, %s)", train.lr, params, "LoRA" if lora else "full"
    )
    return lr_record("auto", train.lr, params, lora)
