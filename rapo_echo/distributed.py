"""What the training loop does differently under DeepSpeed (through accelerate).

rapo-echo micro-batches itself with exact loss normalisation and has no dataloader, so DeepSpeed runs
with ``gradient_accumulation_steps: 1`` and is told at each backward whether it is the last
micro-batch of an optimizer step (the engine then reduces, clips, steps and zeroes gradients
itself). Under ZeRO-3 the partitioned parameters are gathered for generation. Written against
accelerate 1.15 / DeepSpeed 0.19; no GPU was available to run it here (see docs/limits.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rapo_echo.errors import ConfigError


def accelerator_kwargs(device: str) -> dict[str, Any]:
    """Keyword arguments for ``Accelerator`` from ``model.device`` and the launch environment. A CPU run
    is ``cpu=True`` (DDP over gloo when launched with several processes); a DeepSpeed launch on a
    machine without CUDA runs DeepSpeed's CPU accelerator, which accelerate only starts with
    ``cpu=False`` and an explicit gloo process group (it would otherwise ignore the DeepSpeed launch)."""
    import os

    import torch

    cuda = torch.cuda.is_available()
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if deepspeed and not cuda:
        from accelerate.utils import InitProcessGroupKwargs

        return {"cpu": False, "kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}
    return {"cpu": device == "cpu" or (device == "auto" and not cuda)}


# Modules whose functions take the default process group as a default argument (``group=group.WORLD``
# in torch.distributed.nn.functional, ZeroRedundancyOptimizer, ShardedGradScaler, DeepSpeed's torch
# backend). The default is evaluated when the module is imported: imported after the group exists (the
# optimizer's first use imports torch.distributed.nn through torch._dynamo; saving a model can import
# DeepSpeed), the module holds the group for good, ``destroy_process_group`` cannot free it, and its gloo
# threads still run when the interpreter exits, which now and then aborts a rank (SIGABRT, "terminate
# called without an active exception") after a run that succeeded.
GROUP_CAPTURING_MODULES = (
    "torch.distributed.nn",
    "torch.distributed.optim",
    "torch.distributed.fsdp",
    "deepspeed.comm.torch",
)


def import_group_capturing_modules() -> None:
    """Import :data:`GROUP_CAPTURING_MODULES` before the process group is created (those installed);
    a no-op in a process no launcher started."""
    import importlib
    import os

    if "WORLD_SIZE" not in os.environ:
        return
    for name in GROUP_CAPTURING_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # DeepSpeed is optional
            continue


def end_process_group() -> None:
    """Tear down the default process group of a distributed run, as ``Accelerator.end_training`` does
    (a no-op in a single process). Left alive, its gloo threads meet the interpreter's exit: a rank
    could abort ("terminate called without an active exception") after its work was done."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_deepspeed(accelerator: Any) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def zero_stage(accelerator: Any) -> int:
    """The ZeRO stage of the DeepSpeed config (0 without DeepSpeed)."""
    if not is_deepspeed(accelerator):
        return 0
    return int(
        accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0)
    )


def configure_deepspeed(accelerator: Any, micro_batch_size: int, max_grad_norm: float | None) -> None:
    """Fill the DeepSpeed config fields accelerate cannot infer without a dataloader, and refuse
    settings that would double-scale the loss."""
    if not is_deepspeed(accelerator):
        return
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds["train_micro_batch_size_per_gpu"] = micro_batch_size
    gas = ds.get("gradient_accumulation_steps", "auto")
    if gas == "auto":
        ds["gradient_accumulation_steps"] = 1
    elif int(gas) != 1:
        raise ConfigError(
            f"DeepSpeed config: gradient_accumulation_steps is {gas}; rapo-echo accumulates micro-batches "
            "itself (train.micro_batch_size), so set it to 1"
        )
    if ds.get("gradient_clipping", "auto") == "auto":
        ds["gradient_clipping"] = max_grad_norm or 0.0


def mark_last_micro_batch(accelerator: Any, is_last: bool) -> None:
    """Tell DeepSpeed whether the next backward ends the optimizer step (it steps inside backward)."""
    accelerator.gradient_state._set_sync_gradients(is_last)


@contextlib.contextmanager
def gathered_for_generation(accelerator: Any, model: Any) -> Iterator[None]:
    """Under ZeRO-3, gather the full parameters on every rank while the policy generates."""
    if zero_stage(accelerator) != 3:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        yield
