"""The ``ray job submit ... python3 -m openrlhf.cli.train_ppo_ray ...`` command for a run.

The run's hyper-parameters are mapped to OpenRLHF's dotted flags (``openrlhf/cli/train_ppo_ray.py``;
0.11.2 or newer, the first release that accepts ``--actor.loss_agg_mode``: the ``openrlhf`` extra's
lower bound, checked by tests/unit/integrations/openrlhf/test_openrlhf_flags.py):

====================================  ====================================================================
rapo-echo                             OpenRLHF
====================================  ====================================================================
``loss.advantage`` grpo/dr_grpo/rloo  ``--algo.advantage.estimator`` group_norm / dr_grpo / rloo
``loss.policy_loss`` clip / gspo      ``--actor.policy_loss_type`` ppo / gspo, ``--actor.eps_clip_low_high``
``loss.beta``, ``loss.kl_estimator``  ``--algo.kl.init_coef``, ``--algo.kl.use_loss``, ``--algo.kl.estimator``
``loss.agg``                          ``--actor.loss_agg_mode`` (token-mean, seq-mean-token-mean)
``loss.entropy_coef``                 ``--actor.entropy_coef``
``rollout.group_size``                ``--rollout.n_samples_per_prompt``
``rollout.batch_size``                ``--rollout.batch_size`` (prompts per step)
``rollout`` batch x group / mini      ``--train.batch_size`` (samples per optimizer update)
``train.micro_batch_size``            ``--train.micro_batch_size``, ``--rollout.micro_batch_size``
``train.inner_epochs``                ``--train.max_epochs``
``train.lr``, betas, eps, decay       ``--actor.adam.lr / betas / eps / weight_decay`` (``auto``: by size;
                                      a LoRA-sized number is refused without ``--keep-lr``)
``train.scheduler``, warmup           ``--actor.lr_scheduler``, ``--actor.lr_warmup_ratio``
``train.max_grad_norm``               ``--actor.max_norm``
``train.max_steps``                   ``--train.num_episodes`` (passes over the prompt file)
``train.save_every / keep``           ``--ckpt.save_steps``, ``--ckpt.max_num``
====================================  ====================================================================

What OpenRLHF cannot express is an error, not a silent change: RAPO (group-level rank rewards and
self-distillation), top-k sampling, the ``seq-mean-token-sum-norm`` aggregation, and LoRA with vLLM
rollouts (OpenRLHF 0.11 broadcasts PEFT parameter names that vLLM does not know).
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from rapo_echo.autosize import CPU_MICRO_BATCH
from rapo_echo.config import Flag, Strict
from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import RunConfig

from .dataset import LABEL_KEY, PROMPT_KEY, count_rows
from .export import AGENT_FILE, PROMPTS_FILE, REWARD_FILE, as_config

ESTIMATORS = {"grpo": "group_norm", "dr_grpo": "dr_grpo", "rloo": "rloo"}
POLICY_LOSSES = {"clip": "ppo", "gspo": "gspo"}
KL_ESTIMATORS = {"k1": "k1", "k2": "k2", "k3": "k3"}
AGGREGATIONS = {"token-mean": "token-mean", "seq-mean-token-mean": "seq-mean-token-mean"}
SCHEDULERS = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


class ClusterSpec(Strict):
    """Where OpenRLHF runs. With `colocate` (OpenRLHF's hybrid engine) actor, reference and vLLM share
    every GPU (`vllm_engines x vllm_tensor_parallel` must equal `nodes x gpus_per_node`); otherwise
    `vllm_engines` needs GPUs of its own."""

    nodes: int = Field(1, ge=1, description="Nodes of the Ray cluster.")
    gpus_per_node: int = Field(8, ge=1, description="GPUs per node.")
    vllm_engines: int | None = Field(
        None, ge=1, description="vLLM engines (unset: one per GPU group of `vllm_tensor_parallel`)."
    )
    vllm_tensor_parallel: Annotated[int, Flag("--vllm-tp")] = Field(
        1, ge=1, description="vLLM tensor-parallel size."
    )
    vllm_gpu_memory_utilization: Annotated[float, Flag("--vllm-memory")] = Field(
        0.5, gt=0.0, le=1.0, description="vLLM's gpu_memory_utilization."
    )
    colocate: bool = Field(True, description="vLLM on the training GPUs (the hybrid engine), or its own.")
    zero_stage: Literal[0, 1, 2, 3] = Field(2, description="DeepSpeed ZeRO stage.")
    address: str = Field("http://127.0.0.1:8265", description="Ray dashboard address.")

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    def engines(self) -> int:
        """vLLM engines: as given, else as many as the GPUs hold at the tensor-parallel size."""
        if self.vllm_engines is not None:
            return self.vllm_engines
        return max(1, self.world // self.vllm_tensor_parallel)


def _eps_defaults(policy_loss: str) -> tuple[float, float]:
    from rapo_echo.algorithms.registries import POLICY_LOSSES as LOSS_FUNCTIONS

    params = inspect.signature(LOSS_FUNCTIONS.get(policy_loss, "loss.policy_loss")).parameters
    return float(params["eps_low"].default), float(params["eps_high"].default)


def _check(cfg: RunConfig, cluster: ClusterSpec) -> None:
    if cfg.algo not in ("grpo",):
        raise ConfigError(
            f"algo: {cfg.algo!r} cannot run on OpenRLHF; its reward functions see one sample at a time, so "
            "only scalar-reward GRPO-family runs (algo grpo) and the RLVER agent are exported. Train "
            f"{cfg.algo} with 'rapo-echo train' (accelerate / DeepSpeed)"
        )
    if cfg.rollout.group_size < 2:
        raise ConfigError(
            "rollout.group_size: OpenRLHF's group estimators need at least 2 samples per prompt"
        )
    if cfg.rollout.top_k:
        raise ConfigError("rollout.top_k: OpenRLHF 0.11 has no top-k flag; set rollout.top_k: 0")
    ours = {"advantage": ESTIMATORS, "policy_loss": POLICY_LOSSES, "kl_estimator": KL_ESTIMATORS}
    for key, known in {**ours, "agg": AGGREGATIONS}.items():  # a plugin formula has none either
        value = getattr(cfg.loss, key)
        if value not in known:
            allowed = ", ".join(known)
            raise ConfigError(f"loss.{key}: {value!r} has no OpenRLHF equivalent; use one of {allowed}")
    if cfg.model.lora.enabled:
        raise ConfigError(
            "model.lora.enabled: OpenRLHF 0.11 cannot sync LoRA weights into its vLLM engines (it broadcasts "
            "PEFT parameter names; OpenRLHF issues #1081, #1349); train full weights there, or LoRA with "
            "'rapo-echo train'"
        )
    if cluster.colocate and cluster.engines() * cluster.vllm_tensor_parallel != cluster.world:
        raise ConfigError(
            f"colocated: vllm_engines x vllm_tensor_parallel ({cluster.engines()} x "
            f"{cluster.vllm_tensor_parallel}) must equal nodes x gpus_per_node ({cluster.world})"
        )


def _auto_lr_of(model_path: str, cfg: RunConfig) -> float:
    """``train.lr: auto`` for the policy at ``model_path`` (its size read from its config, no weights)."""
    from rapo_echo.auto_lr import auto_lr, count_parameters_of

    try:
        params = count_parameters_of(model_path, trust_remote_code=cfg.model.trust_remote_code)
    except Exception as exc:  # the path may exist only on the cluster
        raise ConfigError(
            f"train.lr: auto needs the policy's size, but {model_path!r} cannot be read here "
            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
            "give a number, e.g. --set train.lr=1e-6"
        ) from exc
    return auto_lr(params, cfg.model.lora.enabled)


def _full_fine_tuning_lr(lr: float, model_path: str, cfg: RunConfig) -> None:
    """Refuse a LoRA-sized ``train.lr`` for the full fine-tuning OpenRLHF does (LoRA is refused there):
    one at or above ``auto``'s LoRA rate for the model, or, when its size cannot be read here, above
    the largest rate ``auto`` gives any model in full."""
    from rapo_echo.auto_lr import (
        FULL_LR_AT_REFERENCE,
        FULL_LR_FLOOR,
        LORA_FACTOR,
        auto_lr,
        count_parameters_of,
    )

    if lr < FULL_LR_FLOOR * LORA_FACTOR:  # below auto's LoRA rate for any size: no need to read the model
        return
    try:
        params = count_parameters_of(model_path, trust_remote_code=cfg.model.trust_remote_code)
    except Exception:  # the path may exist only on the cluster
        params = None
    if params is None:
        if lr <= FULL_LR_AT_REFERENCE:
            return
        basis = (
            f"above {FULL_LR_AT_REFERENCE:g}, the largest rate train.lr: auto gives any model in full "
            f"(the size of {model_path!r} cannot be read here)"
        )
        fix = "give a full fine-tuning rate (e.g. --set train.lr=1e-6 for a 7B model)"
    else:
        full, lora = auto_lr(params, False), auto_lr(params, True)
        if lr < lora:
            return
        basis = (
            f"LoRA-sized: train.lr: auto gives this {params / 1e6:.0f}M-parameter model {lora:g} with LoRA, "
            f"{full:g} in full"
        )
        fix = "use --set train.lr=auto"
    raise ConfigError(
        f"train.lr: {lr:g} is {basis}, but OpenRLHF trains full weights (full fine-tuning; LoRA is "
        f"refused there), so a rate meant for LoRA would be handed to every weight; {fix}, or pass "
        "--keep-lr (launch_command(keep_lr=True)) if the rate is meant"
    )


def micro_batch_for(cfg: RunConfig, samples: int, train_batch: int, gpus: int) -> int:
    """OpenRLHF's micro-batch per GPU. Its trainer splits the samples of one update (``train_batch``)
    over every GPU in micro-batches, so they must be a multiple of micro-batch x GPUs; and its launcher
    asserts that the step's samples make at least one micro-batch per GPU (``train_ppo_ray.py``). A
    number in ``train.micro_batch_size`` is checked; ``auto`` takes the largest size up to rapo-echo's CPU
    default that fits, so the defaults launch (16 samples on 8 GPUs: micro-batches of 2)."""
    asked = cfg.train.micro_batch_size
    sizes = [asked] if isinstance(asked, int) else list(range(min(CPU_MICRO_BATCH, train_batch), 0, -1))
    for micro in sizes:
        if train_batch % (micro * gpus) == 0 and samples // micro >= gpus:
            return micro
    if isinstance(asked, int) and train_batch % (asked * gpus):
        raise ConfigError(
            f"train.micro_batch_size: samples per update ({train_batch}) must be a multiple of "
            f"micro_batch_size x GPUs ({asked} x {gpus}); set train.micro_batch_size: auto to pick one"
        )
    if isinstance(asked, int):
        raise ConfigError(
            f"train.micro_batch_size: {samples} samples per step make fewer than one micro-batch of {asked} "
            f"per GPU ({gpus} GPUs), which OpenRLHF refuses; lower it or set it to auto"
        )
    ro, mini = cfg.rollout, cfg.train.mini_batches

    def splits(b: int) -> bool:
        return (b * ro.group_size) % mini == 0 and (b * ro.group_size // mini) % gpus == 0

    need = next(b for b in range(ro.batch_size, ro.batch_size + gpus * mini + 1) if splits(b))
    raise ConfigError(
        f"rollout.batch_size: {train_batch} samples per update (rollout.batch_size x group_size / "
        f"train.mini_batches) cannot be split evenly over {gpus} GPUs; use rollout.batch_size: {need} (or "
        "fewer GPUs)"
    )


def _sizes(
    cfg: RunConfig, cluster: ClusterSpec, bundle: Path, agent: bool, max_len: int | None
) -> tuple[int, int, int, int]:
    """OpenRLHF's train batch, micro-batch, episodes and max length for the run (see launch_command)."""
    ro, tr = cfg.rollout, cfg.train
    samples = ro.batch_size * ro.group_size
    if samples % tr.mini_batches:
        raise ConfigError(
            f"train.mini_batches: {tr.mini_batches} does not divide rollout.batch_size x group_size "
            f"({samples})"
        )
    train_batch = samples // tr.mini_batches
    micro = micro_batch_for(cfg, samples, train_batch, cluster.world)
    rows = count_rows(bundle / PROMPTS_FILE)
    episodes = max(1, math.ceil(tr.max_steps * ro.batch_size / rows))
    if max_len is None:
        max_len = ro.max_prompt_tokens + ro.max_new_tokens
        if agent:
            settings = json.loads((bundle / "rlver_agent.json").read_text()).get("sage", {})
            max_len = ro.max_prompt_tokens + 2 * ro.max_new_tokens * int(settings.get("max_turns", 10))
    return train_batch, micro, episodes, max_len


def _optional_flags(cfg: RunConfig, cluster: ClusterSpec, out: str) -> list[str]:
    """The flags a setting turns on: the KL loss and its reference, entropy, colocation, gradient
    checkpointing, the attention kernel, TensorBoard."""
    lo, args = cfg.loss, []
    if lo.beta > 0:
        args += ["--algo.kl.use_loss", "--algo.kl.estimator", KL_ESTIMATORS[lo.kl_estimator]]
        args += ["--ref.num_nodes", str(cluster.nodes), "--ref.num_gpus_per_node", str(cluster.gpus_per_node)]
    if lo.entropy_coef > 0:
        args += ["--actor.entropy_coef", f"{lo.entropy_coef:g}"]
    if cluster.colocate:
        args += ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
    if cfg.model.gradient_checkpointing:
        args.append("--actor.gradient_checkpointing_enable")
    if cfg.model.attn_implementation:
        args += ["--ds.attn_implementation", cfg.model.attn_implementation]
    if cfg.logging.tensorboard:
        args += ["--logger.tensorboard_dir", str(Path(out) / "tensorboard")]
    return args


def launch_command(
    config: RunConfig | str | Path,
    bundle_dir: str | Path,
    *,
    agent: bool = False,
    cluster: ClusterSpec | None = None,
    pretrain: str | None = None,
    save_path: str | None = None,
    max_len: int | None = None,
    keep_lr: bool = False,
) -> list[str]:
    """The command line (an argv list) that submits the run to a Ray cluster.

    ``bundle_dir`` holds the exported files and becomes the job's working directory (Ray uploads it),
    so the flags name the files relative to it. ``agent`` uses the RLVER agent instead of the reward
    file. ``pretrain`` is the policy as the cluster sees it (default: the run's model spec resolved
    here; a local folder must exist on every node). ``save_path`` (default ``<run output>/openrlhf``)
    must be on storage every node shares. ``max_len`` caps prompt + response tokens (default
    ``rollout.max_prompt_tokens + rollout.max_new_tokens``, times ``max_turns`` for the agent).
    ``train.lr: auto`` is sized for the model launched (``pretrain``); a number that is LoRA-sized for
    it is refused (OpenRLHF trains full weights) unless ``keep_lr``.
    """
    from rapo_echo.models import resolve

    cfg = as_config(config)
    cluster = cluster or ClusterSpec()
    _check(cfg, cluster)
    bundle = Path(bundle_dir).resolve()
    entry = AGENT_FILE if agent else REWARD_FILE
    for name in (entry, PROMPTS_FILE):
        if not (bundle / name).is_file():
            raise ConfigError(f"{bundle / name} is missing; run 'rapo-echo openrlhf export' first")
    ro, tr, lo = cfg.rollout, cfg.train, cfg.loss
    train_batch, micro, episodes, max_len = _sizes(cfg, cluster, bundle, agent, max_len)
    out = save_path or str(Path(cfg.output or "runs/openrlhf").resolve() / "openrlhf")
    eps_low, eps_high = _eps_defaults(lo.policy_loss)
    eps_low = lo.eps_low if lo.eps_low is not None else eps_low
    eps_high = lo.eps_high if lo.eps_high is not None else eps_high
    steps_per_update = tr.inner_epochs * tr.mini_batches
    warmup = tr.warmup_steps / (tr.max_steps * steps_per_update)
    model_path = pretrain or resolve(cfg.model.name).path
    lr = tr.lr if tr.lr != "auto" else _auto_lr_of(model_path, cfg)
    if tr.lr != "auto" and not keep_lr:
        _full_fine_tuning_lr(float(tr.lr), model_path, cfg)

    args = [
        "--actor.model_name_or_path", model_path,
        "--actor.num_nodes", str(cluster.nodes),
        "--actor.num_gpus_per_node", str(cluster.gpus_per_node),
        "--vllm.num_engines", str(cluster.engines()),
        "--vllm.tensor_parallel_size", str(cluster.vllm_tensor_parallel),
        "--vllm.gpu_memory_utilization", f"{cluster.vllm_gpu_memory_utilization:g}",
        "--ds.zero_stage", str(cluster.zero_stage),
        "--ds.param_dtype", "bf16",
        "--train.seed", str(tr.seed),
        "--algo.advantage.estimator", ESTIMATORS[lo.advantage],
        "--rollout.n_samples_per_prompt", str(ro.group_size),
        "--rollout.batch_size", str(ro.batch_size),
        "--train.batch_size", str(train_batch),
        "--rollout.micro_batch_size", str(micro),
        "--train.micro_batch_size", str(micro),
        "--train.max_epochs", str(tr.inner_epochs),
        "--train.num_episodes", str(episodes),
        "--rollout.max_new_tokens", str(ro.max_new_tokens),
        "--data.max_len", str(max_len),
        "--rollout.temperature", f"{ro.temperature:g}",
        "--rollout.top_p", f"{ro.top_p:g}",
        "--actor.policy_loss_type", POLICY_LOSSES[lo.policy_loss],
        "--actor.eps_clip_low_high", f"{eps_low:g}", f"{eps_high:g}",
        "--actor.loss_agg_mode", AGGREGATIONS[lo.agg],
        "--actor.adam.lr", f"{lr:g}",
        "--actor.adam.betas", f"{tr.adam_beta1:g}", f"{tr.adam_beta2:g}",
        "--actor.adam.eps", f"{tr.adam_eps:g}",
        "--actor.adam.weight_decay", f"{tr.weight_decay:g}",
        "--actor.lr_scheduler", SCHEDULERS[tr.scheduler],
        "--actor.lr_warmup_ratio", f"{warmup:g}",
        "--actor.max_norm", f"{tr.max_grad_norm or 0:g}",
        "--algo.kl.init_coef", f"{lo.beta:g}",
        "--data.prompt_dataset", PROMPTS_FILE,
        "--data.input_key", PROMPT_KEY,
        "--data.label_key", LABEL_KEY,
        "--data.apply_chat_template",
        "--ckpt.output_dir", out,
        "--ckpt.path", str(Path(out) / "checkpoints"),
        "--ckpt.save_steps", str(tr.save_every),
        "--ckpt.max_num", str(tr.keep_checkpoints),
        "--ckpt.save_hf",
    ]  # fmt: skip
    args += _optional_flags(cfg, cluster, out)
    args += ["--train.agent_func_path", entry] if agent else ["--reward.remote_url", entry]
    runtime_env = json.dumps({"working_dir": str(bundle)})
    return [
        "ray", "job", "submit",
        "--address", cluster.address,
        "--runtime-env-json", runtime_env,
        "--", "python3", "-m", "openrlhf.cli.train_ppo_ray",
        *args,
    ]  # fmt: skip
