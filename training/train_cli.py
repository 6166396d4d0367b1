"""``rapo-echo train``: the same command line for every algorithm."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rapo_echo.config import engine_settings, parse_reward_flag
from rapo_echo.errors import ConfigError

from .run_config import load_config


def register(sub: argparse._SubParsersAction) -> None:
    from rapo_echo.algorithms import names

    known = "|".join(names())
    p = sub.add_parser(
        "train",
        help=f"train a policy (--algo {known})",
        description="Train a dialogue policy. Precedence: algorithm defaults < --config < flags < --set.",
    )
    p.add_argument("--config", help="YAML run config (see configs/)")
    p.add_argument(
        "--algo",
        metavar="NAME",
        help=f"algorithm: {known}, another registered one, or module:Class (overrides the config's algo)",
    )
    p.add_argument("--model", help="policy model: default, a folder, a .gguf file or a hub id")
    p.add_argument(
        "--reward",
        action="append",
        metavar="NAME[=WEIGHT]",
        help="reward plugin: a built-in name, an entry point, or module:attr; repeatable",
    )
    for role, plays in (("simulator", "the simulated user"), ("judge", "the judge")):
        p.add_argument(
            f"--{role}",
            metavar="SPEC",
            help=f"engine of {plays}, as on eval: 'policy' (share its weights), default, a model folder, "
            f"a .gguf file, a hub id, or an http(s):// OpenAI-compatible endpoint (sets {role}.engine, "
            f"{role}.model, {role}.base_url; --set {role}.model=NAME names a served model)",
        )
    p.add_argument("--output", help="run directory (default runs/ALGO-TIMESTAMP)")
    p.add_argument("--max-steps", type=int, help="number of training steps")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR from its last checkpoint")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key")
    plan = p.add_argument_group("plan (--dry-run: load no weights, print the per-GPU plan, train nothing)")
    plan.add_argument("--dry-run", action="store_true", help="print the plan of the run and exit")
    plan.add_argument("--gpus", type=int, metavar="N", help="processes / GPUs to plan for (default 1)")
    plan.add_argument("--gpu-memory", type=float, metavar="GB", help="memory of each GPU (default 80)")
    plan.add_argument("--zero", type=int, choices=[0, 1, 2, 3], help="DeepSpeed ZeRO stage to plan for")
    plan.add_argument(
        "--accelerate-config", metavar="YAML", help="read the ZeRO stage (and process count) from this file"
    )
    plan.add_argument("--no-bf16", action="store_true", help="plan for GPUs without bfloat16 (pre-Ampere)")
    plan.add_argument("--plan-json", metavar="FILE", help="also write the plan as JSON")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace):
    """The validated RunConfig for these arguments (``--resume`` reads the run's saved config)."""
    flags = {
        "model.name": args.model,
        "train.max_steps": args.max_steps,
    }
    if args.reward:
        flags["rewards"] = [parse_reward_flag(r) for r in args.reward]
    for role in ("simulator", "judge"):
        if getattr(args, role, None):
            flags[role] = engine_settings(getattr(args, role))
    return run_config_for(
        args.config,
        algo=args.algo,
        output=args.output,
        resume=args.resume,
        flags=flags,
        overrides=args.set,
        check_devices=not getattr(args, "dry_run", False),
    )


def run_config_for(
    config: str | Path | Mapping[str, Any] | None,
    *,
    algo: str | None = None,
    output: str | Path | None = None,
    resume: str | Path | None = None,
    flags: dict[str, Any] | None = None,
    overrides: list[str] | Mapping[str, Any] | None = None,
    check_devices: bool = True,
):
    """The validated RunConfig of ``train`` (the command line and :func:`rapo_echo.train`): ``resume``
    is a run directory whose own ``config.yaml`` is read (``config`` must then be None); without
    ``output`` the run goes to ``runs/ALGO-TIMESTAMP``."""
    flags = {**(flags or {}), "output": str(output) if output else None}
    path = config
    if resume:
        run_dir = Path(resume)
        saved = run_dir / "config.yaml"
        if not saved.is_file():
            raise ConfigError(f"--resume {run_dir}: no config.yaml there; is it a rapo-echo run directory?")
        if config is not None:
            raise ConfigError(
                "--resume uses the run's own config.yaml; do not pass --config (use --set to change keys)"
            )
        if output and Path(output) != run_dir:
            raise ConfigError("--resume continues in RUN_DIR; --output must be omitted or equal to it")
        path, flags["output"] = str(saved), str(run_dir)
    cfg = load_config(
        path, algo=algo, overrides=overrides, flags=flags, saved=bool(resume), check_devices=check_devices
    )
    if not cfg.output:
        cfg.output = str(Path("runs") / f"{cfg.algo}-{time.strftime('%Y%m%d-%H%M%S')}")
    return cfg


# Exit codes of a run stopped early by a signal (after its checkpoint): 128 + the signal's number, as
# shells report a process killed by it, so scripts can tell "stopped, resumable" from "finished" (0);
# a step hook that stopped the run (after its checkpoint) exits with HOOK_STOP_EXIT_CODE.
STOPPED_EXIT_CODES = {"SIGTERM": 143, "SIGINT": 130}
HOOK_STOP_EXIT_CODE = 3


def hardware(args: argparse.Namespace, cfg) -> object:
    """The :class:`~rapo_echo.training.plan.Hardware` the flags and the config name."""
    from .plan import Hardware, zero_stage_of

    zero, processes, source = args.zero or 0, None, ""
    if args.accelerate_config:
        zero, processes = zero_stage_of(args.accelerate_config)
        source = args.accelerate_config
        zero = args.zero if args.zero is not None else zero
    elif args.zero is not None:
        source = "--zero"
    gpus = args.gpus or processes or 1
    if gpus < 1 or (args.gpu_memory is not None and args.gpu_memory <= 0):
        raise ConfigError("--gpus and --gpu-memory must be positive")
    named = args.gpus or args.gpu_memory or args.zero is not None or args.accelerate_config
    device = cfg.model.device
    if named or device.startswith("cuda"):
        device = "cuda"
    elif device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = "cpu"
    memory = 80e9 if args.gpu_memory is None else args.gpu_memory * 1e9
    return Hardware(device, gpus, int(memory), bf16=not args.no_bf16, zero_stage=zero, source=source)


def dry_run(args: argparse.Namespace, cfg) -> int:
    """Print the plan (``rapo_echo.training.plan``); nothing is loaded but config.json and the tokenizer."""
    import json

    from .plan import format_plan, make_plan

    plan = make_plan(cfg, hardware(args, cfg))
    print(format_plan(plan))
    if args.plan_json:
        Path(args.plan_json).write_text(json.dumps(plan, indent=2) + "\n")
    return 0


def train_with(cfg, *, resume: bool = False):
    """Run the training ``cfg`` describes (with its fidelity check first, when configured); returns the
    :class:`~rapo_echo.training.run.Run` (``run_dir``, ``stopped_by``)."""
    from .run import run_training

    check = None
    if cfg.fidelity is not None:  # once per run, cached by simulator / judge spec (docs/fidelity.md)
        from rapo_echo.benchmarks.fidelity.check import run_fidelity_check

        check = run_fidelity_check(cfg)
    try:
        return run_training(cfg, resume=resume)
    finally:
        if check is not None and cfg.output and Path(cfg.output).is_dir():
            from rapo_echo.benchmarks.fidelity.check import record_check

            record_check(cfg.output, check)


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    if args.dry_run:
        return dry_run(args, cfg)
    trainer = train_with(cfg, resume=bool(args.resume))
    print(f"run directory: {trainer.run_dir}")
    if not trainer.stopped_by:
        return 0
    return STOPPED_EXIT_CODES.get(trainer.stopped_by, HOOK_STOP_EXIT_CODE)
