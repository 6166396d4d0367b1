"""The learning-rate schedule against ``transformers.get_scheduler``: the same multipliers after the warm-up
(constant, linear, cosine), and one chosen difference inside it. Ours keeps warm-up step s at (s + 1) /
warmup, so the first update already learns; transformers' starts at 0 / warmup, an update with learning rate
0, which in RL would spend a whole rollout (generation, simulation, judging) on nothing. Hence ours stays."""

from __future__ import annotations

import pytest
import torch

from rapo_echo.training.learner import lr_lambda

HF_NAMES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def transformers_multipliers(kind: str, warmup: int, total: int) -> list[float]:
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_scheduler(HF_NAMES[kind], opt, num_warmup_steps=warmup, num_training_steps=total)
    return [sched.lr_lambdas[0](s) for s in range(total + 1)]


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
@pytest.mark.parametrize(("warmup", "total"), [(0, 10), (3, 10), (4, 7)])
def test_same_as_transformers_after_the_warmup(kind: str, warmup: int, total: int) -> None:
    ours = [lr_lambda(kind, warmup, total)(s) for s in range(total + 1)]
    theirs = transformers_multipliers(kind, warmup, total)
    assert ours[warmup:] == pytest.approx(theirs[warmup:], abs=1e-12)
    # inside the warm-up: ours one step ahead (no update with learning rate 0)
    assert ours[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    assert theirs[:warmup] == pytest.approx([s / warmup for s in range(warmup)])
