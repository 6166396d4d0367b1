"""A third-party advantage estimator, written against the public registry only (the tests install it by
entry point, as a package would, and by ``module:function`` path): each valid sample's reward minus its
group's mean, divided by the group's range (max - min) plus ``eps``."""

from __future__ import annotations

import torch
from torch import Tensor

from rapo_echo.algorithms.registries import advantage_estimator


@advantage_estimator
def minmax_advantages(rewards: Tensor, groups: Tensor, valid: Tensor, *, eps: float = 1e-4) -> Tensor:
    """``(r - mean_g) / (max_g - min_g + eps)`` over the valid samples of each group; 0 for an invalid
    sample and for a group with fewer than 2 valid samples or no spread."""
    out = torch.zeros(rewards.shape, dtype=torch.float64)
    for g in groups.unique():
        members = (groups == g) & valid
        r = rewards[members].to(torch.float64)
        if len(r) < 2 or r.max() == r.min():
            continue
        out[members] = (r - r.mean()) / (r.max() - r.min() + eps)
    return out.to(rewards.dtype if rewards.dtype.is_floating_point else torch.get_default_dtype())


def undeclared_advantages(rewards: Tensor, groups: Tensor, valid: Tensor, *, eps: float = 1e-4) -> Tensor:
    """The same shape of function without the declaration: a config that names it is refused."""
    return torch.zeros_like(rewards)
