"""``rapo-echo train --dry-run``: the plan of a run before any weight is loaded.

It resolves what needs no weights (the model's ``config.json`` and tokenizer, the engines of the roles,
the sizes) and prints, per GPU of the hardware named (``--gpus``, ``--gpu-memory``, the ZeRO stage from
``--zero`` or an accelerate config), the memory of the weights, reference, gradients, optimizer, vLLM
share, training activations and rollout KV cache, the batch sizes ``auto`` would pick, the requests per
step each served role receives, and what will not fit. The memory figures and the batch sizes come from
:mod:`rapo_echo.autosize`, the same arithmetic the trainer runs on the GPU: the plan is that model with
the card's size in place of the free memory the trainer measures (less :data:`~rapo_echo.autosize.
CUDA_CONTEXT_BYTES` and the loaded weights).

Requests per step are first tries per process (a retry of an unreadable answer adds one; cached need
analyses, references and personas are asked once per scenario): the algorithm's own, as it declares them
(:meth:`Algorithm.requests <rapo_echo.algorithms.base.Algorithm.requests>`; the plan says so when it
declares none), and the built-in rewards' from their structure; a plugin reward is listed as unknown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rapo_echo import autosize
from rapo_echo.algorithms import get as algorithm_class
from rapo_echo.algorithms.base import RoleRequest
from rapo_echo.data.files import locate
from rapo_echo.errors import ConfigError
from rapo_echo.models import ResolvedModel, load_tokenizer, resolve, resolve_dtype

from .run_config import RunConfig

GB = 1e9
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PEFT_ADAPTER_BYTES = 4  # PEFT keeps a 16-bit model's adapter in float32


@dataclass(frozen=True)
class Hardware:
    """What the plan is for: ``device`` cuda or cpu, the process count and each GPU's memory."""

    device: str = "cuda"
    gpus: int = 1
    memory_bytes: int = 80 * 10**9
    bf16: bool = True
    zero_stage: int = 0
    source: str = ""  # where the ZeRO stage came from


def zero_stage_of(accelerate_config: str | Path) -> tuple[int, int | None]:
    """(ZeRO stage, num_processes or None) of an accelerate launch config (its DeepSpeed JSON)."""
    import yaml

    path = Path(accelerate_config)
    if not path.is_file():
        raise ConfigError(f"--accelerate-config {path}: no such file")
    data = yaml.safe_load(path.read_text()) or {}
    processes = data.get("num_processes")
    if data.get("distributed_type") != "DEEPSPEED":
        return 0, processes
    ds = data.get("deepspeed_config") or {}
    if "zero_stage" in ds:
        return int(ds["zero_stage"]), processes
    json_file = ds.get("deepspeed_config_file")
    if not json_file:
        raise ConfigError(
            f"--accelerate-config {path}: DEEPSPEED without zero_stage or deepspeed_config_file"
        )
    json_path = Path(json_file)
    if not json_path.is_absolute() and not json_path.is_file():
        json_path = path.parent.parent.parent / json_file  # configs/accelerate/x.yaml -> repository root
    if not json_path.is_file():
        raise ConfigError(
            f"--accelerate-config {path}: its deepspeed_config_file {json_file} was not found (plan from the "
            "directory you launch from)"
        )
    stage = json.loads(json_path.read_text()).get("zero_optimization", {}).get("stage", 0)
    return int(stage), processes


def shipped_config(spec: str) -> Path | None:
    """rapo-echo's copy of a recipe model's ``config.json`` (``rapo_echo/examples/OWNER--NAME.config.json``,
    a few kB), so that a recipe's plan needs no Hub; None for any other model."""
    from importlib import resources

    if spec.count("/") != 1 or Path(spec).expanduser().exists():
        return None
    found = resources.files("rapo_echo.examples") / f"{spec.replace('/', '--')}.config.json"
    return Path(str(found)) if found.is_file() else None


def model_folder(spec: str) -> ResolvedModel:
    """Where the model's ``config.json`` and tokenizer are: a folder needs no weights for a plan; a recipe's
    model has its config.json shipped (:func:`shipped_config`, no tokenizer read); other specs resolve as
    for training (a hub id fetches only those files)."""
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return ResolvedModel(str(path), source=spec)
    shipped = shipped_config(spec)
    if shipped is not None:
        return ResolvedModel(str(shipped), source=spec)
    return resolve(spec)


def model_config(resolved: ResolvedModel, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(resolved.path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"model.name: cannot read the config.json of {resolved.source or resolved.path}: {exc}"
        ) from None


def training_of(cfg: RunConfig, shape: autosize.ModelShape, dtype: str, hw: Hardware) -> autosize.Training:
    """The :class:`~rapo_echo.autosize.Training` a config gives on ``hw``."""
    base = shape.parameter_count()
    weight_bytes = ELEMENT_BYTES[dtype]
    lora = cfg.model.lora
    if lora.enabled:
        adapter = shape.lora_parameter_count(lora.r, lora.target_modules)
        trainable_bytes = max(weight_bytes, PEFT_ADAPTER_BYTES)
        return autosize.Training(
            base + adapter,
            adapter,
            weight_bytes,
            trainable_bytes,
            zero_stage=hw.zero_stage,
            world_size=hw.gpus,
            gathers_for_rollout=cfg.rollout.engine != "vllm",
        )
    return autosize.Training(
        base,
        base,
        weight_bytes,
        weight_bytes,
        reference_copy=algorithm_class(cfg.algo).needs(cfg).reference,  # the KL, the monitor, SD guards
        zero_stage=hw.zero_stage,
        world_size=hw.gpus,
        gathers_for_rollout=cfg.rollout.engine != "vllm",
    )


def _reward_requests(cfg: RunConfig, n: int, b: int) -> list[RoleRequest]:
    """The requests of the rewards, ``n`` replies of ``b`` scenarios a step."""
    out: list[RoleRequest] = []
    for spec in cfg.rewards:
        args = spec.args or {}
        if spec.name == "judge":
            out.append(RoleRequest("judge", "judge reward: one rating per reply", n))
        if spec.name in ("humanlike", "echo_n1"):  # echo_n1 route: one of the two per reply; both counted
            out.append(RoleRequest("judge", f"{spec.name}: humanlike verdict per reply", n))
        if spec.name in ("empathy", "echo_n1"):
            emp = args.get("empathy", {}) if spec.name == "echo_n1" else args
            orders = 2 if emp.get("order", "both") == "both" else 1
            out.append(
                RoleRequest("judge", f"{spec.name}: empathy comparisons ({orders} orders)", n * orders)
            )
            out.append(
                RoleRequest("judge", f"{spec.name}: injection probe", int(emp.get("injection_probe", 8)))
            )
            if emp.get("needs", True):
                out.append(RoleRequest("judge", f"{spec.name}: need analysis (first sight of a scenario)", b))
            ref_role = emp.get("reference_model", "judge")
            if ref_role in ("judge", "simulator") and emp.get("reference", "auto") != "scenario":
                out.append(RoleRequest(ref_role, f"{spec.name}: reference reply (first sight, cached)", b))
        if spec.name == "emotion":
            out.append(RoleRequest("simulator", "emotion reward: one reaction per reply", n))
        if spec.name not in ("judge", "humanlike", "empathy", "echo_n1", "emotion", "length", "format"):
            out.append(RoleRequest("?", f"{spec.name}: a plugin (not modelled)", None))
    return out


def role_requests(cfg: RunConfig) -> list[RoleRequest]:
    """The requests per step per process of the algorithm (:meth:`Algorithm.requests`; none when it
    declares none), its rewards and persona inference."""
    r = cfg.rollout
    b, n = r.batch_size, r.batch_size * r.group_size
    out = list(algorithm_class(cfg.algo).requests(cfg) or [])
    out += _reward_requests(cfg, n, b)
    if cfg.persona.enabled:
        out.append(RoleRequest(cfg.persona.engine, "persona inference (first sight of a scenario)", b))
    return out


def undeclared_requests(cfg: RunConfig) -> str:
    """A note when the algorithm declares no requests (:meth:`Algorithm.requests` gives None): its own
    calls to the simulator and the judge are then missing from the plan."""
    if algorithm_class(cfg.algo).requests(cfg) is not None:
        return ""
    return (
        f"the algorithm {cfg.algo!r} declares no requests of its own (Algorithm.requests): any calls it "
        "makes to the simulator or the judge are not counted below"
    )


def describe_role(cfg: RunConfig, role: str) -> str:
    if role not in ("simulator", "judge"):
        return "unknown role"
    e = getattr(cfg, role)
    if e.engine == "openai":
        return f"openai {e.base_url} (model {e.model})"
    if e.engine == "policy":
        return "the policy's weights (no server)"
    return f"{e.engine} {e.model}"


def make_plan(cfg: RunConfig, hw: Hardware) -> dict[str, Any]:
    """The plan as a dict (what ``--dry-run`` prints; tests read it)."""
    locate(cfg.data.path)  # a data file that is not there stops the run at once: the plan says so too
    resolved = model_folder(cfg.model.name)
    config = model_config(resolved, cfg.model.trust_remote_code)
    shipped = resolved.path.endswith(".config.json")
    tokenizer = None if shipped else load_tokenizer(resolved, trust_remote_code=cfg.model.trust_remote_code)
    shape = autosize.ModelShape.of(config)
    device = "cuda" if hw.device == "cuda" else "cpu"
    dtype = resolve_dtype(cfg.model.dtype, device, bf16_supported=hw.bf16)
    if dtype == "auto":
        dtype = "float32"
    training = training_of(cfg, shape, dtype, hw)
    sizes = _sizes(cfg, hw, shape, training, dtype)
    r, t = cfg.rollout, cfg.train
    requests = [
        {
            "role": q.role,
            "served_by": describe_role(cfg, q.role),
            "what": q.what,
            "per_process": q.per_process,
        }
        for q in role_requests(cfg)
    ]
    problems = _problems(cfg, hw, sizes) if device == "cuda" else []
    return {
        "algo": cfg.algo,
        "model": {
            "spec": cfg.model.name,
            "folder": resolved.path,
            "shipped_config": shipped,
            "architecture": (getattr(config, "architectures", None) or [config.model_type])[0],
            "parameters": shape.parameter_count(),
            "trainable": training.trainable_params,
            "lora": cfg.model.lora.enabled,
            "dtype": dtype,
            "asked_dtype": cfg.model.dtype,
            "vocab": shape.vocab,
            "tokenizer_vocab": None if tokenizer is None else len(tokenizer),
            "context": getattr(config, "max_position_embeddings", None),
        },
        "hardware": {
            "device": device,
            "gpus": hw.gpus,
            "memory_gb": hw.memory_bytes / GB,
            "zero_stage": hw.zero_stage,
            "source": hw.source,
            "fp32_masters": training.masters,
        },
        "memory_bytes": sizes["memory"],
        "total_bytes": sizes["total"],
        "batch": {
            "train.micro_batch_size": sizes["micro"],
            "rollout.max_batch_size": sizes["rows"],
            "asked": {
                "train.micro_batch_size": t.micro_batch_size,
                "rollout.max_batch_size": r.max_batch_size,
            },
            "decode_rows": sizes["decode_rows"],
            "tokens_per_sequence": round(sizes["workload"].train_tokens_per_sequence, 1),
            "replies_per_step_per_process": r.batch_size * r.group_size,
            "replies_per_step": r.batch_size * r.group_size * hw.gpus,
        },
        "basis": sizes["basis"],
        "requests": requests,
        "requests_note": undeclared_requests(cfg),
        "problems": problems,
        "fits": not problems,
    }


def _sizes(
    cfg: RunConfig, hw: Hardware, shape: autosize.ModelShape, training: autosize.Training, dtype: str
) -> dict[str, Any]:
    """The batch sizes ``auto`` would pick on ``hw`` (or the ones set) and the memory per process they
    give: ``micro``, ``rows``, ``basis`` (on CUDA, how they were found), ``decode_rows``, ``workload``,
    ``state`` (the model state's bytes), ``memory`` (every part) and ``total``."""
    r, t = cfg.rollout, cfg.train
    cuda = hw.device == "cuda"
    workload = autosize.workload_of(cfg)
    vllm = int(r.vllm_gpu_memory_utilization * hw.memory_bytes) if r.engine == "vllm" and cuda else 0
    state = autosize.state_bytes(training, vllm)
    context = autosize.CUDA_CONTEXT_BYTES if cuda else 0
    free = hw.memory_bytes - context - state["weights"] - state["reference"]
    if cuda:
        micro, rows, basis = autosize.gpu_batch_sizes(
            free_bytes=max(0, free), shape=shape, training=training, workload=workload, vllm_bytes=vllm
        )
    else:
        micro, rows = autosize.CPU_MICRO_BATCH, autosize.CPU_ROLLOUT_BATCH
        basis = {}
    micro = micro if t.micro_batch_size == "auto" else t.micro_batch_size
    rows = rows if r.max_batch_size == "auto" else r.max_batch_size
    act_bytes = ELEMENT_BYTES[dtype]
    decode_rows = min(r.batch_size, max(1, rows // r.group_size)) * r.group_size
    memory = {
        **state,
        "cuda_context": context,
        "activations": micro * autosize.sequence_bytes(shape, workload, act_bytes)
        + autosize.logit_bytes(shape),
        "rollout_kv": decode_rows * autosize.row_bytes(shape, workload, act_bytes),
    }
    return {
        "micro": micro,
        "rows": rows,
        "basis": basis,
        "decode_rows": decode_rows,
        "workload": workload,
        "state": state,
        "memory": memory,
        "total": sum(memory.values()),
    }


def _problems(cfg: RunConfig, hw: Hardware, sizes: dict[str, Any]) -> list[str]:
    """What will not fit on ``hw``'s GPUs (or is worth a check) with these sizes."""
    problems: list[str] = []
    state, basis, total = sizes["state"], sizes["basis"], sizes["total"]
    fixed = sum(state.values()) + autosize.CUDA_CONTEXT_BYTES
    gathered = state.get("gathered", 0)
    if gathered and fixed - gathered <= hw.memory_bytes < fixed:
        problems.append(
            f"under ZeRO-3 each rank gathers the whole model for the rollout ({gathered / GB:.1f} GB on "
            f"top of its {(fixed - gathered) / GB:.1f} GB shard and state), which exceeds "
            f"{hw.memory_bytes / GB:.0f} GB per GPU: GPUs with more memory, or a model that one GPU holds"
        )
    elif fixed > hw.memory_bytes:
        problems.append(
            f"the model state alone ({fixed / GB:.1f} GB: weights, reference, gradients, optimizer) "
            f"exceeds {hw.memory_bytes / GB:.0f} GB per GPU: use LoRA (model.lora.enabled), ZeRO-3 or "
            "more GPUs"
        )
    elif basis and not basis["fits"]:
        problems.append(
            "not even micro-batch 1 and 8 decoding rows fit beside the model state: shorten "
            "rollout.max_prompt_tokens / max_new_tokens, turn on model.gradient_checkpointing, or use "
            "LoRA"
        )
    if total > hw.memory_bytes:
        problems.append(
            f"the planned total ({total / GB:.1f} GB) exceeds {hw.memory_bytes / GB:.0f} GB per GPU "
            "with the sizes given; let them be auto or lower them"
        )
    for role in ("simulator", "judge"):
        e = getattr(cfg, role)
        if e.engine in ("hf", "vllm"):
            problems.append(
                f"{role}.engine {e.engine} loads {e.model} on every training GPU beside the policy (not "
                "counted above); a large role belongs on 'vllm serve' (engine: openai)"
            )
    return problems


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as the text ``--dry-run`` prints."""
    m, hw, b = plan["model"], plan["hardware"], plan["batch"]
    lines = [
        f"rapo-echo plan: {plan['algo']}, {m['architecture']} from {m['folder']}",
        f"  parameters {m['parameters'] / 1e9:.2f}B, trainable {m['trainable'] / 1e9:.3f}B"
        f" ({'LoRA' if m['lora'] else 'full fine-tuning'}), dtype {m['dtype']} (asked {m['asked_dtype']}),"
        f" vocab {m['vocab']} (tokenizer {m['tokenizer_vocab'] or 'not read'}), context {m['context']}",
    ]
    if m.get("shipped_config"):
        lines.append(f"  config.json: rapo-echo's copy of {m['spec']}'s (no Hub; the tokenizer is not read)")
    if hw["device"] == "cuda":
        zero = f"ZeRO-{hw['zero_stage']}" if hw["zero_stage"] else "no ZeRO"
        lines.append(
            f"hardware: {hw['gpus']} x {hw['memory_gb']:.0f} GB CUDA, {zero}"
            + (f" ({hw['source']})" if hw["source"] else "")
            + (", fp32 master weights" if hw["fp32_masters"] else "")
        )
    else:
        lines.append("hardware: CPU (the measured CPU batch sizes; memory is host RAM)")
    lines.append("memory per process (GB):")
    labels = {
        "weights": "weights",
        "reference": "reference copy (KL)",
        "gradients": "gradients",
        "optimizer": "optimizer"
        + (" (fp32 masters + moments)" if hw["fp32_masters"] else " (AdamW moments)"),
        "vllm": "vLLM share (rollout.engine: vllm)",
        "gathered": "weights gathered for the rollout (ZeRO-3)",
        "cuda_context": "CUDA context",
        "activations": f"training activations (micro-batch {b['train.micro_batch_size']}"
        f" x {b['tokens_per_sequence']} tokens)",
        "rollout_kv": f"rollout KV cache ({b['decode_rows']} rows)",
    }
    for key, label in labels.items():
        lines.append(f"  {label:<58} {plan['memory_bytes'][key] / GB:8.2f}")
    limit = f" of {hw['memory_gb']:.0f}" if hw["device"] == "cuda" else ""
    lines.append(f"  {'total':<58} {plan['total_bytes'] / GB:8.2f}{limit}")
    asked = b["asked"]
    lines.append(
        "batch sizes: train.micro_batch_size={} ({}), rollout.max_batch_size={} ({})".format(
            b["train.micro_batch_size"],
            "auto" if asked["train.micro_batch_size"] == "auto" else "set",
            b["rollout.max_batch_size"],
            "auto" if asked["rollout.max_batch_size"] == "auto" else "set",
        )
    )
    lines.append(
        f"per step: {b['replies_per_step_per_process']} replies per process, {b['replies_per_step']} in all"
    )
    if plan["requests_note"]:
        lines.append(f"note: {plan['requests_note']}")
    if plan["requests"]:
        lines.append("requests per step (first tries; per process, x processes in all):")
        for q in plan["requests"]:
            count = (
                "?"
                if q["per_process"] is None
                else f"{q['per_process']} (x{hw['gpus']}: {q['per_process'] * hw['gpus']})"
            )
            lines.append(f"  {q['role']:<9} {q['what']:<58} {count}  [{q['served_by']}]")
    else:
        lines.append("requests per step: none (no simulator or judge is used)")
    if plan["problems"]:
        lines.append("WILL NOT FIT / CHECK:")
        lines += [f"  - {p}" for p in plan["problems"]]
    else:
        lines.append("fits: yes")
    return "\n".join(lines)
