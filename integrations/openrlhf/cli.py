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

from rapo_echo.errors import RapoEchoError


def _config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML run config (see configs/)")
    p.add_argument("--algo", help="algorithm (overrides the config's algo)")
    p.add_argument("--model", help="policy model spec")
    p.add_argument("--reward", action="append", metavar="NAME[=WEIGHT]", help="reward plugin; repeatable")
    p.add_argument("--output", help="run directory (checkpoints go to OUTPUT/openrlhf)")
    p.add_argument("--max-steps", type=int, help="number of training steps")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``openrlhf export`` and ``openrlhf launch``."""
    top = subparsers.add_parser(
        "openrlhf", help="export / launch a run on Ray with OpenRLHF", description=__doc__
    )
    sub = top.add_subparsers(dest="openrlhf_command", metavar="ACTION", required=True)

    ex = sub.add_parser("export", help="write the OpenRLHF job folder for a run config")
    _config_flags(ex)
    ex.add_argument("--out", required=True, help="job folder to write")
    ex.add_argument("--agent", action="store_true", help="also write the RLVER simulated-user agent")
    ex.add_argument("--profiles", help="JSON lines of simulated-user profiles for the agent's prompts")
    ex.add_argument(
        "--sage-preset",
        choices=("sage", "rlver"),
        default="sage",
        help="simulated user: SAGE evaluation settings (start 40, change clamped to +-10, ends below 10, "
        "10 turns) or RLVER's training simulator (start 30, no clamp, ends at <= 0, 8 turns)",
    )
    ex.add_argument("--invalid-reward", type=float, help="reward of an unscorable sample (default -sum|w|)")
    ex.set_defaults(func=run_export)

    la = sub.add_parser("launch", help="print (and with --run, run) the ray job submit command")
    _config_flags(la)
    la.add_argument("--bundle", required=True, help="job folder written by 'openrlhf export'")
    la.add_argument("--agent", action="store_true", help="train with the RLVER agent, not reward_func.py")
    la.add_argument("--nodes", type=int, default=1)
    la.add_argument("--gpus-per-node", type=int, default=8)
    la.add_argument("--vllm-engines", type=int, help="default: one per GPU group of --vllm-tp")
    la.add_argument("--vllm-tp", type=int, default=1, help="vLLM tensor-parallel size")
    la.add_argument("--vllm-memory", type=float, default=0.5, help="vLLM gpu_memory_utilization")
    la.add_argument(
        "--no-colocate", action="store_true", help="vLLM on GPUs of its own (not the hybrid engine)"
    )
    la.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=2)
    la.add_argument("--address", default="http://127.0.0.1:8265", help="Ray dashboard address")
    la.add_argument("--pretrain", help="policy path as the cluster sees it (default: the run's model)")
    la.add_argument("--save-path", help="checkpoint folder on shared storage")
    la.add_argument("--max-len", type=int, help="prompt + response token cap")
    la.add_argument(
        "--keep-lr",
        action="store_true",
        help="hand OpenRLHF (full fine-tuning) train.lr as given even when it is LoRA-sized for the model",
    )
    la.add_argument("--run", action="store_true", help="run the command instead of only printing it")
    la.set_defaults(func=run_launch)


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

    cfg = _build_config(args)
    if not cfg.rewards and not args.agent:
        raise RapoEchoError("nothing to train with: the run lists no rewards and --agent was not given")
    out = Path(args.out)
    tokenizer = load_tokenizer(resolve(cfg.model.name))
    written = []
    if cfg.rewards:
        written.append(export_reward_file(cfg, out, invalid_reward=args.invalid_reward, tokenizer=tokenizer))
    if args.agent:
        settings = preset(args.sage_preset)
        written.append(export_rlver_agent(cfg, out, settings=settings, tokenizer=tokenizer))
    if args.profiles:
        written.append(export_profiles(cfg, args.profiles, out))
    else:
        written.append(export_dataset(cfg, out, tokenizer=tokenizer))
    for path in written:
        print(f"wrote {path}")
    return 0


def run_launch(args: argparse.Namespace) -> int:
    from .export import CONFIG_FILE
    from .launch import ClusterSpec, launch_command

    if args.config is None and (Path(args.bundle) / CONFIG_FILE).is_file():
        args.config = str(Path(args.bundle) / CONFIG_FILE)  # the config the folder was exported with
    cfg = _build_config(args)
    cluster = ClusterSpec(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        vllm_engines=args.vllm_engines,
        vllm_tensor_parallel=args.vllm_tp,
        vllm_gpu_memory_utilization=args.vllm_memory,
        colocate=not args.no_colocate,
        zero_stage=args.zero_stage,
        address=args.address,
    )
    cmd = launch_command(
        cfg,
        args.bundle,
        agent=args.agent,
        cluster=cluster,
        pretrain=args.pretrain,
        save_path=args.save_path,
        max_len=args.max_len,
        keep_lr=args.keep_lr,
    )
    print(shlex.join(cmd))
    if not args.run:
        return 0
    if shutil.which("ray") is None:
        raise RapoEchoError("'ray' is not on PATH: pip install 'rapo-echo[openrlhf]' (Ray and OpenRLHF)")
    if importlib.util.find_spec("openrlhf") is None:
        raise RapoEchoError(
            "OpenRLHF is not installed here: pip install 'rapo-echo[openrlhf]' (on GPU machines; its "
            "flash-attn dependency does not build without CUDA)"
        )
    return subprocess.run(cmd, check=False).returncode
