"""Masked positions never leak (issue 31, item 18): NaN / inf in log-probs, advantages or per-token
values under the mask leave every KL estimator, policy loss and aggregation finite and equal to the
clean case, and the gradient finite and exactly 0 at the masked positions."""

from __future__ import annotations

import pytest
import torch

from rapo_echo.algorithms.core import AGGREGATIONS, aggregate, masked_whiten
from rapo_echo.algorithms.registries import KL_ESTIMATORS, POLICY_LOSSES

F64 = torch.float64
MASK = torch.tensor([[True, True, False, False], [True, False, True, False]])
LOGP = torch.tensor([[-0.5, -1.0, -0.7, -0.2], [-2.0, -0.3, -0.1, -1.5]], dtype=F64)
OTHER = torch.tensor([[-0.6, -0.8, -0.9, -0.4], [-1.5, -0.2, -0.3, -1.1]], dtype=F64)
POISONS = [float("nan"), float("inf"), -float("inf")]


def poisoned(x: torch.Tensor, value: float) -> torch.Tensor:
    return torch.where(MASK, x, torch.full_like(x, value))


def grad_of(fn, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = logp.clone().requires_grad_(True)
    out = fn(leaf)
    out.backward()
    return out.detach(), leaf.grad


def check(fn, clean_logp: torch.Tensor, dirty_logp: torch.Tensor) -> None:
    clean_value, clean_grad = grad_of(fn, clean_logp)
    value, grad = grad_of(fn, dirty_logp)
    assert torch.isfinite(value).all() and torch.equal(value, clean_value)
    assert torch.isfinite(grad).all(), grad
    assert torch.equal(grad[~MASK], torch.zeros_like(grad[~MASK]))
    assert torch.equal(grad, clean_grad)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
@pytest.mark.parametrize("poison", POISONS)
@pytest.mark.parametrize("name", KL_ESTIMATORS.names(builtin=True))
@pytest.mark.parametrize("where", ["logp", "ref_logp", "both"])
def test_kl_estimators_with_poison_under_the_mask(name, poison, mode, where):
    est = KL_ESTIMATORS.get(name, "test")
    ref_clean = OTHER
    ref = poisoned(OTHER, poison) if where in ("ref_logp", "both") else OTHER
    dirty = poisoned(LOGP, poison) if where in ("logp", "both") else LOGP
    check(lambda lp: aggregate(est(lp, ref, mask=MASK), MASK, mode), LOGP, dirty)
    # the per-token values are finite, equal to the clean ones under the mask and 0 outside it
    kl = est(dirty, ref, mask=MASK)
    assert torch.isfinite(kl).all()
    assert torch.equal(kl[MASK], est(LOGP, ref_clean)[MASK])
    assert torch.equal(kl[~MASK], torch.zeros_like(kl[~MASK]))


@pytest.mark.parametrize("name", KL_ESTIMATORS.names(builtin=True))
def test_kl_estimators_with_a_mask_keep_the_unmasked_values_bit_for_bit(name):
    est = KL_ESTIMATORS.get(name, "test")
    assert torch.equal(est(LOGP, OTHER, mask=MASK)[MASK], est(LOGP, OTHER)[MASK])
    assert torch.equal(est(LOGP, OTHER, mask=torch.ones_like(MASK)), est(LOGP, OTHER))


@pytest.mark.parametrize("poison", POISONS)
@pytest.mark.parametrize("name", POLICY_LOSSES.names(builtin=True))
@pytest.mark.parametrize("where", ["logp", "old_logp", "advantages"])
def test_policy_losses_with_poison_under_the_mask(name, poison, where):
    loss_fn = POLICY_LOSSES.get(name, "test")
    old = poisoned(OTHER, poison) if where == "old_logp" else OTHER
    dirty = poisoned(LOGP, poison) if where == "logp" else LOGP
    if name == "clip":  # per-token advantages (PPO with GAE) can hold padding too
        clean_adv = torch.tensor([[1.0, -0.5, 2.0, 0.3], [0.7, 0.1, -1.0, 0.4]], dtype=F64)
        adv = poisoned(clean_adv, poison) if where == "advantages" else clean_adv
    else:  # one advantage per sequence: nothing is masked
        clean_adv = adv = torch.tensor([1.0, -0.5], dtype=F64)
    for mode in sorted(AGGREGATIONS):
        check(lambda lp, mode=mode: aggregate(loss_fn(lp, old, adv, MASK)[0], MASK, mode), LOGP, dirty)
    _, stats = loss_fn(dirty, old, adv, MASK)
    _, clean_stats = loss_fn(LOGP, OTHER, clean_adv, MASK)
    for key, value in stats.items():
        assert torch.isfinite(value), key
        assert torch.equal(value, clean_stats[key]), key


@pytest.mark.parametrize("poison", POISONS)
@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_aggregations_with_poison_under_the_mask(poison, mode):
    check(lambda x: aggregate(x * 2.0, MASK, mode), LOGP, poisoned(LOGP, poison))


@pytest.mark.parametrize("poison", POISONS)
def test_masked_whiten_with_poison_under_the_mask(poison):
    check(lambda x: (masked_whiten(x, MASK) * torch.arange(8, dtype=F64).view(2, 4)).sum(), LOGP,
          poisoned(LOGP, poison))
