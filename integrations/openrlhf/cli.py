"""``rapo-echo openrlhf export|launch``: run a config on a Ray cluster with OpenRLHF.

``export`` writes the job folder (config, tokenizer, prompts, ``reward_func.py``; with ``--agent`` the
RLVER agent). ``launch`` prints the ``ray job submit`` command for that folder (using the config it
was exported with unless ``--config`` is given) and runs it only with ``--run`` (it needs ``ray`` on
PATH and OpenRLHF on the cluster).
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from pydantic import Field

from rapo_echo.config import Strict, add_flags, section_from_args
from rapo_echo.errors import RapoEchoError

from .launch import ClusterSpec


class ExportJob(Strict):
    """`rapo-echo openrlhf export`: the job folder and what goes in it (the run config: `--config`,
    `--set` and train's flags)."""

    out: str = Field(description="The job folder to write.")
    agent: bool = Field(False, description="Also write the RLVER simulated-user agent.")
    profiles: str | None = Field(
        None, description="JSON lines of simulated-user profiles for the agent's prompts."
    )
    sage_preset: Literal["sage", "rlver"] = Field(
        "sage",
        description="The simulated user: SAGE's evaluation settings (start 40, change clamped to +-10, ends "
        "below 10, 10 turns) or RLVER's training simulator (start 30, no clamp, ends at <= 0, 8 turns).",
    )
    invalid_reward: float | None = Field(
        None, description="Reward of an unscorable sample (unset: minus the sum of the rewards' |weight|)."
    )


class LaunchJob(ClusterSpec):
    """`rapo-echo openrlhf launch`: the job folder, the cluster and the job's own switches."""

    bundle: str = Field(description="The job folder written by `openrlhf export`.")
    agent: bool = Field(False, description="Train with the RLVER agent, not reward_func.py.")
    pretrain: str | None = Field(
        None, description="The policy's path as the cluster sees it (unset: the run's model)."
    )
    save_path: str | None = Field(None, description="Checkpoint folder on shared storage.")
    max_len: int | None = Field(None, ge=1, description="Prompt + response token cap.")
    keep_lr: bool = Field(
        False,
        description="Hand OpenRLHF (full fine-tuning) train.lr as given even when it is LoRA-sized for the "
        "model.",
    )
    run: bool = Field(False, description="Run the command instead of only printing it.")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``openrlhf export`` and ``openrlhf launch``."""
    top = subparsers.add_parser(
        "openrlhf", help="export / launch a run on Ray with OpenRLHF", description=__doc__
    )
    sub = top.add_subparsers(dest="openrlhf_command", metavar="ACTION", required=True)
    ex = sub.add_parser("export", help="write the OpenRLHF job folder for a run config")
    la = sub.add_parser("launch", help="print (and with --run, run) the ray job submit command")
    from rapo_echo.training.train_cli import add_run_flags

    for parser, section, run in ((ex, ExportJob, run_export), (la, LaunchJob, run_launch)):
        add_run_flags(parser, "run directory (checkpoints go to OUTPUT/openrlhf)")  # the run config
        add_flags(parser, section, config=False)
        parser.set_defaults(func=run)


def _build_config(args: argparse.Namespace):
    from rapo_echo.training.train_cli import build_config

    args.resume = None
    return build_config(args)


def run_export(args: argparse.Namespace) -> int:
    from rapo_echo.models import load_tokenizer, resolve
    from rapo_echo.simulators.sage import preset

    from .export import (
        export_dataset,
        export_profiles,
        export_reward_file,
        export_rlver_agent,
    )

    job = section_from_args(ExportJob, args, files=False)
    cfg = _build_config(args)
    if not cfg.rewards and not job.agent:
        raise RapoEchoError("nothing to train with: the run lists no rewards and --agent was not given")
    out = Path(job.out)
    tokenizer = load_tokenizer(resolve(cfg.model.name))
    written = []
    if cfg.rewards:
        written.append(export_reward_file(cfg, out, invalid_reward=job.invalid_reward, tokenizer=tokenizer))
    if job.agent:
        settings = preset(job.sage_preset)
        written.append(export_rlver_agent(cfg, out, settings=settings, tokenizer=tokenizer))
    if job.profiles:
        written.append(export_profiles(cfg, job.profiles, out))
    else:
        written.append(export_dataset(cfg, out, tokenizer=tokenizer))
    for path in written:
        print(f"wrote {path}")
    return 0


def run_launch(args: argparse.Namespace) -> int:
    from .export import CONFIG_FILE
    from .launch import launch_command

    job = section_from_args(LaunchJob, args, files=False)
    if args.config is None and (Path(job.bundle) / CONFIG_FILE).is_file():
        args.config = str(Path(job.bundle) / CONFIG_FILE)  # the config the folder was exported with
    cfg = _build_config(args)
    cluster = ClusterSpec.model_validate(job.model_dump(include=set(ClusterSpec.model_fields)))
    cmd = launch_command(
        cfg,
        job.bundle,
        agent=job.agent,
        cluster=cluster,
        pretrain=job.pretrain,
        save_path=job.save_path,
        max_len=job.max_len,
        keep_lr=job.keep_lr,
    )
    print(shlex.join(cmd))
    if not job.run:
        return 0
    if shutil.which("ray") is None:
        raise RapoEchoError("'ray' is not on PATH: pip install 'rapo-echo[openrlhf]' (Ray and OpenRLHF)")
    if importlib.util.find_spec("openrlhf") is None:
        raise RapoEchoError(
            "OpenRLHF is not installed here: pip install 'rapo-echo[openrlhf]' (on GPU machines; its "
            "flash-attn dependency does not build without CUDA)"
        )
    return subprocess.run(cmd, check=False).returncode
