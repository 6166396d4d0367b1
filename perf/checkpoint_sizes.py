#!/usr/bin/env python3
"""Disk size of one training checkpoint, per setup: LoRA and full fine-tuning, one process, and two
processes under DeepSpeed ZeRO-2 / ZeRO-3 (DeepSpeed's CPU accelerator on a machine without CUDA).
Each setup trains one GRPO step with ``train.save_every=1`` and the sizes of ``checkpoints/step-1`` are
read per part: ``model/`` (Hugging Face / PEFT folder, tokenizer included), ``optimizer.pt``,
``accelerate/`` (DeepSpeed's shards: ``*model_states.pt`` and ``*optim_states.pt``), the rest (RNG,
scheduler, trainer state). One JSON line per setup, then a summary line.

    python perf/checkpoint_sizes.py                 # the embedded SmolLM2-135M, 5 setups
    python perf/checkpoint_sizes.py --setups lora,zero3-full --model DIR

The DeepSpeed setups use the shipped ``configs/accelerate/deepspeed_zero{2,3}.yaml`` and JSON (bf16 on,
as shipped; ``--fp32`` turns it off in a copy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

SETUPS = {  # name: (processes, ZeRO stage or None, LoRA)
    "lora": (1, None, True),
    "full": (1, None, False),
    "zero2-full": (2, 2, False),
    "zero3-lora": (2, 3, True),
    "zero3-full": (2, 3, False),
}
# DeepSpeed's optional shared-memory all-reduce kernel is a C++ build of a minute or more on first use;
# gloo carries the same collectives (as in tests/helpers/multiproc_probe.py)
ENTRY = """import sys
import deepspeed.ops
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
from rapo_echo.cli import main
sys.exit(main(sys.argv[1:]))
"""


def launch_config(tmp: Path, stage: int, fp32: bool) -> Path:
    """The shipped launch config of ``stage`` with its JSON copied (bf16 off in the copy if ``fp32``)."""
    import yaml

    ds = json.loads((ROOT / f"configs/deepspeed/zero{stage}.json").read_text())
    if fp32:
        ds["bf16"] = {"enabled": False}
    (tmp / f"zero{stage}.json").write_text(json.dumps(ds))
    cfg = yaml.safe_load((ROOT / f"configs/accelerate/deepspeed_zero{stage}.yaml").read_text())
    cfg["deepspeed_config"]["deepspeed_config_file"] = str(tmp / f"zero{stage}.json")
    (tmp / f"zero{stage}.yaml").write_text(yaml.safe_dump(cfg))
    return tmp / f"zero{stage}.yaml"


def part_of(rel: Path) -> str:
    top = rel.parts[0]
    if top == "accelerate":
        name = rel.name
        if name.endswith("optim_states.pt"):
            return "deepspeed_optimizer_shards"
        if name.endswith("model_states.pt"):
            return "deepspeed_model_states"
        return "deepspeed_other"
    if top == "model":
        return "model_tokenizer" if "token" in rel.name or rel.suffix == ".jinja" else "model_weights"
    if rel.name == "optimizer.pt":
        return "optimizer"
    return "other"


def sizes(folder: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        key = part_of(f.relative_to(folder))
        out[key] = out.get(key, 0) + f.stat().st_size
    return out


def run_setup(name: str, model: str, tmp: Path, fp32: bool) -> dict:
    processes, stage, lora = SETUPS[name]
    run = tmp / name
    settings = [
        f"model.name={model}",
        f"model.lora.enabled={str(lora).lower()}",
        "rollout.batch_size=1",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "rewards=[{name: length, args: {target: 4}}]",
        "loss.beta=0",
        "train.max_steps=1",
        "train.save_every=1",
        "train.micro_batch_size=2",
        "logging.progress=false",
        "logging.tensorboard=false",
    ]
    args = ["train", "--output", str(run)]
    for s in settings:
        args += ["--set", s]
    if stage is None:
        cmd = [str(BIN / "rapo-echo"), *args]
    else:
        entry = tmp / "entry.py"
        entry.write_text(ENTRY)
        cfg = launch_config(tmp, stage, fp32)
        cmd = [str(BIN / "accelerate"), "launch", "--config_file", str(cfg)]
        cmd += ["--num_processes", str(processes), str(entry), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{name} failed:\n{res.stderr[-3000:]}")
    parts = sizes(run / "checkpoints" / "step-1")
    return {
        "setup": name,
        "processes": processes,
        "zero_stage": stage,
        "lora": lora,
        "deepspeed_bf16": None if stage is None else not fp32,
        "parts_bytes": parts,
        "total_bytes": sum(parts.values()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="model spec (default: the embedded SmolLM2-135M)")
    ap.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated, of {', '.join(SETUPS)}")
    ap.add_argument("--fp32", action="store_true", help="DeepSpeed setups with bf16 off (a copy of the JSON)")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ckpt-sizes-") as tmp:
        for name in args.setups.split(","):
            row = run_setup(name.strip(), args.model, Path(tmp), args.fp32)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps({"summary": {r["setup"]: r["total_bytes"] for r in rows}, "model": args.model}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
