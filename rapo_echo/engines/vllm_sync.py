"""The trained policy's weights as vLLM takes them, and the arguments of the rollout engine's ``LLM``.

:func:`weights_for_vllm` yields ``(name, tensor)`` pairs one at a time under Hugging Face checkpoint names,
so at most one gathered tensor exists at once: a ZeRO-3 parameter (it carries ``ds_id``) is gathered alone;
a PEFT LoRA layer goes as ``W + s * B @ A`` computed into a float32 temporary, so the frozen base, which is
the reference, is never edited (PEFT's in-place merge / unmerge drifts a bf16 base by rounding).
:func:`rollout_llm_kwargs` gives the rollout copy's ``vllm.LLM`` arguments for one rank. docs/scaling.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

VLLM_DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default on a GPU (engine/arg_utils.py); our CPU tests stay below
LORA_ADAPTER_PARTS = ("lora_", "original_module")  # names of a PEFT adapter's own tensors


def is_zero3_param(param: Any) -> bool:
    """True for a parameter that DeepSpeed ZeRO-3 partitions (it must be gathered to be read)."""
    return hasattr(param, "ds_id")


@contextlib.contextmanager
def gathered(params: list[Any]) -> Iterator[None]:
    """Gather the ZeRO-3 partitioned ones among ``params`` for reading (no-op for ordinary tensors)."""
    parts = [p for p in params if is_zero3_param(p)]
    if not parts:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(parts, modifier_rank=None):
        yield


def is_peft_model(model: Any) -> bool:
    """True for a PEFT model (its LoRA layers are merged into temporaries when sent)."""
    return hasattr(model, "peft_config") and hasattr(model, "base_model")


def vllm_name(name: str) -> str:
    """A PEFT parameter name as the base model's checkpoint names it."""
    clean = name.removeprefix("base_model.model.").replace(".base_layer", "")
    if ".modules_to_save." in clean:  # modules_to_save.<adapter>.weight -> weight
        head, _, tail = clean.partition(".modules_to_save.")
        clean = head + "." + tail.partition(".")[2]
    return clean


def lora_layers(model: Any) -> dict[str, Any]:
    """``{name of the base layer's weight: LoRA layer}`` for every PEFT LoRA linear layer."""
    out: dict[str, Any] = {}
    for name, module in model.named_modules():
        if (
            hasattr(module, "lora_A")
            and hasattr(module, "base_layer")
            and hasattr(module, "get_delta_weight")
        ):
            out[f"{name}.base_layer.weight"] = module
    return out


def merged_weight(layer: Any) -> torch.Tensor:
    """``W + sum_a s_a * B_a @ A_a`` over the layer's active adapters, as a new tensor in ``W``'s dtype
    (``W`` is not touched); ``W`` as it is when PEFT has already merged the adapters into it."""
    base = layer.base_layer.weight
    if getattr(layer, "merged", False):
        return base.detach()
    out = base.detach().float()
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        if getattr(layer, "use_dora", {}).get(adapter):
            raise NotImplementedError(
                "vLLM weight sync: DoRA adapters cannot be merged into a temporary; use plain LoRA"
            )
        out = out + layer.get_delta_weight(adapter).detach().float()
    return out.to(base.dtype)


def weights_for_vllm(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights as ``(checkpoint name, tensor)``, one at a time (see the module doc). A
    consumer must use each tensor before asking for the next: a gathered tensor is released then."""
    if not is_peft_model(model):
        for name, param in model.named_parameters():
            with gathered([param]):
                yield name, _own(param)
        return
    layers = lora_layers(model)
    for name, param in model.named_parameters():
        if any(part in name for part in LORA_ADAPTER_PARTS):
            continue
        layer = layers.get(name)
        if layer is None:
            with gathered([param]):
                yield vllm_name(name), _own(param)
            continue
        adapter_params = [
            p for a in layer.active_adapters if a in layer.lora_A for p in _lora_params(layer, a)
        ]
        with gathered([param, *adapter_params]):
            merged = merged_weight(layer)
            yield vllm_name(name), merged
            del merged


def _own(param: Any) -> torch.Tensor:
    """A parameter's tensor to hand over: itself, or for a ZeRO-3 parameter a copy (the gathered storage
    is released after the gather, while vLLM's reload may keep a tensor until its layer is complete)."""
    return param.data.clone() if is_zero3_param(param) else param.data


def _lora_params(layer: Any, adapter: str) -> list[Any]:
    return [layer.lora_A[adapter].weight, layer.lora_B[adapter].weight]


# ---------------------------------------------------------------------- the rollout engine's arguments
def rollout_llm_kwargs(
    rollout: Any,
    *,
    seed: int,
    world_size: int,
    sleep_available: bool,
) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments (beyond model, dtype and tokenizer) of the rollout copy on one rank.

    ``rollout`` is the run's ``rollout`` section. One process: vLLM's in-process executor on this process's
    device. Several (``accelerate launch``): ``distributed_executor_backend="external_launcher"``, which
    reads ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` and puts each rank's copy on its own device
    (``cuda:LOCAL_RANK``), always in-process; ``seed`` differs per rank, so ranks sample differently.
    vLLM's ``max_num_seqs`` is raised to one step's sequences when those are more than its default."""
    kwargs: dict[str, Any] = {
        "gpu_memory_utilization": rollout.vllm_gpu_memory_utilization,
        "max_model_len": rollout.max_prompt_tokens + rollout.max_new_tokens,
        "seed": seed,
        "enable_sleep_mode": sleep_available,
    }
    if rollout.batch_size * rollout.group_size > VLLM_DEFAULT_MAX_NUM_SEQS:
        kwargs["max_num_seqs"] = rollout.batch_size * rollout.group_size
    if world_size > 1:
        kwargs["distributed_executor_backend"] = "external_launcher"
    return kwargs
