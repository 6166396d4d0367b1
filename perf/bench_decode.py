#!/usr/bin/env python3
"""Generation alone: the ``hf`` engine's decode loops against transformers' ``generate``, and on a GPU
against the memory-bandwidth limit. One JSON line per method, then a summary line.

The batch is one GRPO rollout of the benchmark workload (``workload.workload()``: 8 prompts x 4
samples, 48 new tokens on the shared workload; ``--workload`` picks another folder, e.g. the larger
GPU one), sampled at the workload's temperature. Every method gets one untimed warm-up call (which
also compiles the ``compiled`` loop), then ``--repeats`` timed calls; medians are reported.

    python perf/bench_decode.py                          # CPU, fp32, the embedded model
    python perf/bench_decode.py --device cuda --dtype bfloat16 --model DIR \\
        --workload ../shared/bench/gpu/large --loops dynamic,compiled

Bandwidth limit (CUDA only): a decode step must read every weight once and the KV cache written so
far, so ``sum over steps of (weight bytes + KV bytes at that step) / bandwidth`` bounds the decode
time from below (prefill not counted). The bandwidth is measured on the device (a large
device-to-device copy, bytes read + written per second) and, where torch reports the memory clock and
bus width, also computed from them (``spec``); the limit uses the measured one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rapo_echo.perf.workload import set_workload_dir, workload


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measured_bandwidth(device: str) -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write), median of 5."""
    import torch

    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t0)
    del src, dst
    return 2 * 2**30 / statistics.median(times[1:])


def spec_bandwidth(device: str) -> float | None:
    """Peak bandwidth from the memory clock (kHz) and bus width (bits) torch reports, if it does."""
    import torch

    props = torch.cuda.get_device_properties(device)
    clock, bus = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    return 2 * clock * 1e3 * bus / 8 if clock and bus else None


def decode_bytes(model, rows: int, prompt_len: int, steps: int, kv_bytes_per_elem: int) -> float:
    """Bytes a perfect decoder reads over ``steps`` steps: all weights once per step, plus the KV cache
    of every row up to that step."""
    cfg = model.config.get_text_config()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = 2 * cfg.num_hidden_layers * heads * head_dim * kv_bytes_per_elem
    kv = sum(rows * (prompt_len + t) * per_token for t in range(steps))
    return steps * weights + kv


def first_eos_lengths(completions, eos_ids: set[int]) -> list[int]:
    """Tokens per row up to and including the first EOS (the count TRL and our engine use)."""
    out = []
    for row in completions.tolist():
        n = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        out.append(n)
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model folder (default: the embedded model's cached folder)")
    ap.add_argument("--workload", help="folder holding a workload.py (default: the shared workload)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--loops", default="dynamic,static,compiled", help="our decode loops to time")
    ap.add_argument("--no-generate", action="store_true", help="skip transformers' generate")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="also append the JSON lines to this file")
    return ap.parse_args()


def timed(fn: Callable[[], int], device: str, repeats: int) -> tuple[list[float], list[int]]:
    """One untimed warm-up call (which also compiles), then ``repeats`` timed calls: seconds and tokens."""
    import torch

    fn()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times, tokens = [], []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        n = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        tokens.append(n)
    return times, tokens


def method_line(
    method: str, times: list[float], tokens: list[int], rows: int, steps: int, width: int
) -> dict:
    med = statistics.median(times)
    return {
        "bench": "decode",
        "method": method,
        "rows": rows,
        "max_new_tokens": steps,
        "prompt_width": width,
        "s_median": round(med, 3),
        "s_all": [round(t, 3) for t in times],
        "tokens_per_s": round(statistics.median(tokens) / med, 1),
        "slots_per_s": round(rows * steps / med, 1),
    }


def bandwidth_figures(model: Any, device: str, rows: int, width: int, steps: int, lines: list[dict]) -> dict:
    """The decode's bytes, the measured and spec bandwidth, and each method's time against the limit."""
    import torch

    bw = measured_bandwidth(device)
    need = decode_bytes(model, rows, width, steps, torch.finfo(model.dtype).bits // 8)
    limit = need / bw
    return {
        "bandwidth_measured_gb_s": round(bw / 1e9, 1),
        "bandwidth_spec_gb_s": round((spec_bandwidth(device) or 0) / 1e9, 1) or None,
        "decode_bytes_gb": round(need / 1e9, 2),
        "bandwidth_limit_s": round(limit, 4),
        "times_the_limit": {x["method"]: round(x["s_median"] / limit, 2) for x in lines},
    }


def device_name(device: str) -> str:
    """The device a summary line names: the GPU's model, else the CPU's (``cpu`` when unknown)."""
    import torch

    return torch.cuda.get_device_name(device) if device.startswith("cuda") else platform.processor() or "cpu"


def summary_line(
    args: argparse.Namespace, spec: str, model: Any, workload_dir: str, lines: list[dict]
) -> dict:
    """The run's setting, and each method's tokens per second against ``generate``'s."""
    import torch

    summary: dict = {
        "bench": "decode_summary",
        "device": device_name(args.device),
        "dtype": args.dtype,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "model": Path(spec).name,
        "params": sum(p.numel() for p in model.parameters()),
        "workload": workload_dir,
    }
    base = next((x for x in lines if x["method"] == "transformers_generate"), None)
    if base:
        summary["tokens_per_s_vs_generate"] = {
            x["method"]: round(x["tokens_per_s"] / base["tokens_per_s"], 3) for x in lines if x is not base
        }
    return summary


def main() -> None:
    args = parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if args.workload:
        set_workload_dir(args.workload)
    import torch

    from rapo_echo.engines.hf import HFEngine, left_pad
    from rapo_echo.models import load_model, resolve
    from rapo_echo.types import SamplingParams

    w = workload()
    spec = args.model or str(resolve("default").path)
    model, tok = load_model(spec, dtype=args.dtype, device=args.device)
    model.eval()
    cuda = args.device.startswith("cuda")
    probe = HFEngine(model, tok, max_batch_size=10**6, decode_loop="dynamic")
    prompts = [probe.encode(p) for p in w.prompts()]
    rows, steps = len(prompts) * w.GROUP_SIZE, w.MAX_COMPLETION_TOKENS
    params = SamplingParams(max_new_tokens=steps, temperature=w.TEMPERATURE, n=w.GROUP_SIZE)
    width = max(len(p) for p in prompts)
    lines: list[dict] = []

    def emit(line: dict) -> None:
        lines.append(line)
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(line) + "\n")

    def report(method: str, fn: Callable[[], int]) -> None:
        line = method_line(method, *timed(fn, args.device, args.repeats), rows, steps, width)
        if cuda:
            line["peak_gpu_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        emit(line)

    torch.manual_seed(w.SEED)
    if not args.no_generate:
        ids, mask = left_pad([p for p in prompts for _ in range(w.GROUP_SIZE)], probe.pad_id, model.device)
        sampling = {"do_sample": True, "temperature": w.TEMPERATURE, "top_k": 0, "top_p": 1.0}

        def hf_generate() -> int:
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=steps,
                    pad_token_id=probe.pad_id,
                    **sampling,
                )
            return sum(first_eos_lengths(out[:, ids.shape[1] :], probe.eos_ids))

        report("transformers_generate", hf_generate)
    for loop in [x for x in args.loops.split(",") if x]:
        engine = HFEngine(
            model, tok, max_batch_size=10**6, decode_loop=loop, compile_backend=args.compile_backend
        )

        def ours(engine: HFEngine = engine) -> int:
            gens = engine.generate_ids(prompts, params)
            return sum(len(g.token_ids) for group in gens for g in group)

        report(f"rapo_echo_{engine.decode_mode}", ours)
    summary = summary_line(args, spec, model, str(Path(w.__file__).parent), lines)
    if cuda:
        summary.update(bandwidth_figures(model, args.device, rows, width, steps, lines))
    emit(summary)


if __name__ == "__main__":
    main()
