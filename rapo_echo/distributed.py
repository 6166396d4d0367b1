"""What the training loop does differently under DeepSpeed (through accelerate; docs/scaling.md).

rapo-echo micro-batches itself and has no dataloader, so DeepSpeed runs with
``gradient_accumulation_steps: 1`` and is told at each backward whether it ends an optimizer step.
Written against accelerate 1.15 / DeepSpeed 0.19; run on DeepSpeed's CPU accelerator in
tests/multiprocess, not yet on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rapo_echo.errors import ConfigError

if TYPE_CHECKING:
    import torch


def accelerator_kwargs(device: str) -> dict[str, Any]:
    """Keyword arguments for ``Accelerator`` from ``model.device`` and the launch environment. DeepSpeed
    without CUDA runs its CPU accelerator, which accelerate only starts with ``cpu=False`` and an explicit
    gloo process group (it would otherwise ignore the DeepSpeed launch)."""
    import os

    import torch

    cuda = torch.cuda.is_available()
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if deepspeed and not cuda:
        from accelerate.utils import InitProcessGroupKwargs

        return {"cpu": False, "kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}
    return {"cpu": device == "cpu" or (device == "auto" and not cuda)}


# Modules whose functions take the default process group as a default argument (``group=group.WORLD``).
# Imported after the group exists (torch._dynamo, saving a model), such a module holds the group for
# good, its gloo threads outlive ``destroy_process_group`` and now and then abort a rank at exit (SIGABRT,
# "terminate called without an active exception") after a run that succeeded.
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
    """Tear down the default process group, as ``Accelerator.end_training`` does (left alive, its gloo
    threads can abort a rank at exit)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_deepspeed(accelerator: Any) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def _ds_config(accelerator: Any) -> dict[str, Any] | None:
    """The run's DeepSpeed config (accelerate's, filled in place), None without DeepSpeed."""
    return accelerator.state.deepspeed_plugin.deepspeed_config if is_deepspeed(accelerator) else None


def zero_stage(accelerator: Any) -> int:
    """The ZeRO stage of the DeepSpeed config (0 without DeepSpeed)."""
    ds = _ds_config(accelerator)
    return int(ds.get("zero_optimization", {}).get("stage", 0)) if ds is not None else 0


def deepspeed_mixed_precision(accelerator: Any) -> bool | None:
    """None without DeepSpeed; else whether its config trains in bf16 or fp16 (DeepSpeed then keeps
    float32 master weights itself)."""
    if (ds := _ds_config(accelerator)) is None:
        return None
    return any(str(ds.get(k, {}).get("enabled", False)).lower() in ("true", "auto") for k in ("bf16", "fp16"))


def zero_layout(accelerator: Any) -> dict[str, Any]:
    """How the optimizer state is laid out over the ranks, for sizing memory
    (:func:`rapo_echo.autosize.resolve_batch_sizes`)."""
    if (ds := _ds_config(accelerator)) is None:
        return {}
    zero = ds.get("zero_optimization", {})
    bucket = zero.get("reduce_bucket_size", 0)
    return {
        "deepspeed": True,
        "zero_stage": int(zero.get("stage", 0)),
        "world": accelerator.num_processes,
        "bucket_elements": int(bucket) if isinstance(bucket, (int, float)) else 0,
    }


def configure_deepspeed(accelerator: Any, micro_batch_size: int | str, max_grad_norm: float | None) -> None:
    """Fill the DeepSpeed config fields accelerate cannot infer without a dataloader, and refuse
    settings that would double-scale the loss. An ``auto`` micro-batch is given as 1: DeepSpeed only
    books it."""
    if (ds := _ds_config(accelerator)) is None:
        return
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
    """Whether ``module``'s parameters are partitioned by ZeRO-3 (``.data`` empty outside a gather)."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


def _is_gathered(param: Any) -> bool:
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return param.ds_status == ZeroParamStatus.AVAILABLE


def gathered_one_at_a_time(
    named_parameters: Iterable[tuple[str, Any]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` for each parameter in turn, a ZeRO-3 one gathered for the loop's body only
    (a collective: every rank walks the same names in order). The tensor is the parameter's own storage:
    copy what must outlive the iteration."""
    for name, param in named_parameters:
        if hasattr(param, "ds_id") and not _is_gathered(param):
            import deepspeed

            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                yield name, param.data
        else:
            yield name, param.data


@contextlib.contextmanager
def full_parameters(module: Any) -> Iterator[None]:
    """All of ``module``'s ZeRO-3 parameters gathered for the block (a collective), for a forward outside
    DeepSpeed's engine."""
    params = [p for p in module.parameters() if hasattr(p, "ds_id") and not _is_gathered(p)]
    if not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield


def register_head_parameters(scorer: Any, lm: Any) -> None:
    """Under ZeRO-3, make ``scorer``'s forward gather ``lm``'s output head, which it applies itself
    (DeepSpeed's hooks would leave it partitioned outside the engine's forward; audit D2)."""
    head = lm.get_output_embeddings()
    import deepspeed

    for param in (head.weight, getattr(head, "bias", None)):
        if param is not None and hasattr(param, "ds_id"):
            deepspeed.zero.register_external_parameter(scorer, param)


def _zero3_offload(engine: Any) -> Any:
    """The ``DeepSpeedZeRoOffload`` holding a ZeRO-3 engine's module hooks, else None."""
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is None:
        return None
    offload = getattr(optimizer, "parameter_offload", optimizer)
    hooked = hasattr(offload, "forward_hooks") and hasattr(offload, "_register_deepspeed_module")
    return offload if hooked else None


@contextlib.contextmanager
def generation_view(engines: Sequence[Any]) -> Iterator[None]:
    """Each ZeRO-3 engine's weights gathered once, and DeepSpeed's module hooks off, for a rollout (audit
    D1): with the hooks on, each forward gathers again, collectives that deadlock once the ranks run
    different numbers of forwards. On exit the hooks are put back (as DeepSpeed's
    ``unwrap_model_for_generation`` does); every rank enters and leaves together, and the weights must
    not change inside. Other engines, and stages below 3, are left alone."""
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
    """Take DeepSpeed's hooks off ``offload``'s module; returns the start-of-forward hook (a collective)
    for :func:`_add_hooks`."""
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
    """Put back what :func:`_remove_hooks` took off; re-registering invalidates the coordinator's trace."""
    if start is not None:
        offload.fwd_pre_hook = offload.module.register_forward_pre_hook(start)
    offload._register_deepspeed_module(offload.module)


def inference_engine(accelerator: Any, module: Any) -> Any:
    """``module`` (a frozen reference) held by DeepSpeed for no-grad forwards, from the run's config
    without its training blocks: sharded under ZeRO-3, else a plain copy in the config's precision
    (audit D4). Call after ``accelerator.prepare``, which fills the config."""
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
