#!/usr/bin/env python3
"""The cost of constrained decoding on the ``hf`` engine: the same batch and seed generated without an
answer format and under each format (choice, integer, json), side by side in one run. One JSON line per
method, then a summary line.

Each method gets one untimed warm-up call (which also builds the llguidance tokenizer and compiles the
format's grammar: reported once as ``setup_s``), then ``--repeats`` timed calls; medians are reported.
Answers under a format are shorter than free text (a label is one or two tokens), so beside tokens per
second the lines give the time per decode step (``ms_per_step``: one forward plus sampling for the whole
batch) and the part of it spent computing the grammar's token masks (``mask_ms_per_step``), which is
what constraining adds.

    python benchmarks/perf/bench_constrained.py                       # CPU, fp32, the embedded model
    python benchmarks/perf/bench_constrained.py --device cuda --loop compiled --prompts 16 --n 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# A judge's questions, our own; cycled to --prompts.
QUESTIONS = [
    "Someone wrote: 'My exam went badly and I feel like a failure.' A friend replied: 'Exams are not "
    "everything; what part felt worst?' How empathetic is the reply?",
    "Someone wrote: 'My cat died this morning.' Reply A: 'Cats are easy to replace.' Reply B: 'I am so "
    "sorry, you must miss her.' Which reply is kinder?",
    "Someone wrote: 'I cannot sleep before my interview.' A friend replied: 'Just relax.' How well does "
    "the reply take up what they said?",
    "Someone wrote: 'My brother stopped talking to me.' A friend replied: 'That must hurt. Do you know "
    "why?' Does the reply invite them to say more?",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "maxLength": 40},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["reason", "score"],
    "additionalProperties": False,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model folder (default: the embedded model's cached folder)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--loop", default="dynamic", help="decode loop: dynamic, static or compiled")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--formats", default="none,choice,integer,json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="also append the JSON lines to this file")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch

    from rapo_echo.engines.hf import HFEngine
    from rapo_echo.models import load_model, resolve
    from rapo_echo.structured import AnswerFormat
    from rapo_echo.types import SamplingParams, msg

    formats = {
        "none": None,
        "choice": AnswerFormat.choice(["A", "B", "tie"]),
        "integer": AnswerFormat.integer(1, 7),
        "json": AnswerFormat.json_schema(SCHEMA),
    }
    spec = args.model or str(resolve("default").path)
    model, tok = load_model(spec, dtype=args.dtype, device=args.device)
    model.eval()
    cuda = args.device.startswith("cuda")
    engine = HFEngine(model, tok, max_batch_size=10**6, decode_loop=args.loop)
    prompts = [
        engine.encode([msg("user", QUESTIONS[i % len(QUESTIONS)])]) for i in range(args.prompts)
    ]
    rows = args.prompts * args.n

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def emit(line: dict) -> None:
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(line) + "\n")

    lines: list[dict] = []
    for name in [x for x in args.formats.split(",") if x]:
        fmt = formats[name]
        params = SamplingParams(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            n=args.n,
            seed=args.seed,
            answer_format=fmt,
        )
        t0 = time.perf_counter()
        if fmt is not None:
            engine.grammar.template(fmt, model.get_output_embeddings().weight.shape[0])
        setup = time.perf_counter() - t0
        engine.generate_ids(prompts, params)  # warm-up
        times, tokens, steps, valid, mask_s, mask_steps = [], [], [], [], [], []
        for _ in range(args.repeats):
            before = (engine.grammar.mask_seconds, engine.grammar.mask_steps)
            sync()
            t0 = time.perf_counter()
            gens = engine.generate_ids(prompts, params)
            sync()
            times.append(time.perf_counter() - t0)
            flat = [g for group in gens for g in group]
            tokens.append(sum(len(g.token_ids) for g in flat))
            steps.append(max(len(g.token_ids) for g in flat))
            valid.append(sum(fmt.problem(g.text) is None for g in flat) if fmt else len(flat))
            mask_s.append(engine.grammar.mask_seconds - before[0])
            mask_steps.append(engine.grammar.mask_steps - before[1])
        i = sorted(range(len(times)), key=times.__getitem__)[len(times) // 2]  # the median run
        med = times[i]
        line = {
            "bench": "constrained",
            "format": name,
            "rows": rows,
            "max_new_tokens": args.max_new_tokens,
            "s_median": round(med, 3),
            "s_all": [round(t, 3) for t in times],
            "tokens": tokens[i],
            "tokens_per_s": round(tokens[i] / med, 1),
            "steps": steps[i],
            "ms_per_step": round(1e3 * med / steps[i], 2),
            "valid": f"{valid[i]}/{rows}",
        }
        if fmt is not None:
            line.update(
                setup_s=round(setup, 3),
                mask_ms_per_step=round(1e3 * mask_s[i] / max(1, mask_steps[i]), 3),
                mask_share=round(mask_s[i] / times[i], 3),
            )
        lines.append(line)
        emit(line)
    base = next((x for x in lines if x["format"] == "none"), None)
    summary: dict = {
        "bench": "constrained_summary",
        "device": torch.cuda.get_device_name(args.device) if cuda else platform.processor() or "cpu",
        "dtype": args.dtype,
        "loop": engine.decode_mode,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "llguidance_version": __import__("llguidance").__version__,
        "model": Path(spec).name,
        "seed": args.seed,
        "temperature": args.temperature,
    }
    if base:
        summary["ms_per_step_vs_none"] = {
            x["format"]: round(x["ms_per_step"] / base["ms_per_step"], 3) for x in lines if x is not base
        }
    emit(summary)


if __name__ == "__main__":
    main()
