"""PPO pieces of the core (algorithms/core.py) against values worked out by hand: GAE over action
tokens (user turns and padding skipped, dialogues of different lengths), the clipped value loss,
masked whitening, and the clipped policy loss with per-token advantages."""

from __future__ import annotations

import math

import pytest
import torch

from rapo_echo.algorithms.core import (
    clip_policy_loss,
    gae_advantages,
    gspo_policy_loss,
    masked_whiten,
    value_loss,
)


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_gae_gamma_lambda_one_is_return_minus_value():
    adv, ret = gae_advantages(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=1.0, lam=1.0)
    # A3 = 1 - .7 = .3; A2 = (.7 - .6) + .3 = .4; A1 = (.6 - .5) + .4 = .5; returns = A + V = 1
    assert adv[0].tolist() == pytest.approx([0.5, 0.4, 0.3])
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_gae_discounted_by_hand():
    adv, ret = gae_advantages(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=0.9, lam=0.5)
    # d3 = .3, A3 = .3; d2 = .9*.7 - .6 = .03, A2 = .03 + .45*.3 = .165;
    # d1 = .9*.6 - .5 = .04, A1 = .04 + .45*.165 = .11425
    assert adv[0].tolist() == pytest.approx([0.11425, 0.165, 0.3])
    assert ret[0].tolist() == pytest.approx([0.61425, 0.765, 1.0])


def test_gae_skips_user_tokens_and_padding_in_dialogues_of_different_lengths():
    rewards = t([0, 0.1, 0, 0, 0, 0.5], [0, 1, 0, 0, 0, 0])
    values = t([0.2, 0.3, 9, 9, 0.4, 0.6], [0.5, 0.5, 7, 7, 7, 7])  # 9 / 7: user tokens and padding
    mask = t([1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0])
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.5)
    # row 0, action tokens (v .2 .3 .4 .6, r 0 .1 0 .5): A4 = -.1; A3 = .2 + .5*-.1 = .15;
    # A2 = (.1 + .4 - .3) + .5*.15 = .275; A1 = (.3 - .2) + .5*.275 = .2375
    assert adv[0].tolist() == pytest.approx([0.2375, 0.275, 0, 0, 0.15, -0.1])
    assert ret[0].tolist() == pytest.approx([0.4375, 0.575, 0, 0, 0.55, 0.5])
    # row 1 (two action tokens, then padding): A2 = 1 - .5 = .5; A1 = (.5 - .5) + .5*.5 = .25
    assert adv[1].tolist() == pytest.approx([0.25, 0.5, 0, 0, 0, 0])
    assert ret[1].tolist() == pytest.approx([0.75, 1.0, 0, 0, 0, 0])
    # the same as GAE over the compacted action tokens
    compact, _ = gae_advantages(
        t([0, 0.1, 0, 0.5]), t([0.2, 0.3, 0.4, 0.6]), t([1, 1, 1, 1]), gamma=1, lam=0.5
    )
    assert compact[0].tolist() == pytest.approx(adv[0][mask[0] == 1].tolist())


def test_gae_input_checks():
    with pytest.raises(ValueError, match="rewards must sit on masked"):
        gae_advantages(t([0, 1]), t([0, 0]), t([1, 0]))
    with pytest.raises(ValueError, match="gamma and lam"):
        gae_advantages(t([0]), t([0]), t([1]), gamma=1.5)
    with pytest.raises(ValueError, match="has shape"):
        gae_advantages(t([0, 0]), t([0]), t([1, 1]))


def test_value_loss_clipped_by_hand():
    values = torch.tensor([[0.5, 0.9]], requires_grad=True)
    old, ret, mask = torch.tensor([[0.4, 0.4]]), torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 1.0]])
    loss, stats = value_loss(values, old, ret, mask, clip=0.2)
    # tok 1: (.5 - 1)^2 = .25 both ways -> .125; tok 2: plain (.9 - 1)^2 = .01, clipped (.4 + .2 - 1)^2 = .16
    assert loss[0].tolist() == pytest.approx([0.125, 0.08])
    assert float(stats["clip_frac"]) == pytest.approx(0.5)
    loss.sum().backward()
    assert values.grad[0].tolist() == pytest.approx([-0.5, 0.0])  # the clipped branch passes no gradient
    plain, _ = value_loss(values.detach(), old, ret, mask, clip=None)
    assert plain[0].tolist() == pytest.approx([0.125, 0.005])
    masked, _ = value_loss(values.detach(), old, ret, torch.tensor([[1.0, 0.0]]), clip=0.2)
    assert masked[0].tolist() == pytest.approx([0.125, 0.0])


def test_masked_whiten_by_hand():
    out = masked_whiten(t([1, 2, 3, 100]), t([1, 1, 1, 0]))
    s = math.sqrt(2 / 3)  # population std of 1, 2, 3
    assert out[0].tolist() == pytest.approx([-1 / s, 0, 1 / s, 0], rel=1e-6)


def test_clip_policy_loss_with_token_advantages():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.0, 1.5, 1.5]]))  # ratios 1, 1.5, 1.5
    adv = torch.tensor([[2.0, 1.0, -1.0]])
    loss, stats = clip_policy_loss(logp, old, adv, torch.ones(1, 3), eps_low=0.2, eps_high=0.2)
    # -min(r A, clamp(r) A): -2; -min(1.5, 1.2) = -1.2; -min(-1.5, -1.2) = 1.5
    assert loss[0].tolist() == pytest.approx([-2.0, -1.2, 1.5])
    assert float(stats["clip_frac"]) == pytest.approx(1 / 3)
    # per-token advantages at masked positions never leak
    masked, _ = clip_policy_loss(
        logp, old, torch.tensor([[2.0, float("nan"), 1.0]]), torch.tensor([[1.0, 0, 1]])
    )
    assert masked[0, 1] == 0 and torch.isfinite(masked).all()
    with pytest.raises(ValueError, match=r"shape \[B\]"):
        gspo_policy_loss(logp, old, adv, torch.ones(1, 3))
