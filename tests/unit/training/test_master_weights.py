"""Precision that learns (audit D6): 16-bit weights train through float32 master weights, so the small
steps of a 7B-sized learning rate add up instead of rounding away; a DeepSpeed config that would train
16-bit weights bare is refused; ``model.dtype: auto`` is bfloat16 on a GPU that has it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rapo_echo.auto_lr import auto_lr
from rapo_echo.errors import ConfigError
from rapo_echo.master_weights import MASTER_KEY, MasterWeightAdamW, make_optimizer

LR_7B = auto_lr(7_615_616_512, lora=False)  # Qwen2.5-7B's parameter count: 1.77e-6
TRAIN = SimpleNamespace(lr=LR_7B, adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-8, weight_decay=0.0)


def weights_and_gradient(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(4096, generator=g) * 0.02).bfloat16()  # the spread of initialised LM weights
    grad = torch.randn(4096, generator=g).bfloat16()
    return w, grad


def run_steps(optimizer: Any, param: torch.nn.Parameter, grad: torch.Tensor, n: int) -> None:
    for _ in range(n):
        param.grad = grad.clone().to(param.dtype)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_the_7b_rate_is_below_bf16_resolution() -> None:
    """Why D6 is silent: at 0.02 a bf16 weight's spacing is 2**-13 = 1.2e-4, 69x the 7B step."""
    assert pytest.approx(1.7727e-6, rel=1e-3) == LR_7B
    w = torch.tensor(0.02, dtype=torch.bfloat16)
    assert (w + LR_7B) == w and (w - LR_7B) == w


def test_pure_bf16_adamw_loses_the_steps_and_master_weights_keep_them() -> None:
    """64 AdamW steps at the 7B rate with a fixed gradient: the fp32 trajectory moves each weight by
    about 64 x 1.77e-6 = 1.1e-4; plain AdamW on bf16 weights moves almost none of them, while the
    master-weight optimizer's bf16 weights are exactly the fp32 trajectory rounded to bf16."""
    w0, grad = weights_and_gradient()
    fp32 = torch.nn.Parameter(w0.float())
    run_steps(torch.optim.AdamW([fp32], lr=LR_7B, weight_decay=0.0), fp32, grad, 64)
    bare = torch.nn.Parameter(w0.clone())
    run_steps(torch.optim.AdamW([bare], lr=LR_7B, weight_decay=0.0), bare, grad, 64)
    kept = torch.nn.Parameter(w0.clone())
    opt = make_optimizer([kept], TRAIN)
    assert isinstance(opt, MasterWeightAdamW)
    run_steps(opt, kept, grad, 64)

    should_move = fp32.detach().bfloat16() != w0
    assert should_move.float().mean() > 0.5  # the fp32 run moved most weights across a bf16 spacing
    assert (bare.detach() != w0)[should_move].float().mean() < 0.1  # bare bf16: the steps were lost
    assert kept.dtype == torch.bfloat16
    assert torch.equal(kept.detach(), fp32.detach().bfloat16())  # master weights: nothing lost
    assert torch.allclose(opt.masters[0], fp32.detach(), atol=0, rtol=0)


def test_master_weights_resume_from_the_saved_copies() -> None:
    """The optimizer's state_dict holds the float32 copies; loading it into a fresh optimizer over
    the (rounded) model restores them, so a resumed run goes on as the first one does. Rebuilt from the
    rounded bf16 weights instead, the copies would have lost the sub-bf16 progress."""
    w0, grad = weights_and_gradient(1)
    first = torch.nn.Parameter(w0.clone())
    opt = MasterWeightAdamW([first], lr=LR_7B, weight_decay=0.0)
    run_steps(opt, first, grad, 10)
    state = opt.state_dict()
    assert len(state[MASTER_KEY]) == 1 and state[MASTER_KEY][0].dtype == torch.float32
    resumed, rebuilt = (torch.nn.Parameter(first.detach().clone()) for _ in range(2))  # checkpoint weights
    opt2 = MasterWeightAdamW([resumed], lr=LR_7B, weight_decay=0.0)
    opt2.load_state_dict(state)
    opt3 = MasterWeightAdamW([rebuilt], lr=LR_7B, weight_decay=0.0)
    opt3.load_state_dict({k: v for k, v in state.items() if k != MASTER_KEY})
    assert torch.equal(opt2.masters[0], opt.masters[0])
    for o, p in ((opt, first), (opt2, resumed), (opt3, rebuilt)):
        run_steps(o, p, grad, 5)
    # equal up to float32 rounding (CPU kernels may round the last bit differently)
    assert torch.allclose(opt2.masters[0], opt.masters[0], rtol=0, atol=1e-9)
    assert float((opt3.masters[0] - opt.masters[0]).abs().max()) > 1e-6  # lost: about 10 x 1.8e-6


def test_float32_weights_keep_plain_adamw_and_deepspeed_keeps_its_own_masters() -> None:
    w = torch.nn.Parameter(torch.zeros(4))
    assert type(make_optimizer([w], TRAIN)) is torch.optim.AdamW
    bf = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    assert type(make_optimizer([bf], TRAIN, deepspeed_mixed_precision=True)) is torch.optim.AdamW
    with pytest.raises(ConfigError, match=r"model.dtype: torch.bfloat16 .*Enable bf16 in the DeepSpeed JSON"):
        make_optimizer([bf], TRAIN, deepspeed_mixed_precision=False)


def test_one_trainer_update_at_the_7b_rate_moves_the_weights(tmp_path: Path, tiny_folder: Path) -> None:
    """Full fine-tuning in bfloat16 through the trainer, one update at lr 1.77e-6: the weights the run
    carries on (what its optimizer updates) move by about the rate wherever the gradient is not tiny.
    Before float32 master weights the optimizer updated the bf16 weights themselves and almost none
    of them moved."""
    from rapo_echo.training.run import Run
    from rapo_echo.training.run_config import load_config

    cfg = load_config(
        overrides=[
            f"model.name={tiny_folder}",
            f"output={tmp_path / 'run'}",
            "model.dtype=bfloat16",
            f"train.lr={LR_7B}",
            "rollout.batch_size=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=8",
            "rewards=[{name: length, args: {target: 4}}, {name: question, weight: 0.5}]",
            "loss.beta=0",
            "logging.tensorboard=false",
            "logging.progress=false",
        ]
    )
    trainer = Run(cfg)
    assert trainer.policy.dtype == torch.bfloat16
    names = [n for n, p in trainer.policy.scorer.named_parameters() if p.requires_grad]
    updated = trainer.learner.optimizer.param_groups[0]["params"]
    assert len(names) == len(updated)
    layers = [i for i, n in enumerate(names) if ".layers." in n and n.endswith("proj.weight")]
    before = {i: updated[i].detach().float().clone() for i in layers}
    metrics = trainer.train_step()
    assert metrics["updates"] == 1.0 and metrics["grad_norm"] > 0
    moved = torch.cat([(updated[i].detach().float() - before[i]).abs().flatten() for i in layers])
    assert float((moved > 0.5 * LR_7B).float().mean()) > 0.5, "the update rounded away"
    assert float(moved.max()) < 10 * LR_7B
