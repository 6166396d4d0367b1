"""TRL's names for our keys, so that an unknown key a TRL user writes gets the key it means here: TRL
1.16's ``GRPOConfig`` with the ``TrainingArguments`` it inherits, and its example scripts'
``ScriptArguments`` / ``ModelConfig``. A setting with no counterpart here says so.
"""

from __future__ import annotations

# TRL names that are the same key here, by section (the value carries over as it is)
SAME_NAMES = {
    "rollout": "temperature top_p vllm_gpu_memory_utilization",
    "loss": "beta entropy_coef",
    "train": "max_steps seed warmup_steps weight_decay adam_beta1 adam_beta2 max_grad_norm",
    "model": "gradient_checkpointing dtype trust_remote_code attn_implementation",
}

# TRL name -> our key, where the name differs and the value carries over as it is
RENAMED = {
    "num_generations": "rollout.group_size",
    "max_completion_length": "rollout.max_new_tokens",
    "max_prompt_length": "rollout.max_prompt_tokens",
    "epsilon": "loss.eps_low",
    "epsilon_high": "loss.eps_high",
    "num_iterations": "train.inner_epochs",
    "learning_rate": "train.lr",
    "adam_epsilon": "train.adam_eps",
    "save_steps": "train.save_every",
    "save_total_limit": "train.keep_checkpoints",
    "output_dir": "output",
    "model_name_or_path": "model.name",
    "torch_dtype": "model.dtype",
    "use_peft": "model.lora.enabled",
    "lora_r": "model.lora.r",
    "lora_alpha": "model.lora.alpha",
    "lora_dropout": "model.lora.dropout",
    "lora_target_modules": "model.lora.target_modules",
    "dataset_config": "data.subset",
    "dataset_train_split": "data.split",
}

# TRL name -> (our key or None, how the value translates; '' when it carries over as it is)
TRL_KEYS: dict[str, tuple[str | None, str]] = {
    **{name: (f"{section}.{name}", "") for section, names in SAME_NAMES.items() for name in names.split()},
    **{name: (key, "") for name, key in RENAMED.items()},
    # GRPOConfig
    "top_k": ("rollout.top_k", "0 turns it off, as TRL's None does"),
    "steps_per_generation": ("train.mini_batches", "optimizer steps per rollout"),
    "generation_batch_size": (
        "rollout.batch_size",
        "here in contexts, each sampled rollout.group_size times",
    ),
    "loss_type": (
        "loss.agg",
        "dapo / bnpo: token-mean; grpo: seq-mean-token-mean; dr_grpo: seq-mean-token-sum-norm with "
        "loss.advantage: dr_grpo",
    ),
    "scale_rewards": ("loss.advantage", "group: grpo; none / false: dr_grpo (no division by the std)"),
    "importance_sampling_level": ("loss.policy_loss", "token: clip; sequence: gspo"),
    "reward_funcs": ("rewards", "a list of {name, weight, args}, or --reward NAME[=WEIGHT]"),
    "reward_weights": ("rewards", "each reward's weight: rewards: [{name: ..., weight: ...}]"),
    "use_vllm": ("rollout.engine", "true: vllm"),
    "log_completions": ("logging.samples_every", "samples.jsonl is written every this many steps"),
    "mask_truncated_completions": (None, "no counterpart: a truncated reply stays in the loss"),
    # transformers.TrainingArguments, as GRPOConfig inherits them
    "bf16": ("model.dtype", "true: bfloat16; the simulator and judge have their own dtype and autocast"),
    "fp16": ("model.dtype", "true: float16"),
    "report_to": ("logging", "logging.wandb: true, logging.tensorboard: true"),
    "per_device_train_batch_size": ("train.micro_batch_size", "sequences per forward and backward"),
    "gradient_accumulation_steps": (
        None,
        "no counterpart: every micro-batch of a mini-batch accumulates into one optimizer step "
        "(train.mini_batches sets the steps per rollout)",
    ),
    "num_train_epochs": ("train.max_steps", "steps, not epochs: a step draws rollout.batch_size contexts"),
    "lr_scheduler_type": ("train.scheduler", "constant, linear or cosine"),
    "warmup_ratio": ("train.warmup_steps", "in steps: ratio x max_steps x inner_epochs x mini_batches"),
    "save_only_model": (
        "train.save_optimizer",
        "the opposite: save_only_model: true is save_optimizer: false",
    ),
    "logging_steps": (None, "no counterpart: every step is logged"),
    # TRL scripts' ModelConfig and ScriptArguments
    "dataset_name": ("data.path", "a Hub id, a data file or a save_to_disk folder"),
}


def trl_hint(name: str, value: object = None, source: str = "") -> str | None:
    """What TRL's ``name`` is here (None: not one of TRL's), with ``value`` carried over where it means
    the same, written the way the key was given (``source``, as the loader records it)."""
    if name not in TRL_KEYS:
        return None
    ours, how = TRL_KEYS[name]
    if ours is None:
        return f"TRL's {name} has {how}"
    if how:
        return f"TRL's {name} is {ours} here ({how})"
    write = f" (write {written(ours, value, source)})" if value is not None else ""
    return f"TRL's {name} is {ours} here{write}"


def written(key: str, value: object, source: str) -> str:
    """``key`` set to ``value`` in the form its ``source`` uses (a ``--set`` flag, the Python API's
    ``overrides`` mapping, or a YAML file)."""
    if source.startswith("--set"):
        return f"--set {key}={yaml_scalar(value)}"
    if source.startswith("overrides["):
        return f"overrides={{{key!r}: {value!r}}}"
    return f"{key}: {yaml_scalar(value)}"


def yaml_scalar(value: object) -> str:
    """``value`` as YAML writes it on one line (``true``, ``1e-05``, ``[1, 2]``)."""
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()
