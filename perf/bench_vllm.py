#!/usr/bin/env python3
"""The ``vllm`` engine against the ``hf`` engine on the same rollout, and the weight sync: one JSON line per
measure, then a summary line. Runs in the vLLM tier's venv (``make test-vllm`` builds ``.venv-vllm``).

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python perf/bench_vllm.py          # CPU, fp32
    .venv-vllm/bin/python perf/bench_vllm.py --device cuda --dtype bfloat16 --model DIR

The rollout is the benchmark workload's (``bench_grpo.workload()``: 8 prompts x 4 samples, 48 new tokens,
its temperature). Each engine gets one untimed warm-up call, then ``--repeats`` timed calls; medians are
reported as generated tokens per second (both engines stop a reply at EOS, so their token counts differ a
little). ``load_s`` is the ``vllm.LLM`` start (weights, KV cache, warm-up); ``sync_s`` is one
:meth:`VLLMEngine.sync_from` of the ``hf`` model (every tensor streamed into vLLM's ``load_weights``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from rapo_echo.perf.bench_grpo import set_workload_dir, workload


def timed(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up
    runs = []
    out = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workload", help="a benchmark workload folder (default: ../shared/bench)")
    p.add_argument("--output", help="also write the lines to this JSONL file")
    args = p.parse_args()
    if args.workload:
        set_workload_dir(args.workload)
    import torch
    import vllm

    from rapo_echo.engines.hf import HFEngine
    from rapo_echo.engines.vllm_engine import VLLMEngine
    from rapo_echo.types import SamplingParams

    w = workload()
    params = SamplingParams(
        n=w.GROUP_SIZE, max_new_tokens=w.MAX_COMPLETION_TOKENS, temperature=w.TEMPERATURE, seed=w.SEED
    )
    hf = HFEngine.from_spec(args.model, dtype=args.dtype, device=args.device)
    prompts = [hf.encode(c) for c in w.prompts()]
    lines: list[dict] = []
    t0 = time.perf_counter()
    llm_args = {"enforce_eager": True} if args.device == "cpu" else {}
    vl = VLLMEngine(args.model, dtype=args.dtype, max_model_len=1024, **llm_args)
    load_s = time.perf_counter() - t0
    common = {"device": args.device, "dtype": args.dtype, "host": platform.node()}
    common.update(threads=torch.get_num_threads(), vllm=vllm.__version__)
    for name, engine in (("hf", hf), ("vllm", vl)):
        seconds, gens = timed(lambda e=engine: e.generate_ids(prompts, params), args.repeats)
        tokens = sum(len(g.token_ids) for group in gens for g in group)
        rate = {"tokens": tokens, "tokens_per_s": tokens / seconds, "rows": len(prompts) * params.n}
        lines.append({"measure": f"generate:{name}", "seconds": seconds, **rate, **common})
    sync_s, sent = timed(lambda: vl.sync_from(hf.model), args.repeats)
    lines.append({"measure": "sync", "seconds": sync_s, "tensors": sent, **common})
    lines.append({"measure": "load", "seconds": load_s, **common})
    rate = {x["measure"]: x.get("tokens_per_s") for x in lines}
    summary = {"summary": True, "vllm_over_hf": rate["generate:vllm"] / rate["generate:hf"], "load_s": load_s,
               "sync_s": sync_s, **common}  # fmt: skip
    lines.append(summary)
    text = "".join(json.dumps(x) + "\n" for x in lines)
    print(text, end="")
    if args.output:
        Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
