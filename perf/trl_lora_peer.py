#!/usr/bin/env python3
"""The TRL peer on the LoRA variant of the workload: ../shared/bench/trl_grpo_peer.py unchanged,
with TRL's GRPOTrainer given a LoRA adapter (r=16, alpha=32, all linear layers: the same adapter
rapo-echo trains with ``--lora``). Under LoRA TRL builds no reference copy (the KL is taken with the
adapter off), so the peer script's "reference model exists" assertion does not hold: run this with
``python -O`` (bench_grpo.py does), and the caller checks the step and completion counts itself.

Run it in the peer's own venv (TRL is never a rapo-echo dependency).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SHARED_BENCH = Path(
    os.environ.get("RAPO_SHARED_BENCH", Path(__file__).resolve().parents[2] / "shared" / "bench")
)
sys.path.insert(0, str(SHARED_BENCH))

import trl_grpo_peer as peer  # noqa: E402
from peft import LoraConfig  # noqa: E402

LORA = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


class LoraGRPOTrainer(peer.GRPOTrainer):
    """TRL's GRPOTrainer with the LoRA adapter passed in."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("peft_config", LORA)
        super().__init__(*args, **kwargs)


if __name__ == "__main__":
    peer.GRPOTrainer = LoraGRPOTrainer
    peer.main()
