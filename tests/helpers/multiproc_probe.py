"""``rapo-echo train`` under a multi-process launcher (torchrun, ``accelerate launch``) that records,
per rank and step, the samples the rank drew, and at the end the trainable weights the rank holds.
:func:`replaying` turns such records into the samples of a single-process run of the same global
batch. Used by tests/multiprocess/; ``PROBE_DIR`` names the folder the records go to, and
``PROBE_EXTRA_DECODE_RANK`` a rank that decodes more than the others (see :func:`install_recorder`).

    torchrun --nproc_per_node 2 tests/helpers/multiproc_probe.py train --model DIR --output RUN ...
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rapo_echo.algorithms.grpo import GRPO
from rapo_echo.distributed import gathered_one_at_a_time
from rapo_echo.training.run import Run
from rapo_echo.types import Sample, SamplingParams, Scenario

FIELDS = ("group", "prompt_ids", "completion_ids", "logprobs", "text", "finish_reason")


def record_file(folder: Path, step: int, rank: int) -> Path:
    return folder / f"step{step}_rank{rank}.json"


def weights_file(folder: Path, rank: int) -> Path:
    return folder / f"weights_rank{rank}.safetensors"


EXTRA_DECODE_STEPS = 5


def install_recorder(folder: Path, extra_decode_rank: int | None = None) -> None:
    """Patch GRPO so every rank writes its samples of each step, and the trainer so every rank writes
    its final trainable weights (gathered, under ZeRO-3). ``extra_decode_rank``: that rank decodes
    :data:`EXTRA_DECODE_STEPS` more tokens than the others in every rollout (one more reply before its
    group's), as a rank whose replies end later does -- unequal numbers of decode forwards across
    ranks, which must not matter (no collective may run while generating)."""
    rank = int(os.environ.get("RANK", "0"))
    rollout, sample_group, save_final = GRPO.rollout, GRPO.sample_group, Run._save_final

    def rollout_at(self: GRPO, scenarios: list[Scenario], step: int) -> Any:
        self.probe_step = step + 1
        return rollout(self, scenarios, step)

    def recorded(self: GRPO, scenarios: list[Scenario]) -> tuple[list[Sample], float]:
        if rank == extra_decode_rank:
            policy = self.ctx.policy
            params = SamplingParams(max_new_tokens=EXTRA_DECODE_STEPS, temperature=1.0, n=1)
            policy.generator.generate_ids([policy.prompt_ids(scenarios[0])], params)
        samples, seconds = sample_group(self, scenarios)
        rows = [{"scenario": s.scenario.id, **{f: getattr(s, f) for f in FIELDS}} for s in samples]
        record_file(folder, self.probe_step, rank).write_text(json.dumps(rows))
        return samples, seconds

    def final_with_weights(self: Run) -> None:
        from safetensors.torch import save_file

        save_final(self)
        trainable = ((n, p) for n, p in self.policy.lm.named_parameters() if p.requires_grad)
        weights = {n: t.detach().float().cpu().contiguous() for n, t in gathered_one_at_a_time(trainable)}
        save_file(weights, str(weights_file(folder, rank)))

    GRPO.rollout, GRPO.sample_group, Run._save_final = rollout_at, recorded, final_with_weights


def replaying(folder: Path, world: int) -> tuple[Callable, Callable]:
    """(rollout, sample_group) replacements for GRPO that return, at step ``s``, the samples all
    ``world`` ranks recorded at that step, in rank order, with group ids numbered across ranks. The
    scenarios asked for must be exactly the recorded ones (the same global batch)."""
    rollout = GRPO.rollout

    def rollout_at(self: GRPO, scenarios: list[Scenario], step: int) -> Any:
        self.probe_step = step + 1
        return rollout(self, scenarios, step)

    def replayed(self: GRPO, scenarios: list[Scenario]) -> tuple[list[Sample], float]:
        by_id = {s.id: s for s in scenarios}
        samples: list[Sample] = []
        offset = 0
        for rank in range(world):
            rows = json.loads(record_file(folder, self.probe_step, rank).read_text())
            for row in rows:
                samples.append(
                    Sample(
                        scenario=by_id[row["scenario"]],
                        **{f: row[f] for f in FIELDS if f != "group"},
                        group=row["group"] + offset,
                    )
                )
            offset += len({row["group"] for row in rows})
        assert [s.id for s in scenarios] == list(dict.fromkeys(s.scenario.id for s in samples))
        return samples, 0.0

    return rollout_at, replayed


def skip_deepspeed_shm_kernel() -> None:
    """Under a DeepSpeed launch on CPU, leave out DeepSpeed's optional shared-memory all-reduce kernel:
    its first use is a C++ build of a minute or more into ~/.cache/torch_extensions, and gloo carries
    the same collectives."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


if __name__ == "__main__":
    from rapo_echo.cli import main

    skip_deepspeed_shm_kernel()
    out = Path(os.environ["PROBE_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    extra = os.environ.get("PROBE_EXTRA_DECODE_RANK")
    install_recorder(out, int(extra) if extra else None)
    sys.exit(main(sys.argv[1:]))
