#!/usr/bin/env python3
"""`make bench`: our GRPO (and RAPO, RLVER) on the fixed shared workload, one JSON line per run.

The workload is ../shared/bench/workload.py (SmolLM2-135M-Instruct in fp32, 8 prompts x 4
completions, 48 new tokens, beta 0.04 so a reference is scored, full fine-tuning, 4 optimizer
steps, lr 1e-6, the workload's deterministic reward). The figures use the peer's keys
(``sec_per_step_median``, ``completion_tokens_per_s``, ``peak_rss_mb``, ``total_wall_s``) plus a
per-stage breakdown. Model loading is not timed.

    python perf/bench_grpo.py                 # our GRPO, full fine-tuning
    python perf/bench_grpo.py --lora          # LoRA variant (reference = adapter off)
    python perf/bench_grpo.py --algo rapo     # RAPO step (simulator + judge share weights)
    python perf/bench_grpo.py --gradient-checkpointing   # the memory effect (peak_rss_mb)
    python perf/bench_grpo.py --algo rlver    # RLVER step: 8 profiles x 4 dialogues of
                                                         # 3 policy turns of <= 48 tokens, the
                                                         # simulator sharing the policy's weights
    python perf/bench_grpo.py --compare       # peer (TRL, own venv) and ours alternately + ratios

Each run happens in a fresh process, one after another (never two at once on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rapo_echo.perf.workload import (
    ROOT,
    SHARED_BENCH,
    SHARED_BENCH_CANDIDATES,
    set_workload_dir,
    workload,
)

STAGES = (
    "generate",
    "rewards",
    "simulate",
    "judge",
    "distill",
    "values",
    "ref_logprobs",
    "old_logprobs",
    "policy_forward",
    "backward",
    "optimizer",
)


def workload_reward(prompts, completions, **columns):
    """The workload's reward as a TRL-style function (so both sides score exactly the same)."""
    w = workload()
    return [w.score_text(c[0]["content"]) for c in completions]


def workload_overrides(args: argparse.Namespace, w: Any, tmp: Path, data: Path) -> list[str]:
    """The run config's overrides of the workload (``--set`` not included)."""
    from rapo_echo.models import resolve

    model = args.model or str(resolve("default").path)
    overrides = [
        f"model.name={model}",
        f"output={tmp / 'run'}",
        f"data.path={data}",
        "data.shuffle=false",
        f"rollout.batch_size={w.NUM_PROMPTS}",
        f"rollout.group_size={w.GROUP_SIZE}",
        f"rollout.max_new_tokens={w.MAX_COMPLETION_TOKENS}",
        f"rollout.temperature={w.TEMPERATURE}",
        "rollout.top_p=1.0",
        "rollout.top_k=0",
        "rollout.system_prompt=null",
        f"train.lr={w.LEARNING_RATE}",
        "train.scheduler=linear",
        f"train.max_steps={w.NUM_STEPS}",
        f"train.seed={w.SEED}",
        "train.max_grad_norm=1.0",
        "train.micro_batch_size=" + str(args.micro_batch),
        f"model.device={args.device}",
        f"model.dtype={args.dtype}",
        f"loss.beta={w.BETA}",
        "loss.advantage=grpo",
        "loss.agg=token-mean",
        "loss.eps_low=0.2",
        "loss.eps_high=0.2",
        "rewards=[{name: 'rapo_echo.perf.bench_grpo:workload_reward'}]",
        "logging.progress=false",
        "logging.tensorboard=false",
        "train.save_every=1000000",
        f"model.lora.enabled={str(args.lora).lower()}",
        f"model.gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
    ]
    if args.algo == "rapo":
        overrides += ["rewards=[]", "simulator.engine=policy", "judge.engine=policy"]
    if args.algo == "rlver":
        overrides = [o for o in overrides if not o.startswith(("data.path=", "rollout.system_prompt="))]
        overrides += RLVER_OVERRIDES
    return overrides


def gpu_figures(args: argparse.Namespace, trainer: Any, w: Any, generate_s: list[float]) -> dict[str, Any]:
    """Peak GPU memory, the device, and the rollout's decode against the memory-bandwidth limit."""
    import torch

    from rapo_echo.perf.bench_decode import decode_bytes, measured_bandwidth

    gpu: dict[str, Any] = {}
    gpu["peak_gpu_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    gpu["peak_gpu_reserved_mb"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    gpu["gpu"] = torch.cuda.get_device_name(args.device)
    lm = trainer.policy.lm
    width = max(len(trainer.policy.prompt_ids(s)) for s in trainer.scenarios)
    rows = w.NUM_PROMPTS * w.GROUP_SIZE
    need = decode_bytes(lm, rows, width, w.MAX_COMPLETION_TOKENS, next(lm.parameters()).element_size())
    limit = need / measured_bandwidth(args.device)
    gpu["generate_bandwidth_limit_s"] = round(limit, 4)
    gpu["generate_vs_bandwidth_limit"] = round(statistics.median(generate_s) / limit, 2)
    return gpu


def run_ours(args: argparse.Namespace) -> dict:
    """One timed run of our trainer on the workload, in this process."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from rapo_echo.training.run import Run  # absolute: this file also runs as a script
    from rapo_echo.training.run_config import load_config

    w = workload()
    tmp = Path(tempfile.mkdtemp(prefix="rapo-bench-"))
    data = tmp / "workload.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"w{i}", "messages": p}) + "\n" for i, p in enumerate(w.prompts()))
    )
    overrides = workload_overrides(args, w, tmp, data)
    cfg = load_config(algo=args.algo, overrides=overrides + args.set)
    t_load = time.perf_counter()
    trainer = Run(cfg)
    trainer.open_logs()
    load_s = time.perf_counter() - t_load
    steps, per_stage, tokens = [], {s: [] for s in STAGES}, 0
    gen_tokens, gen_time, rewards = 0, 0.0, []
    cuda = args.device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    sync()
    extra: dict[str, list[float]] = {}
    t_all = time.perf_counter()
    for _ in range(args.steps or w.NUM_STEPS):
        t0 = time.perf_counter()
        m = trainer.train_step()
        trainer.step += 1
        sync()
        steps.append(time.perf_counter() - t0)
        for s in STAGES:
            per_stage[s].append(m.get(f"time/{s}", 0.0))
        n = m["reply_len/mean"] * w.NUM_PROMPTS * w.GROUP_SIZE
        tokens += n
        gen_tokens += n
        gen_time += m["time/generate"]
        rewards.append(m["reward/mean"])
        for k in RLVER_METRICS if args.algo == "rlver" else ():
            extra.setdefault(k, []).append(m.get(k, float("nan")))
    total = time.perf_counter() - t_all
    gpu = gpu_figures(args, trainer, w, per_stage["generate"]) if cuda else {}
    return {
        "bench": f"rapo_echo_{args.algo}"
        + ("_lora" if args.lora else "")
        + ("_gradient_checkpointing" if args.gradient_checkpointing else ""),
        "device": args.device,
        "dtype": args.dtype,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "model_load_s": round(load_s, 2),
        "total_wall_s": round(total, 2),
        "sec_per_step_median": round(statistics.median(steps), 2),
        "sec_per_step": [round(s, 2) for s in steps],
        "completion_tokens_total": round(tokens),
        "completion_tokens_per_s": round(tokens / total, 2),
        "generate_tokens_per_s": round(gen_tokens / gen_time, 2) if gen_time else None,
        "mean_reward": round(statistics.fmean(rewards), 4),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        **gpu,
        "breakdown_s_median": {s: round(statistics.median(v), 3) for s, v in per_stage.items() if any(v)},
        **({"dialogues": {k: [round(x, 3) for x in v] for k, v in extra.items()}} if extra else {}),
        "config": {
            "algo": args.algo,
            "lora": args.lora,
            "gradient_checkpointing": args.gradient_checkpointing,
            "micro_batch_size": trainer.cfg.train.micro_batch_size,
            "rollout_max_batch_size": trainer.cfg.rollout.max_batch_size,
            "asked": trainer.learner.resolved["asked"],
            "decode_loop": trainer.policy.engine.decode_mode,
            "workload": str(Path(w.__file__).parent),
            "steps": args.steps or w.NUM_STEPS,
            "set": (RLVER_OVERRIDES if args.algo == "rlver" else []) + args.set,
        },
    }


# RLVER on the workload's sizes: 8 of our bundled profiles (their preset first talks), a group of 4
# dialogues each, up to 3 policy turns of at most 48 tokens, the simulated user on the policy's own
# weights. The 135M simulator reads the emotion change from label probabilities and answers in plain
# text (SAGE's labelled fields are beyond it), so its dialogues run their full length.
RLVER_OVERRIDES = [
    "data.path=bundled:sage_profiles_en.jsonl",
    "rewards=[]",
    "simulator.engine=policy",
    "rlver.simulator.max_turns=3",
    "rlver.simulator.max_new_tokens=96",
    "rlver.simulator.max_retries=1",
    "rlver.simulator.emotion_readout=logprobs",
    "rlver.simulator.plain_reply=true",
]
RLVER_METRICS = ("rlver/turns", "emotion/final", "invalid", "rlver/tokens", "sim/parse_failures")


def run_subprocess(cmd: list[str]) -> dict:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"command failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def peer_command(args: argparse.Namespace) -> list[str]:
    """The TRL peer in its own venv; the LoRA variant goes through trl_lora_peer.py (``python -O``); on
    CUDA the GPU peer of the kit (``gpu/trl_grpo_peer_gpu.py`` beside the shared workload, bf16)."""
    python = Path(args.peer_python)
    if not python.is_file():
        sys.exit(
            f"the peer's venv python {python} is missing; create it as ../shared/bench/README.md says:\n"
            "  python3 -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 trl==1.16.0 gguf peft"
        )
    if args.device.startswith("cuda"):
        gpu_peer = next(
            (
                p
                for c in SHARED_BENCH_CANDIDATES
                for p in (c / "gpu" / "trl_grpo_peer_gpu.py", c / "trl_grpo_peer_gpu.py")
                if p.is_file()
            ),
            None,
        )
        if gpu_peer is None or args.lora:
            sys.exit(
                "--compare on CUDA needs ../shared/bench/gpu/trl_grpo_peer_gpu.py (or a copy in "
                ".gpukit/); there is no LoRA variant on CUDA"
            )
        cmd = [str(python), str(gpu_peer), "--workload", str(Path(workload().__file__).parent)]
        cmd += ["--device", "cuda", "--dtype", "bf16" if args.dtype == "bfloat16" else "fp32"]
        if args.peer_micro_batch:
            cmd += ["--micro-batch", str(args.peer_micro_batch)]
    elif args.lora:
        cmd = [str(python), "-O", str(Path(__file__).with_name("trl_lora_peer.py"))]
    else:
        cmd = [str(python), str(SHARED_BENCH / "trl_grpo_peer.py")]
    if args.model:
        cmd += ["--model", args.model]
    return cmd


def checked_peer(line: dict, args: argparse.Namespace) -> dict:
    """The peer's JSON line, checked for the whole workload (4 steps x 32 completions) and labelled."""
    w = workload()
    expected = w.NUM_STEPS * w.NUM_PROMPTS * w.GROUP_SIZE
    if len(line["sec_per_step"]) != w.NUM_STEPS or line["completions_total"] != expected:
        sys.exit(
            f"the peer did not run the whole workload: {line['sec_per_step']}, {line['completions_total']}"
        )
    if args.lora:
        line["bench"] = "trl_grpo_peer_lora"
        line["config"]["lora"] = True
    return line


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", default="grpo", choices=["grpo", "rapo", "rlver"])
    ap.add_argument("--steps", type=int, help="optimizer steps to time (default: the workload's 4)")
    ap.add_argument("--lora", action="store_true", help="LoRA instead of full fine-tuning")
    ap.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="model.gradient_checkpointing: recompute activations in backward (compare peak_rss_mb)",
    )
    ap.add_argument("--model", help="model folder (default: the embedded model's cached folder)")
    ap.add_argument("--micro-batch", default="auto", help="sequences per micro-batch (auto: 8 on a CPU)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (cuda: bf16 and peak GPU memory)")
    ap.add_argument("--dtype", help="policy dtype (default float32 on a CPU, bfloat16 on CUDA)")
    ap.add_argument("--workload", help="folder holding workload.py (e.g. ../shared/bench/gpu/large)")
    ap.add_argument(
        "--peer-micro-batch", type=int, help="CUDA --compare: TRL's per-device batch (default: all at once)"
    )
    ap.add_argument("--set", action="append", default=[], help="extra config override KEY=VALUE")
    ap.add_argument(
        "--compare", action="store_true", help="run the TRL peer and ours alternately; print ratios"
    )
    ap.add_argument("--rounds", type=int, default=1, help="alternations with --compare")
    ap.add_argument(
        "--peer-python",
        help="python of the TRL peer (default .venv-trl/bin/python; on CUDA this python if that is absent)",
    )
    ap.add_argument("--raw", action="store_true", help="with --compare, also run the raw-limit script")
    ap.add_argument("--out", help="also append the JSON lines to this file")
    ap.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    cuda = args.device.startswith("cuda")
    if args.dtype is None:
        args.dtype = "bfloat16" if cuda else "float32"
    if args.peer_python is None:
        venv = ROOT / ".venv-trl" / "bin" / "python"
        args.peer_python = str(venv if venv.is_file() or not cuda else Path(sys.executable))
    if args.raw and cuda:
        sys.exit(
            "--raw runs ../shared/bench/raw_generate_limit.py, a CPU fp32 script; on CUDA the JSON line "
            "carries the generation's bandwidth limit instead"
        )
    if args.workload:
        set_workload_dir(args.workload)
    workload()  # fails early, saying where it looked, when the workload cannot be found
    if args.in_process:
        print(json.dumps(run_ours(args)))
        return
    if args.model is None:  # the peer, the raw limits and ours all load the same folder
        from rapo_echo.models import resolve

        args.model = str(resolve("default").path)
    ours_cmd = [
        sys.executable,
        __file__,
        "--in-process",
        "--algo",
        args.algo,
        "--micro-batch",
        str(args.micro_batch),
        "--device",
        args.device,
        "--dtype",
        args.dtype,
    ]
    ours_cmd += ["--steps", str(args.steps)] if args.steps else []
    ours_cmd += ["--lora"] if args.lora else []
    ours_cmd += ["--gradient-checkpointing"] if args.gradient_checkpointing else []
    ours_cmd += ["--model", args.model] if args.model else []
    for s in args.set:
        ours_cmd += ["--set", s]

    def emit(line: dict) -> dict:
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(line) + "\n")
        return line

    if not args.compare:
        emit(run_subprocess(ours_cmd))
        return
    for _ in range(args.rounds):
        peer = emit(checked_peer(run_subprocess(peer_command(args)), args))
        ours = emit(run_subprocess(ours_cmd))
        ratio = {
            "bench": "ratios_ours_over_peer" + ("_lora" if args.lora else ""),
            "sec_per_step": round(ours["sec_per_step_median"] / peer["sec_per_step_median"], 3),
            "peak_rss": round(ours["peak_rss_mb"] / peer["peak_rss_mb"], 3),
            "completion_tokens_per_s": round(
                ours["completion_tokens_per_s"] / peer["completion_tokens_per_s"], 3
            ),
        }
        if ours.get("peak_gpu_mem_mb") and peer.get("peak_gpu_mem_mb"):
            ratio["peak_gpu_mem"] = round(ours["peak_gpu_mem_mb"] / peer["peak_gpu_mem_mb"], 3)
            ratio["generate_vs_bandwidth_limit"] = ours["generate_vs_bandwidth_limit"]
        if args.raw:
            raw_cmd = [args.peer_python, str(SHARED_BENCH / "raw_generate_limit.py")]
            raw = emit(run_subprocess(raw_cmd + (["--model", args.model] if args.model else [])))
            ratio["generate_vs_raw_generate"] = round(
                ours["generate_tokens_per_s"] / raw["generated_tokens_per_s"], 3
            )
            ratio["sec_per_step_vs_raw_floor"] = round(
                ours["sec_per_step_median"] / raw["grpo_step_floor_s"], 3
            )
        emit(ratio)


if __name__ == "__main__":
    main()
