"""What the training loop does differently under DeepSpeed (through accelerate).

rapo-echo micro-batches itself with exact loss normalisation and has no dataloader, so DeepSpeed runs
with ``gradient_accumulation_steps: 1`` and is told at each backward whether it is the last
micro-batch of an optimizer step (the engine then reduces, clips, steps and zeroes gradients
itself). Under ZeRO-3 the partitioned parameters are gathered once per rollout with DeepSpeed's hooks
off (:func:`generation_view`), the scorer gathers the output head it applies itself
(:func:`register_head_parameters`), and a full fine-tuning reference is a DeepSpeed engine of its own
(:func:`inference_engine`). Written against accelerate 1.15 / DeepSpeed 0.19; run on DeepSpeed's CPU
accelerator in tests/multiprocess (docs/scaling.md), not yet on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rapo_echo.errors import ConfigError

if TYPE_CHECKING:
    import torch


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


def deepspeed_mixed_precision(accelerator: Any) -> bool | None:
    """None without DeepSpeed; else whether its config trains in bf16 or fp16 (DeepSpeed then keeps
    float32 master weights itself)."""
    if not is_deepspeed(accelerator):
        return None
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    return any(str(ds.get(k, {}).get("enabled", False)).lower() in ("true", "auto") for k in ("bf16", "fp16"))


def zero_layout(accelerator: Any) -> dict[str, Any]:
    """How the optimizer state is laid out over the ranks, for sizing memory
    (:func:`rapo_echo.autosize.resolve_batch_sizes`): ``deepspeed``, ``zero_stage``, ``world`` and the
    ZeRO reduce bucket's ``bucket_elements`` (0 when not a number)."""
    if not is_deepspeed(accelerator):
        return {}
    zero = accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
    bucket = zero.get("reduce_bucket_size", 0)
    return {
        "deepspeed": True,
        "zero_stage": int(zero.get("stage", 0)),
        "world": accelerator.num_processes,
        "bucket_elements": int(bucket) if isinstance(bucket, (int, float)) else 0,
    }


def configure_deepspeed(accelerator: Any, micro_batch_size: int | str, max_grad_norm: float | None) -> None:
    """Fill the DeepSpeed config fields accelerate cannot infer without a dataloader, and refuse
    settings that would double-scale the loss. An ``auto`` micro-batch (resolved only after
    ``prepare``) is given to DeepSpeed as 1: DeepSpeed uses the figure for its own bookkeeping only,
    rapo-echo micro-batches itself."""
    if not is_deepspeed(accelerator):
        return
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds["train_micro_batch_size_per_gpu"] = micro_batch_size if isinstance(micro_batch_size, int) else 1
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


def is_zero3_partitioned(module: Any) -> bool:
    """Whether ``module``'s parameters are DeepSpeed ZeRO-3 parameters (partitioned over the ranks:
    each holds a slice in ``ds_tensor`` and ``.data`` is empty outside a gather)."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


def _is_gathered(param: Any) -> bool:
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return param.ds_status == ZeroParamStatus.AVAILABLE


def gathered_one_at_a_time(
    named_parameters: Iterable[tuple[str, Any]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for each parameter in turn. A ZeRO-3 parameter is gathered on every rank for
    the body of the loop only (one parameter in memory at a time) -- a collective: every rank must walk
    the same names in the same order; one already gathered (inside :func:`generation_view`, or a
    persistent small one) is given as it is. Other parameters are given as they are. The tensor is the
    parameter's own storage: copy what must outlive the iteration."""
    for name, param in named_parameters:
        if hasattr(param, "ds_id") and not _is_gathered(param):
            import deepspeed

            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                yield name, param.data
        else:
            yield name, param.data


@contextlib.contextmanager
def full_parameters(module: Any) -> Iterator[None]:
    """All of ``module``'s ZeRO-3 parameters gathered on every rank for the block (a collective), for a
    forward outside DeepSpeed's engine, e.g. a check before ``prepare``; a no-op for other modules."""
    params = [p for p in module.parameters() if hasattr(p, "ds_id") and not _is_gathered(p)]
    if not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield


def register_head_parameters(scorer: Any, lm: Any) -> None:
    """Under ZeRO-3, make ``scorer``'s forward gather ``lm``'s output head: the scorer applies the head's
    weight (and bias) itself instead of calling the head module, so DeepSpeed's hooks would otherwise
    leave them partitioned (empty) when the scorer runs outside the engine's forward (reference and
    old log-prob passes; audit D2)."""
    head = lm.get_output_embeddings()
    import deepspeed

    for param in (head.weight, getattr(head, "bias", None)):
        if param is not None and hasattr(param, "ds_id"):
            deepspeed.zero.register_external_parameter(scorer, param)


def _zero3_offload(engine: Any) -> Any:
    """The object that holds a ZeRO-3 engine's module hooks (``DeepSpeedZeRoOffload``), or None when the
    engine is not partitioning parameters."""
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is None:
        return None
    offload = getattr(optimizer, "parameter_offload", optimizer)
    hooked = hasattr(offload, "forward_hooks") and hasattr(offload, "_register_deepspeed_module")
    return offload if hooked else None


@contextlib.contextmanager
def generation_view(engines: Sequence[Any]) -> Iterator[None]:
    """The whole of each ZeRO-3 engine's weights gathered once, and DeepSpeed's module hooks off, for a
    rollout (audit D1). With the hooks on, every submodule's forward would release its parameters
    after use and gather them again at the next decode step: collectives that deadlock as soon as the
    ranks run different numbers of forwards (replies that end at different lengths, roles that retry).
    With them off, nothing in the block runs a collective, so each rank may decode as long as it needs.
    On exit the hooks are put back and the engines' traces invalidated, as DeepSpeed's
    ``unwrap_model_for_generation`` and TRL's remove/add-hooks do; every rank must enter and leave
    together. ``engines``: DeepSpeed engines (anything else, and stages below 3, is left alone). The
    weights must not change inside the block."""
    offloads = [(e, o) for e in engines if (o := _zero3_offload(e)) is not None]
    if not offloads:
        yield
        return
    import deepspeed

    params = [p for e, _ in offloads for p in e.module.parameters()]
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        starts = [_remove_hooks(o) for _, o in offloads]
        try:
            yield
        finally:
            for (_, offload), start in zip(offloads, starts):
                _add_hooks(offload, start)


def _remove_hooks(offload: Any) -> Any:
    """Take DeepSpeed's hooks off the module of ``offload``; returns the start-of-forward hook (which
    checks the trace across ranks, a collective), to be put back by :func:`_add_hooks`."""
    module = offload.module
    for param in module.parameters():
        param.ds_active_sub_modules.clear()
    for handle in (*offload.forward_hooks, *offload.backward_hooks):
        handle.remove()
    offload.forward_hooks, offload.backward_hooks = [], []
    start = None
    handle = getattr(offload, "fwd_pre_hook", None)
    if handle is not None:
        start = module._forward_pre_hooks.get(handle.id)
        handle.remove()
    return start


def _add_hooks(offload: Any, start: Any) -> None:
    """Put back what :func:`_remove_hooks` took off, in DeepSpeed's order; re-registering the module
    invalidates the parameter coordinator's trace (it re-records on the next forward)."""
    if start is not None:
        offload.fwd_pre_hook = offload.module.register_forward_pre_hook(start)
    offload._register_deepspeed_module(offload.module)


def inference_engine(accelerator: Any, module: Any) -> Any:
    """``module`` (a frozen reference) held by DeepSpeed for no-grad forwards, from the run's DeepSpeed
    config without its training blocks: sharded like the policy under ZeRO-3, a plain copy in the
    config's precision (bf16 if enabled) under other stages -- what TRL's ``prepare_deepspeed`` does
    for its reference model (audit D4). Call after ``accelerator.prepare`` (which fills the config)."""
    import copy

    import deepspeed

    config = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)
    for key in ("optimizer", "scheduler"):
        config.pop(key, None)
    zero = config.setdefault("zero_optimization", {})
    zero.pop("offload_optimizer", None)
    if int(zero.get("stage", 0)) != 3:
        zero["stage"] = 0
    engine, *_ = deepspeed.initialize(model=module, config=config)
    engine.eval()
    return engine


def mean_over_processes(
    metrics: dict[str, float], accelerator: Any, counts: Sequence[str] = ()
) -> dict[str, float]:
    """Each metric averaged over the processes (a collective): ``*/max`` and ``*/min`` keys stay
    extremes, the ``counts`` add up, non-finite values are left out; adds ``world``."""
    world = accelerator.num_processes
    if world == 1:
        return {**metrics, "world": 1.0}
    import math
    from collections import defaultdict

    from accelerate.utils import gather_object

    merged: dict[str, list[float]] = defaultdict(list)
    for part in gather_object([metrics]):
        for k, v in part.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                merged[k].append(float(v))
    out = {k: sum(v) / len(v) for k, v in merged.items()}
    for k, v in merged.items():
        if k.endswith("/max"):
            out[k] = max(v)
        elif k.endswith("/min"):
            out[k] = min(v)
    for k in counts:
        if k in merged:
            out[k] = sum(merged[k])
    out["world"] = float(world)
    return out
