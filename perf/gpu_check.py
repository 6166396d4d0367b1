#!/usr/bin/env python3
"""One GPU check: every part a person with a GPU machine should see, in one call, one table.

    python perf/gpu_check.py OUT_DIR [--zero3] [--vllm] [--all]    # a CUDA machine
    python perf/gpu_check.py OUT_DIR --smoke                       # this CPU, a tiny model

Parts, each a subprocess under its own timeout (a failure costs one row, never the rest):

* ``models``: the GPU kit's random-weight models (``gpu/make_models.py``: the 1.4B Llama ``b``) with the
  embedded model's tokenizer (``--smoke``: a tiny 2-layer Llama);
* ``compare``: ``bench_grpo.py --compare --device cuda`` on the kit's large workload (32 prompts x 8,
  256 new tokens): our step time and peak GPU memory beside TRL's (``--smoke``: ours only, one step);
* ``decode``: ``bench_decode.py``: our compiled decode and ``transformers.generate`` against the
  memory-bandwidth limit;
* ``profile``: torch.profiler over one compiled decode call on the pinned rollout shape: the top CUDA
  kernels by time (``profile_kernels.txt``), the compiles per decode shape (dynamo's unique graphs and
  the engine's shapes) after rollouts of two prompt widths;
* ``zero3`` (``--zero3`` / ``--all``): two GRPO steps under ``accelerate launch`` with the shipped
  ZeRO-3 config and one process;
* ``vllm`` (``--vllm`` / ``--all``, where vLLM imports): two GRPO steps with ``rollout.engine: vllm``.

Every part appends JSON lines to ``OUT_DIR/gpu_check.jsonl`` (its own row plus what its tool printed);
the table is printed at the end and written to ``OUT_DIR/table.txt``. The default parts take about five
minutes on one H200 (``BIG_STEPS=3`` steps of the large workload each side).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rapo_echo.perf.bench_grpo import SHARED_BENCH_CANDIDATES

ROOT = Path(__file__).resolve().parents[1]

# Per-part limits; the default parts also share BUDGET_S, so the call ends within 8 minutes whatever
# hangs (--zero3 / --vllm add at most their own limits).
TIMEOUTS = {"models": 90, "compare": 210, "decode": 110, "profile": 100, "zero3": 150, "vllm": 150}
BUDGET_S = 470
SMOKE_TIMEOUTS = {"models": 600, "compare": 600, "decode": 600, "profile": 600}  # a loaded 2-core CI


def kit_file(*names: str) -> Path | None:
    """A file of the GPU kit (``gpu/`` of the shared bench folder, or ``.gpukit/``)."""
    for base in SHARED_BENCH_CANDIDATES:
        for name in names:
            for p in (base / "gpu" / name, base / name):
                if p.exists():
                    return p
    return None


def tokenizer_dir(out: Path, given: str | None) -> Path:
    """A folder with the embedded model's tokenizer files (``--tok``, the kit's ``tok/``, or made from the
    embedded model's cached folder)."""
    if given:
        return Path(given)
    kit = kit_file("tok")
    if kit is not None and kit.is_dir():
        return kit
    from rapo_echo.models import resolve

    src = Path(resolve("default").path)
    tok = out / "tok"
    tok.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, tok / f.name)
    return tok


def build_tiny(tok: Path, out: Path) -> dict[str, Any]:
    """The ``--smoke`` model: a 2-layer random Llama with the embedded tokenizer, saved to ``out``."""
    from transformers import AutoTokenizer

    from rapo_echo.models import tiny_llama

    tokenizer = AutoTokenizer.from_pretrained(tok)
    model = tiny_llama(tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for f in tok.iterdir():
        if f.name == "chat_template.jinja" and not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return {"model": str(out), "params": sum(p.numel() for p in model.parameters())}


def profile_decode(args: argparse.Namespace) -> dict[str, Any]:
    """The ``profile`` part, in this process: compiles per decode shape, then one profiled decode call."""
    import torch
    from torch._dynamo.utils import counters

    from rapo_echo.engines.hf import HFEngine
    from rapo_echo.perf.bench_grpo import set_workload_dir, workload
    from rapo_echo.types import SamplingParams

    if args.workload:
        set_workload_dir(args.workload)
    w = workload()
    cuda = args.device.startswith("cuda")
    engine = HFEngine.from_spec(
        args.model,
        dtype=args.dtype,
        device=args.device,
        max_batch_size=10**6,
        decode_loop="compiled",
        compile_backend=args.compile_backend,
    )
    prompts = [engine.encode(p) for p in w.prompts()]
    rows, steps = len(prompts) * w.GROUP_SIZE, args.new_tokens or w.MAX_COMPLETION_TOKENS
    longest = max(len(p) for p in prompts)
    torch._dynamo.reset()
    t0 = time.perf_counter()
    engine.pin_decode_shape(rows, longest + steps)
    compile_s = time.perf_counter() - t0
    after_pin = counters["stats"]["unique_graphs"]
    params = SamplingParams(max_new_tokens=steps, temperature=w.TEMPERATURE, n=w.GROUP_SIZE)
    engine.generate_ids(prompts, params)  # every prompt width of the workload
    engine.generate_ids([p[: max(1, len(p) // 2)] for p in prompts], params)  # other widths
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        engine.generate_ids(prompts, params)
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = prof.key_averages()
    table = events.table(sort_by=sort, row_limit=20)
    (Path(args.out) / "profile_kernels.txt").write_text(table + "\n")
    top = [
        {"name": e.key[:90], "ms": round(getattr(e, sort, 0) / 1000, 2), "calls": e.count}
        for e in sorted(events, key=lambda e: -getattr(e, sort, 0))[:8]
    ]
    static = engine._static
    return {
        "part": "profile",
        "rows": rows,
        "new_tokens": steps,
        "pinned_shape": list(static.pinned) if static and static.pinned else None,
        "shapes_decoded": {f"{r}x{n}": c for (r, n), c in (static.shapes.items() if static else [])},
        "unique_graphs_after_pin": after_pin,
        "unique_graphs_after_rollouts": counters["stats"]["unique_graphs"],
        "pin_and_compile_s": round(compile_s, 2),
        "profiled_call_s": round(wall, 3),
        "top_kernels": top,
    }


def run_part(name: str, cmd: list[str], out: Path, timeout: int, env: dict[str, str]) -> dict[str, Any]:
    """Run one part's command under ``timeout``; its JSON lines and a row for the table."""
    t0 = time.perf_counter()
    log = out / f"{name}.log"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = 124
        stdout = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
    log.write_text(f"$ {' '.join(cmd)}\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n")
    lines = []
    for line in stdout.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            lines.append(value)
    status = "ok" if code == 0 else ("timeout" if code == 124 else f"failed (exit {code})")
    return {
        "part": name,
        "status": status,
        "seconds": round(time.perf_counter() - t0, 1),
        "lines": lines,
        "log": str(log),
        "error": ""
        if code == 0
        else f"no result within {timeout} s"
        if code == 124
        else (stderr.strip().splitlines() or ["no output"])[-1][:200],
    }


def summary_of(row: dict[str, Any]) -> str:
    """The table's figures for one part."""
    lines = row["lines"]
    if row["status"] != "ok":
        return row["error"]
    if row["part"] == "compare":
        ours = next((x for x in lines if str(x.get("bench", "")).startswith("rapo_echo")), {})
        peer = next((x for x in lines if str(x.get("bench", "")).startswith("trl")), {})
        ratio = next((x for x in lines if str(x.get("bench", "")).startswith("ratios")), {})
        text = f"ours {ours.get('sec_per_step_median')} s/step"
        if ours.get("peak_gpu_mem_mb"):
            text += f", peak {ours['peak_gpu_mem_mb'] / 1024:.1f} GB"
        text += f" (micro-batch {ours.get('config', {}).get('micro_batch_size')},"
        text += f" rows {ours.get('config', {}).get('rollout_max_batch_size')})"
        if peer:
            text += f"; TRL {peer.get('sec_per_step_median')} s/step"
            if peer.get("peak_gpu_mem_mb"):
                text += f", peak {peer['peak_gpu_mem_mb'] / 1024:.1f} GB"
        if ratio:
            text += f"; ratio time {ratio.get('sec_per_step')}, memory {ratio.get('peak_gpu_mem', '-')}"
        return text
    if row["part"] == "decode":
        s = next((x for x in lines if x.get("bench") == "decode_summary"), {})
        methods = {x["method"]: x["s_median"] for x in lines if x.get("bench") == "decode"}
        text = ", ".join(f"{k} {v} s" for k, v in methods.items())
        if s.get("times_the_limit"):
            text += "; x bandwidth limit: " + ", ".join(f"{k} {v}" for k, v in s["times_the_limit"].items())
        return text
    if row["part"] == "profile":
        p = next((x for x in lines if x.get("part") == "profile"), {})
        top = p.get("top_kernels") or [{}]
        return (
            f"pinned {p.get('pinned_shape')}, graphs {p.get('unique_graphs_after_pin')} -> "
            f"{p.get('unique_graphs_after_rollouts')} after 2 rollouts, shapes {p.get('shapes_decoded')}; "
            f"call {p.get('profiled_call_s')} s, top {top[0].get('name')} {top[0].get('ms')} ms"
        )
    if row["part"] == "models":
        return ", ".join(
            f"{Path(x['model']).name} {x.get('params', 0) / 1e6:,.0f}M" for x in lines if "model" in x
        )
    return "done" if row["status"] == "ok" else row["error"]


def table(rows: list[dict[str, Any]]) -> str:
    out = [f"{'part':<9} {'status':<18} {'s':>7}  figures", "-" * 100]
    for r in rows:
        out.append(f"{r['part']:<9} {r['status']:<18} {r['seconds']:>7}  {summary_of(r)}")
    return "\n".join(out)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="folder for gpu_check.jsonl, table.txt, the logs and the profile")
    ap.add_argument("--smoke", action="store_true", help="on this CPU with a tiny model (tests the script)")
    ap.add_argument("--zero3", action="store_true", help="also: 2 steps under ZeRO-3, 1 process")
    ap.add_argument("--vllm", action="store_true", help="also: 2 steps with rollout.engine: vllm")
    ap.add_argument("--all", action="store_true", help="every part")
    ap.add_argument("--tok", help="folder with the embedded model's tokenizer files")
    ap.add_argument("--models", help="folder for the random-weight models (default OUT/models)")
    ap.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one in-process part
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    ap.add_argument("--compile-backend", default="inductor", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--new-tokens", type=int, help=argparse.SUPPRESS)
    return ap.parse_args()


Plan = list[tuple[str, list[str]]]


def models_and_compare(args: argparse.Namespace, out: Path, py: str, me: str) -> tuple[Plan, dict[str, str]]:
    """The ``models`` and ``compare`` parts, and the model / device / dtype / backend / workload the
    later parts use (``--smoke``: a tiny random Llama on this CPU; else the kit's 1.4B on CUDA)."""
    models = Path(args.models) if args.models else out / "models"
    tok = tokenizer_dir(out, args.tok)
    if args.smoke:
        model = models / "tiny-rand"
        small = kit_file("workload.py")
        setup = {
            "model": str(model),
            "device": "cpu",
            "dtype": "float32",
            "backend": "aot_eager",
            "workload": str(small.parent) if small else "",
        }
        maker = [py, me, str(out), "--part", "tiny", "--tok", str(tok), "--model", str(model)]
        compare = [py, "perf/bench_grpo.py", "--device", "cpu", "--steps", "1"]
        compare += ["--model", str(model), "--out", str(out / "compare.jsonl")]
        compare += ["--set", "rollout.max_new_tokens=8"]
        return [("models", maker), ("compare", compare)], setup
    model = models / "llama-1.4b-rand"
    kit_maker, large = kit_file("make_models.py"), kit_file("large")
    if kit_maker is None or large is None:
        raise FileNotFoundError(
            "the GPU kit (gpu/make_models.py, gpu/large/) is in none of the shared bench folders; see "
            "../shared/bench/gpu/README.md"
        )
    setup = {
        "model": str(model),
        "device": "cuda",
        "dtype": "bfloat16",
        "backend": "inductor",
        "workload": str(large),
    }
    maker = [py, str(kit_maker), "--tok", str(tok), "--out", str(models), "--which", "b"]
    compare = [py, "perf/bench_grpo.py", "--compare", "--device", "cuda"]
    compare += ["--workload", str(large), "--model", str(model), "--out", str(out / "compare.jsonl")]
    return [("models", maker), ("compare", compare)], setup


def decode_and_profile(args: argparse.Namespace, out: Path, py: str, me: str, setup: dict[str, str]) -> Plan:
    """The ``decode`` and ``profile`` parts on the model ``setup`` names."""
    workload = ["--workload", setup["workload"]] if setup["workload"] else []
    common = ["--model", setup["model"], "--device", setup["device"], "--dtype", setup["dtype"]]
    loops = "dynamic" if args.smoke else "compiled"  # smoke: the profile part compiles; keep this one short
    decode = [py, "perf/bench_decode.py", *common, "--loops", loops, "--repeats", "1"]
    decode += ["--compile-backend", setup["backend"], "--out", str(out / "decode.jsonl"), *workload]
    if args.smoke:
        decode += ["--no-generate"]
    profile = [
        py,
        me,
        str(out),
        "--part",
        "profile",
        *common,
        "--compile-backend",
        setup["backend"],
        *workload,
    ]
    if args.smoke:
        profile += ["--new-tokens", "8"]
    return [("decode", decode), ("profile", profile)]


def optional_parts(args: argparse.Namespace, out: Path, py: str, model: str) -> Plan:
    """``zero3`` and ``vllm`` (``--zero3`` / ``--vllm`` / ``--all``; never under ``--smoke``)."""
    plan: Plan = []
    if args.smoke:
        return plan
    train = [
        "-m",
        "rapo_echo.cli",
        "train",
        "--config",
        "configs/grpo.yaml",
        "--model",
        model,
        "--max-steps",
        "2",
    ]
    train += ["--set", "model.device=cuda", "--set", "rollout.max_new_tokens=64"]
    if args.zero3 or args.all:
        launch = [
            py,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            "configs/accelerate/deepspeed_zero3.yaml",
        ]
        plan.append(("zero3", [*launch, "--num_processes", "1", *train, "--output", str(out / "zero3-run")]))
    if args.vllm or args.all:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            plan.append(("vllm", [py, "-c", "import sys; sys.exit('vllm is not installed')"]))
        else:
            run = [py, *train, "--output", str(out / "vllm-run"), "--set", "rollout.engine=vllm"]
            plan.append(("vllm", run))
    return plan


def run_plan(plan: Plan, out: Path, smoke: bool, env: dict[str, str]) -> list[dict[str, Any]]:
    """Each part under its limit (the default parts share ``BUDGET_S``), its rows appended to
    ``gpu_check.jsonl``; a failed ``models`` part ends the plan."""
    timeouts = SMOKE_TIMEOUTS if smoke else TIMEOUTS
    rows: list[dict[str, Any]] = []
    deadline = time.perf_counter() + (10**6 if smoke else BUDGET_S)
    for name, cmd in plan:
        limit = timeouts.get(name, 240)
        if name not in ("zero3", "vllm"):
            limit = min(limit, int(deadline - time.perf_counter()))
        if limit < 10:
            error = f"the {BUDGET_S} s budget of the default parts is spent"
            rows.append(
                {
                    "part": name,
                    "status": "skipped (budget)",
                    "seconds": 0,
                    "lines": [],
                    "log": "",
                    "error": error,
                }
            )
            continue
        row = run_part(name, cmd, out, limit, env)
        rows.append(row)
        if name == "models" and row["status"] != "ok":
            print(f"{name}: {row['status']} ({row['error']}); nothing else can run", file=sys.stderr)
            break
        with (out / "gpu_check.jsonl").open("a") as fh:
            head = {k: v for k, v in row.items() if k != "lines"} | {"summary": summary_of(row)}
            fh.write(json.dumps(head) + "\n")
            for line in row["lines"]:
                fh.write(json.dumps({"part": name, **line}) + "\n")
        print(f"{name}: {row['status']} in {row['seconds']} s", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    args = parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args.out = str(out)
    if args.part == "profile":
        print(json.dumps(profile_decode(args)), flush=True)
        return 0
    if args.part == "tiny":
        print(json.dumps(build_tiny(Path(args.tok), Path(args.model))), flush=True)
        return 0
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
    # the checkout after the installed package: its rapo_echo/ folder lacks the mapped algorithms/ etc.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(ROOT)) if p)
    if not args.smoke:
        env.setdefault("BIG_STEPS", "3")
    py, me = sys.executable, str(Path(__file__).resolve())
    try:
        plan, setup = models_and_compare(args, out, py, me)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    plan += decode_and_profile(args, out, py, me, setup) + optional_parts(args, out, py, setup["model"])
    rows = run_plan(plan, out, args.smoke, env)
    text = table(rows)
    (out / "table.txt").write_text(text + "\n")
    print(text)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
