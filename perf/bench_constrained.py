#!/usr/bin/env python3
"""The cost of constrained decoding on the ``hf`` engine: the same batch and seed generated without an
answer format and under each format (choice, integer, json), side by side in one run. One JSON line per
method, then a summary line.

Each method gets one untimed warm-up call (the first format's also builds the llguidance tokenizer, and
each compiles its grammar: ``setup_s``), then ``--repeats`` timed calls, taken in turns across the
methods; the median call is reported. Answers under a format are shorter than free text (a label is one
or two tokens, then EOS), so a call under ``choice`` or ``integer`` is mostly the prompts' prefill; the
lines therefore also give the time per decode step after the prefill (``decode_ms_per_step``: the call
less a one-token call, per further step) and the time spent computing the grammar's token masks
(``mask_ms_per_step``, per step for the whole batch, and ``mask_share`` of the call), which is what
constraining adds.

    python perf/bench_constrained.py                       # CPU, fp32, the embedded model
    python perf/bench_constrained.py --device cuda --loop compiled --prompts 16 --n 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rapo_echo.perf.bench_decode import device_name

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
# The json format's properties: a closed object, both required, written in this order.
PROPERTIES = {
    "reason": {"type": "string", "maxLength": 40},
    "score": {"type": "integer", "minimum": 0, "maximum": 10},
}


def parse_args() -> argparse.Namespace:
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
    return ap.parse_args()


Run = tuple[float, int, int, int, float, int]  # seconds, tokens, steps, valid, mask seconds, mask steps


class Methods:
    """The batch generated without a format (``none``), under each format, and one token long
    (``prefill``), each timed with the grammar's mask time it spent."""

    def __init__(self, args: argparse.Namespace, engine: Any, prompts: list, formats: dict[str, Any]) -> None:
        self.args, self.engine, self.prompts, self.formats = args, engine, prompts, formats
        self.cuda = args.device.startswith("cuda")

    def params(self, name: str, max_new_tokens: int) -> Any:
        from rapo_echo.types import SamplingParams

        a = self.args
        fmt = self.formats[name]
        return SamplingParams(
            max_new_tokens=max_new_tokens, temperature=a.temperature, n=a.n, seed=a.seed, answer_format=fmt
        )

    def warm(self, names: list[str], width: int) -> dict[str, float]:
        """One untimed call per method; returns each format's set-up seconds (tokenizer, grammar)."""
        setup: dict[str, float] = {}
        for name in names:
            t0 = time.perf_counter()
            if self.formats[name] is not None:
                self.engine.grammar.template(
                    self.formats[name], width
                )  # the llguidance tokenizer, then the grammar
            setup[name] = time.perf_counter() - t0
            self.engine.generate_ids(self.prompts, self.params(name, self.args.max_new_tokens))
        return setup

    def time_one(self, name: str) -> Run:
        import torch

        fmt = self.formats.get(name)
        params = self.params("none", 1) if name == "prefill" else self.params(name, self.args.max_new_tokens)
        grammar = self.engine.grammar
        before = (grammar.mask_seconds, grammar.mask_steps)
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        gens = self.engine.generate_ids(self.prompts, params)
        if self.cuda:
            torch.cuda.synchronize()
        took = time.perf_counter() - t0
        flat = [g for group in gens for g in group]
        valid = sum(fmt.problem(g.text) is None for g in flat) if fmt else len(flat)
        tokens = sum(len(g.token_ids) for g in flat)
        steps = max(len(g.token_ids) for g in flat)
        return took, tokens, steps, valid, grammar.mask_seconds - before[0], grammar.mask_steps - before[1]

    def medians(self, names: list[str]) -> tuple[dict[str, Run], dict[str, list[Run]]]:
        """``--repeats`` calls of each, in turns across the methods (so that a busy spell of a shared
        machine hits them alike); the median call of each, and all calls."""
        runs: dict[str, list[Run]] = {name: [] for name in ["prefill", *names]}
        for _ in range(self.args.repeats):
            for name in runs:
                runs[name].append(self.time_one(name))
        return {name: sorted(r)[len(r) // 2] for name, r in runs.items()}, runs


def method_line(
    args: argparse.Namespace, name: str, run: Run, all_runs: list[Run], prefill: float, rows: int
) -> dict:
    took, tokens, steps, valid, _, _ = run
    return {
        "bench": "constrained",
        "format": name,
        "rows": rows,
        "max_new_tokens": args.max_new_tokens,
        "s_median": round(took, 3),
        "s_all": [round(r[0], 3) for r in all_runs],
        "tokens": tokens,
        "tokens_per_s": round(tokens / took, 1),
        "steps": steps,
        "decode_ms_per_step": round(1e3 * max(0.0, took - prefill) / max(1, steps - 1), 1),
        "valid": f"{valid}/{rows}",
    }


def main() -> None:
    args = parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch

    from rapo_echo.engines.hf import HFEngine
    from rapo_echo.models import load_model, resolve
    from rapo_echo.structured import AnswerFormat
    from rapo_echo.types import msg

    formats = {
        "none": None,
        "choice": AnswerFormat.choice(["A", "B", "tie"]),
        "integer": AnswerFormat.integer(1, 7),
        "json": AnswerFormat.json_object(PROPERTIES),
    }
    spec = args.model or str(resolve("default").path)
    model, tok = load_model(spec, dtype=args.dtype, device=args.device)
    model.eval()
    engine = HFEngine(model, tok, max_batch_size=10**6, decode_loop=args.loop)
    prompts = [engine.encode([msg("user", QUESTIONS[i % len(QUESTIONS)])]) for i in range(args.prompts)]
    rows = args.prompts * args.n

    def emit(line: dict) -> None:
        print(json.dumps(line), flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(line) + "\n")

    names = [x for x in args.formats.split(",") if x]
    methods = Methods(args, engine, prompts, formats)
    setup = methods.warm(names, model.get_output_embeddings().weight.shape[0])
    median, runs = methods.medians(names)
    prefill = median["prefill"][0]
    emit({"bench": "constrained", "format": "prefill (1 token)", "rows": rows, "s_median": round(prefill, 3)})
    lines: list[dict] = []
    for name in names:
        line = method_line(args, name, median[name], runs[name], prefill, rows)
        if formats[name] is not None:
            took, mask_s, mask_steps = median[name][0], median[name][4], median[name][5]
            line.update(
                setup_s=round(setup[name], 3),
                mask_ms_per_step=round(1e3 * mask_s / max(1, mask_steps), 3),
                mask_share=round(mask_s / took, 4),
            )
        lines.append(line)
        emit(line)
    base = next((x for x in lines if x["format"] == "none"), None)
    summary: dict = {
        "bench": "constrained_summary",
        "device": device_name(args.device),
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
        summary["tokens_per_s_vs_none"] = {
            x["format"]: round(x["tokens_per_s"] / base["tokens_per_s"], 3) for x in lines if x is not base
        }
    emit(summary)


if __name__ == "__main__":
    main()
