"""``rapo-echo train``: the same command line for every algorithm."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from rapo_echo.config import Flag, Strict, add_flags, engine_settings, parse_reward_flag, section_from_args
from rapo_echo.errors import ConfigError
from rapo_echo.stopping import EXIT_CODES  # a run stopped by a signal (after its checkpoint): resumable

from .run_config import load_config

if TYPE_CHECKING:
    from .plan import Hardware


class PlanSettings(Strict):
    """`rapo-echo train`'s plan flags (the run's own keys are the sections above): `--dry-run` loads no
    weights, prints the per-GPU plan of the run and trains nothing."""

    dry_run: bool = Field(False, description="Print the plan of the run and exit.")
    gpus: Annotated[int | None, Flag(metavar="N")] = Field(
        None, ge=1, description="Processes / GPUs to plan for (unset: the accelerate config's, else 1)."
    )
    gpu_memory: Annotated[float | None, Flag(metavar="GB")] = Field(
        None, gt=0, description="Memory of each GPU in GB (unset: 80)."
    )
    zero: Literal[0, 1, 2, 3] | None = Field(None, description="DeepSpeed ZeRO stage to plan for.")
    accelerate_config: Annotated[str | None, Flag(metavar="YAML")] = Field(
        None, description="Read the ZeRO stage (and process count) from this accelerate config."
    )
    bf16: Annotated[bool, Flag(off="--no-bf16")] = Field(
        True, description="Plan for GPUs with bfloat16 (`--no-bf16`: pre-Ampere GPUs)."
    )
    plan_json: Annotated[str | None, Flag(metavar="FILE")] = Field(
        None, description="Also write the plan as JSON."
    )


def register(sub: argparse._SubParsersAction) -> None:
    from rapo_echo.algorithms import names

    p = sub.add_parser(
        "train",
        help=f"train a policy (--algo {'|'.join(names())})",
        description="Train a dialogue policy. Precedence: algorithm defaults < --config < flags < --set.",
    )
    add_run_flags(p, "run directory (default runs/ALGO-TIMESTAMP)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue RUN_DIR from its last checkpoint")
    add_flags(p, PlanSettings, config=False, title="plan (--dry-run: load no weights, print the plan)")
    p.set_defaults(func=run)


def add_run_flags(p: argparse.ArgumentParser, output: str) -> None:
    """The flags of a run config (``train``, ``openrlhf``): ``--config``, ``--set`` and the keys with a
    flag of their own; :func:`build_config` reads them."""
    from rapo_echo.algorithms import names

    p.add_argument("--config", help="YAML run config (see configs/)")
    p.add_argument(
        "--algo",
        metavar="NAME",
        help=f"algorithm: {'|'.join(names())}, another registered one, or module:Class (overrides the "
        "config's algo)",
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
    p.add_argument("--output", help=output)
    p.add_argument("--max-steps", type=int, help="number of training steps")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key")


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


def hardware(plan: PlanSettings, cfg) -> Hardware:
    """The :class:`~rapo_echo.training.plan.Hardware` the plan flags and the config name."""
    from .plan import Hardware, zero_stage_of

    zero: int = plan.zero or 0
    processes, source = None, ""
    if plan.accelerate_config:
        zero, processes = zero_stage_of(plan.accelerate_config)
        source = plan.accelerate_config
        zero = plan.zero if plan.zero is not None else zero
    elif plan.zero is not None:
        source = "--zero"
    gpus = plan.gpus or processes or 1
    named = plan.gpus or plan.gpu_memory or plan.zero is not None or plan.accelerate_config
    device = cfg.model.device
    if named or device.startswith("cuda"):
        device = "cuda"
    elif device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = "cpu"
    memory = 80e9 if plan.gpu_memory is None else plan.gpu_memory * 1e9
    return Hardware(device, gpus, int(memory), bf16=plan.bf16, zero_stage=zero, source=source)


def dry_run(plan: PlanSettings, cfg) -> int:
    """Print the plan (``rapo_echo.training.plan``); nothing is loaded but config.json and the tokenizer."""
    import json

    from .plan import format_plan, make_plan

    made = make_plan(cfg, hardware(plan, cfg))
    print(format_plan(made))
    if plan.plan_json:
        Path(plan.plan_json).write_text(json.dumps(made, indent=2) + "\n")
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
    plan = section_from_args(PlanSettings, args, files=False)
    if plan.dry_run:
        return dry_run(plan, cfg)
    trainer = train_with(cfg, resume=bool(args.resume))
    print(f"run directory: {trainer.run_dir}")
    return EXIT_CODES.get(trainer.stopped_by, 1) if trainer.stopped_by else 0
