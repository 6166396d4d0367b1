#!/usr/bin/env python3
"""The empathy judge's accuracy before and after ``train-judge`` on Critique-Rewrite pairs, in domain (a
held-out split of the training pairs' own domain) and on a held-out domain (pairs made the same way from
other contexts), the figures Echo-N1 reports for its 32B judge (93.30 % in domain, 69.00 % out of domain).

Accuracy is train-judge's own measure (``rapo_echo.judges.training.accuracy``: the most likely verdict
label, each pair shown in both orders, an unreadable verdict wrong). One JSON object on stdout.

    rapo-echo data critique-rewrite --data ESConv.json --output cr-esconv ...
    rapo-echo data critique-rewrite --data bundled:scenarios_en.jsonl --output cr-ours ...
    python studies/echo_judge_domains.py --train cr-esconv/pairs.jsonl \\
        --held-out-domain cr-ours/pairs.jsonl --output judges/empathy-esconv [--max-steps 8 --no-reasoning]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--train", required=True, action="append", help="in-domain pairs (train + held-out split)"
    )
    ap.add_argument("--held-out-domain", required=True, action="append", help="pairs of another domain")
    ap.add_argument("--output", required=True, help="folder for the trained judge (empty or new)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--eval-fraction", type=float, default=0.25)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-steps", type=int)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--no-reasoning", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from rapo_echo.engines.hf import HFEngine
    from rapo_echo.judges.training import JudgeTrainingConfig, accuracy, train_judge
    from rapo_echo.judges.training_data import load_examples, pairs
    from rapo_echo.models import resolve

    t0 = time.perf_counter()
    cfg = JudgeTrainingConfig(
        data=args.train,
        output=args.output,
        model=args.model,
        eval_fraction=args.eval_fraction,
        task="empathy",
        epochs=args.epochs,
        max_steps=args.max_steps,
        batch_size=args.batch_size,
        micro_batch_size=2,
        lr=args.lr,
        reasoning=not args.no_reasoning,
        max_tokens=args.max_tokens,
        seed=args.seed,
        device="cpu",
    )
    report = train_judge(cfg)
    examples = load_examples(args.held_out_domain, "empathy")
    opts = {"reasoning": cfg.reasoning, "context_aware": True}
    rng = random.Random(args.seed + 7)
    items = [p for e in examples for p in pairs(e, rng=rng, **opts) if p.gold is not None]
    outside = {}
    for when, spec in (("before", resolve(args.model).path), ("after", args.output)):
        engine = HFEngine.from_spec(spec, device="cpu")
        outside[when] = accuracy(engine, items, reasoning=cfg.reasoning, max_new_tokens=cfg.eval_tokens)
        del engine
    out = {
        "model": args.model,
        "train_pairs": report["examples"],
        "in_domain": report["held_out_accuracy"],
        "held_out_domain": {
            "before": outside["before"],
            "after": outside["after"],
            "examples": len(examples),
        },
        "steps": report["steps"],
        "loss": report["loss"],
        "seconds": round(time.perf_counter() - t0, 1),
        "files": {
            "train": args.train,
            "held_out_domain": args.held_out_domain,
            "judge": str(Path(args.output)),
        },
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
