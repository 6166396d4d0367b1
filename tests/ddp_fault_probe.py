"""``rapo-echo train`` under torchrun with a fault injected: the loss of rank 0 is non-finite in step
``PROBE_NAN_STEP`` (1-based); exits non-zero when the process group is still alive after the run
returned. Used by the DDP test in tests/test_training_math.py."""

from __future__ import annotations

import os
import sys

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

if __name__ == "__main__":
    code = main(sys.argv[1:])
    import torch.distributed as dist

    if dist.is_initialized():  # its gloo threads would meet the interpreter's exit (a rank could abort)
        sys.exit("the process group is still alive after rapo-echo train returned")
    sys.exit(code)
