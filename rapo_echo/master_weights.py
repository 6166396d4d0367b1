"""The optimizer, and what keeps 16-bit training learning: float32 master weights.

AdamW's step is about ``lr`` per weight. In bfloat16 (8 bits of mantissa) a weight of size ``w`` moves
only when the step exceeds half its spacing, ``|w| * 2**-9``: at the ``auto`` rate of a 7B model
(about 1.8e-6, :mod:`rapo_echo.auto_lr`) a weight of 0.02 would need a step 20 times larger, so a
pure-bf16 AdamW leaves nearly every weight where it was while the loss and metrics still move
(audit D6). Mixed-precision training keeps a float32 copy of each 16-bit weight, applies the updates
to the copy and rounds it back into the model after each step (Micikevicius et al. 2018, "Mixed
Precision Training"): the small steps add up in the copy and reach the 16-bit weight once they cross
its spacing. :class:`MasterWeightAdamW` does that outside DeepSpeed; DeepSpeed's bf16 / fp16 modes do
it themselves, and :func:`make_optimizer` refuses a DeepSpeed config that would train 16-bit weights
without them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from rapo_echo.errors import ConfigError

MASTER_KEY = "master_weights"  # the float32 copies in the optimizer's state_dict (restored on resume)


def is_low_precision(param: torch.Tensor) -> bool:
    return param.dtype in (torch.bfloat16, torch.float16)


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW whose parameters are float32 copies ("master weights") of the model's 16-bit trainable
    parameters. ``step`` takes the model's gradients (in float32), updates the copies and rounds them
    back into the model; the moments are float32 too. The copies are part of :meth:`state_dict`, so a
    resumed run continues from them, not from the rounded model. Memory: 4 bytes per parameter for the
    copy, and the moments in float32 (8 bytes) instead of 16 bits (4 bytes)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], **kwargs: Any) -> None:
        self.model_params = list(params)
        masters = [p.detach().float().clone() for p in self.model_params]
        super().__init__(masters, **kwargs)

    @property
    def masters(self) -> list[torch.Tensor]:
        return self.param_groups[0]["params"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for p, m in zip(self.model_params, self.masters):
            m.grad = None if p.grad is None else p.grad.float()
        loss = super().step(closure)
        for p, m in zip(self.model_params, self.masters):
            p.copy_(m)
            m.grad = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for p in self.model_params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state[MASTER_KEY] = [m.detach().clone() for m in self.masters]
        return state

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the moments and the master copies (a state without copies, e.g. from a plain
        AdamW, takes them from the model's current weights)."""
        state = dict(state_dict)
        saved = state.pop(MASTER_KEY, None)
        super().load_state_dict(state)
        for i, (p, m) in enumerate(zip(self.model_params, self.masters)):
            m.copy_(saved[i] if saved is not None else p.float())
            if saved is not None:
                p.copy_(m)


def make_optimizer(
    params: list[torch.nn.Parameter], train: Any, *, deepspeed_mixed_precision: bool | None = None
) -> torch.optim.Optimizer:
    """The run's AdamW over ``params`` with the ``train`` section's settings. 16-bit trainable parameters
    get float32 master weights (:class:`MasterWeightAdamW`) unless DeepSpeed keeps them
    (``deepspeed_mixed_precision``: None without DeepSpeed, else whether its config enables bf16 or
    fp16; a DeepSpeed config without either would train 16-bit weights bare, so it is refused)."""
    kwargs = {
        "lr": train.lr,
        "betas": (train.adam_beta1, train.adam_beta2),
        "eps": train.adam_eps,
        "weight_decay": train.weight_decay,
    }
    low = [p for p in params if is_low_precision(p)]
    if not low:
        return torch.optim.AdamW(params, **kwargs)
    if deepspeed_mixed_precision is None:
        return MasterWeightAdamW(params, **kwargs)
    if not deepspeed_mixed_precision:
        raise ConfigError(
            f"model.dtype: {low[0].dtype} trainable weights under a DeepSpeed config whose bf16 and fp16 are "
            "both off: DeepSpeed would update the 16-bit weights without float32 master weights, and small "
            'steps would round to nothing. Enable bf16 in the DeepSpeed JSON ("bf16": {"enabled": true}), '
            "or set model.dtype=float32"
        )
    return torch.optim.AdamW(params, **kwargs)
