"""``rapo-echo train`` under torchrun with a fault injected: the loss of rank 0 is non-finite in step
``PROBE_NAN_STEP`` (1-based); exits non-zero when the process group is still alive after the run
returned, or when its gloo threads still run (a module held the group past ``destroy_process_group``:
see ``GROUP_CAPTURING_MODULES`` in rapo_echo/distributed.py). Used by the DDP test in
tests/integration/test_training_math.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rapo_echo.algorithms.grpo import GRPO
from rapo_echo.cli import main

_loss, _rollout = GRPO.loss, GRPO.rollout


def rollout(self, scenarios, step):
    self.probe_step = step + 1
    return _rollout(self, scenarios, step)


def loss(self, *args):
    value, metrics = _loss(self, *args)
    bad = os.environ.get("RANK") == "0" and self.probe_step == int(os.environ["PROBE_NAN_STEP"])
    return (value * float("nan") if bad else value), metrics


GRPO.rollout, GRPO.loss = rollout, loss


def gloo_threads() -> list[str]:
    """The names of this process's gloo threads (Linux: /proc/self/task; none elsewhere)."""
    names = []
    for task in Path("/proc/self/task").glob("*"):
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(n for n in names if "gloo" in n)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    import torch.distributed as dist

    if dist.is_initialized():  # its gloo threads would meet the interpreter's exit (a rank could abort)
        sys.exit("the process group is still alive after rapo-echo train returned")
    alive = gloo_threads()  # they would meet the interpreter's exit just the same
    if alive:
        sys.exit(f"gloo threads still run after the process group was destroyed: {alive}")
    sys.exit(code)
