"""The GRPO core (algorithms/core.py) against values worked out by hand in the comments."""

from __future__ import annotations

import math
import typing

import pytest
import torch

from rapo_echo.algorithms import core
from rapo_echo.algorithms.core import (
    AGGREGATIONS,
    aggregate,
    clip_policy_loss,
    count_tokens_and_seqs,
    dr_grpo_advantages,
    grpo_advantages,
    gspo_policy_loss,
    kl_k1,
    kl_k2,
    kl_k3,
    masked_mean,
    rloo_advantages,
)
from rapo_echo.algorithms.registries import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregation_of,
    policy_loss,
)
from rapo_echo.errors import ConfigError

F64 = torch.float64


def t(values, dtype=F64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def close(actual: torch.Tensor, expected, atol: float = 1e-9) -> None:
    exp = expected if isinstance(expected, torch.Tensor) else torch.tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, exp.to(actual.dtype), atol=atol, rtol=0)


# ---------------------------------------------------------------------------- advantages
# Example A: two contiguous groups, all valid.
#   group 0 = [1, 2, 3, 4]: mean 2.5, deviations -1.5 -0.5 0.5 1.5, sum of squares 2.25+0.25+0.25+2.25 = 5,
#   Bessel variance 5/3, std sqrt(5/3) = 1.2909944487358056.
#   group 1 = [5, 5, 5, 5]: all equal -> 0 for every estimator.
REWARDS_A = [1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0]
GROUPS_A = [0, 0, 0, 0, 1, 1, 1, 1]

# Example B: non-contiguous ids, invalid samples (one with a NaN reward), a singleton group.
#   index:   0    1    2    3    4    5    6    7
#   reward:  3    10   1    nan  7    2    4    1
#   group:   5    2    5    2    9    5    2    2
#   valid:   T    T    T    F    T    F    T    T
#   group 5 -> valid rewards {3, 1} (index 5 is invalid, its 2 is ignored): mean 2, dev +1 -1,
#              Bessel var (1+1)/1 = 2, std sqrt(2).
#   group 2 -> valid rewards {10, 4, 1} (index 3 invalid): mean 5, dev +5 -1 -4,
#              sum sq 25+1+16 = 42, var 42/2 = 21, std sqrt(21).
#   group 9 -> a single valid sample -> 0.   invalid samples (3, 5) -> 0.
REWARDS_B = [3.0, 10.0, 1.0, float("nan"), 7.0, 2.0, 4.0, 1.0]
GROUPS_B = [5, 2, 5, 2, 9, 5, 2, 2]
VALID_B = [True, True, True, False, True, False, True, True]


def example_a():
    return t(REWARDS_A, torch.float32), torch.tensor(GROUPS_A), torch.ones(8, dtype=torch.bool)


def example_b():
    return t(REWARDS_B, torch.float32), torch.tensor(GROUPS_B), torch.tensor(VALID_B)


def test_grpo_advantages_two_groups():
    # -1.5 / (sqrt(5/3) + 1e-4) = -1.5 / 1.2910944487 = -1.161805010833055, and so on; group 1 -> 0.
    adv = grpo_advantages(*example_a())
    assert adv.dtype == torch.float32
    s = 1.2909944487358056 + 1e-4
    close(adv, [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s, 0, 0, 0, 0], atol=1e-6)
    close(adv[:4], [-1.161805010833055, -0.3872683369443517, 0.3872683369443517, 1.161805010833055], 1e-6)


def test_grpo_advantages_invalid_singleton_noncontiguous():
    # group 5: +-1 / sqrt(2) (eps=0); group 2: 5, -1, -4 over sqrt(21) = 4.58257569495584.
    adv = grpo_advantages(*example_b(), eps=0.0)
    r2, r21 = math.sqrt(2), math.sqrt(21)
    close(adv, [1 / r2, 5 / r21, -1 / r2, 0, 0, 0, -1 / r21, -4 / r21], atol=1e-6)
    assert torch.isfinite(adv).all()
    # default eps = 1e-4: 1 / (sqrt(2) + 1e-4) = 0.7070567847218314, 5 / (sqrt(21) + 1e-4) = 1.0910656421757
    adv = grpo_advantages(*example_b())
    close(adv[[0, 1]], [0.7070567847218314, 1.0910656421757075], atol=1e-6)


def test_dr_grpo_advantages():
    # example A: r - mean = -1.5 -0.5 0.5 1.5; the all-5 group -> 0.
    close(dr_grpo_advantages(*example_a()), [-1.5, -0.5, 0.5, 1.5, 0, 0, 0, 0])
    # example B: group 5 -> 3-2 = 1, 1-2 = -1; group 2 -> 10-5 = 5, 4-5 = -1, 1-5 = -4; others 0.
    close(dr_grpo_advantages(*example_b()), [1, 5, -1, 0, 0, 0, -1, -4])


def test_rloo_advantages():
    # example A: 1 - mean(2,3,4) = -2; 2 - mean(1,3,4) = 2 - 8/3 = -2/3; 3 - 7/3 = 2/3; 4 - 2 = 2.
    close(rloo_advantages(*example_a()), [-2, -2 / 3, 2 / 3, 2, 0, 0, 0, 0], atol=1e-6)
    # example B: group 5 -> 3 - 1 = 2, 1 - 3 = -2; group 2 -> 10 - (4+1)/2 = 7.5, 4 - (10+1)/2 = -1.5,
    # 1 - (10+4)/2 = -6; the singleton and the invalid samples -> 0.
    close(rloo_advantages(*example_b()), [2, 7.5, -2, 0, 0, 0, -1.5, -6])


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names(builtin=True))
def test_advantages_equal_rewards_are_exactly_zero(name):
    # 0.1 has no exact binary form: in float64 (0.1+0.1+0.1)/3 - 0.1 = 1.4e-17, not 0. The result must
    # still be exactly 0 (no signal; with eps = 0 grpo would otherwise give +-1), also with the invalid
    # NaN sample in the group.
    rewards = t([0.1, 0.1, 0.1, float("nan")])
    valid = torch.tensor([True, True, True, False])
    adv = ADVANTAGE_ESTIMATORS.get(name, "test")(rewards, torch.tensor([3, 3, 3, 3]), valid, eps=0.0)
    assert torch.equal(adv, torch.zeros(4, dtype=F64))


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names(builtin=True))
def test_advantages_group_order_does_not_matter(name):
    # permuting the samples permutes the advantages (groups need not be contiguous)
    rewards, groups, valid = example_b()
    perm = torch.tensor([7, 2, 4, 0, 6, 1, 5, 3])
    fn = ADVANTAGE_ESTIMATORS.get(name, "test")
    close(fn(rewards[perm], groups[perm], valid[perm]), fn(rewards, groups, valid)[perm], atol=1e-6)


def test_advantages_bad_input():
    rewards, groups, valid = example_b()
    with pytest.raises(ValueError, match=r"rewards\[3\] is nan but valid\[3\] is True"):
        grpo_advantages(rewards, groups, torch.ones(8, dtype=torch.bool))
    with pytest.raises(ValueError, match="same length"):
        rloo_advantages(rewards, groups[:5], valid)
    with pytest.raises(ValueError, match="groups must be an integer tensor"):
        dr_grpo_advantages(rewards, groups.float(), valid)
    with pytest.raises(ValueError, match="valid must be a bool tensor"):
        grpo_advantages(rewards, groups, valid.long())
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(rewards.view(2, 4), groups.view(2, 4), valid.view(2, 4))
    with pytest.raises(ValueError, match="eps must be >= 0"):
        grpo_advantages(rewards, groups, valid, eps=-1.0)


def test_advantages_empty_batch():
    out = grpo_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.bool))
    assert out.shape == (0,)


# ---------------------------------------------------------------------------- clip policy loss
# Row 0 (A = +1), ratios 1.1, 1.25, 1.5, 0.5; row 1 (A = -2), ratios 0.7, 0.9, 1.5, then a padded token.
# eps_low = 0.2, eps_high = 0.28 (clip-higher): clip range [0.8, 1.28].
#   row 0: 1.1  -> min(1.1, 1.1)     = 1.1   -> loss -1.1,  unclipped, d/dlogp = -A*r = -1.1
#          1.25 -> inside range       = 1.25  -> loss -1.25, unclipped, grad -1.25
#          1.5  -> min(1.5, 1.28)     = 1.28  -> loss -1.28, CLIPPED,  grad 0
#          0.5  -> min(0.5, 0.8)      = 0.5   -> loss -0.5,  unclipped, grad -0.5
#   row 1: 0.7  -> min(-1.4, -1.6)    = -1.6  -> loss 1.6,   CLIPPED,  grad 0
#          0.9  -> min(-1.8, -1.8)    = -1.8  -> loss 1.8,   unclipped, grad -A*r = 1.8
#          1.5  -> min(-3.0, -2.56)   = -3.0  -> loss 3.0,   unclipped, grad 3.0
#          pad  -> 0, grad 0 (logp -inf, old_logp nan there must not leak)
# clip_frac = 2 clipped / 7 masked tokens; ratio_mean = (1.1+1.25+1.5+0.5+0.7+0.9+1.5)/7 = 7.45/7.
RATIOS = [[1.1, 1.25, 1.5, 0.5], [0.7, 0.9, 1.5, 1.0]]
CLIP_MASK = [[1, 1, 1, 1], [1, 1, 1, 0]]


def clip_inputs():
    old = t([[-1.0, -2.0, -0.5, -3.0], [-1.5, -0.7, -2.2, 0.0]])
    logp = old + torch.log(t(RATIOS))
    logp[1, 3] = -float("inf")
    old[1, 3] = float("nan")
    return logp.requires_grad_(True), old, t([1.0, -2.0]), torch.tensor(CLIP_MASK, dtype=torch.bool)


def test_clip_policy_loss_values_and_stats():
    logp, old, adv, mask = clip_inputs()
    loss, stats = clip_policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    close(loss, [[-1.1, -1.25, -1.28, -0.5], [1.6, 1.8, 3.0, 0.0]])
    close(stats["clip_frac"], 2 / 7)
    close(stats["ratio_mean"], 7.45 / 7)
    assert stats["clip_frac"].dim() == 0 and not stats["ratio_mean"].requires_grad


def test_clip_policy_loss_gradient_is_zero_where_clipped():
    logp, old, adv, mask = clip_inputs()
    loss, _ = clip_policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    loss.sum().backward()
    # d(-r*A)/dlogp = -A*r where unclipped; 0 where clipped and at the padded token
    close(logp.grad, [[-1.1, -1.25, 0.0, -0.5], [0.0, 1.8, 3.0, 0.0]])


def test_clip_policy_loss_symmetric_clips_what_clip_higher_keeps():
    # eps_high = 0.2: range [0.8, 1.2]; ratio 1.25 with A = +1 is now clipped: loss -1.2, grad 0;
    # clip_frac = 3/7.
    logp, old, adv, mask = clip_inputs()
    loss, stats = clip_policy_loss(logp, old, adv, mask)
    close(loss[0], [-1.1, -1.2, -1.2, -0.5])
    close(stats["clip_frac"], 3 / 7)
    loss.sum().backward()
    close(logp.grad[0], [-1.1, 0.0, 0.0, -0.5])


def test_clip_policy_loss_empty_mask_and_bad_shapes():
    logp, old, adv, _ = clip_inputs()
    loss, stats = clip_policy_loss(logp, old, adv, torch.zeros(2, 4, dtype=torch.bool))
    assert torch.equal(loss, torch.zeros(2, 4, dtype=F64))
    assert stats["clip_frac"].item() == 0 and stats["ratio_mean"].item() == 0
    with pytest.raises(ValueError, match=r"advantages must have shape \[B\] = \(2,\)"):
        clip_policy_loss(logp, old, adv[:1], torch.ones(2, 4))
    with pytest.raises(ValueError, match="mask has shape"):
        clip_policy_loss(logp, old, adv, torch.ones(2, 3))
    with pytest.raises(ValueError, match="eps_low and eps_high must be >= 0"):
        clip_policy_loss(logp, old, adv, torch.ones(2, 4), eps_low=-0.1)


# ---------------------------------------------------------------------------- GSPO
# Row 0 (A = +2): token log-ratios 0.1, -0.2, 0.4 -> mean 0.3/3 = 0.1 -> s0 = e^0.1 = 1.1051709180756477.
# Row 1 (A = -1): log-ratios -0.3, -0.1, then padding -> mean -0.4/2 = -0.2
#                 -> s1 = e^-0.2 = 0.8187307530779818.
# Every token of a row carries the value s_i. Token-level ratio_mean = (3*s0 + 2*s1)/5 = 0.9905948520765813.
S0, S1 = 1.1051709180756477, 0.8187307530779818


def gspo_inputs():
    old = t([[-1.0, -2.0, -0.5], [-0.4, -1.2, 0.0]])
    logp = old + t([[0.1, -0.2, 0.4], [-0.3, -0.1, 0.0]])
    logp[1, 2] = -float("inf")
    return logp.requires_grad_(True), old, t([2.0, -1.0]), t([[1, 1, 1], [1, 1, 0]])


def test_gspo_sequence_ratio_and_gradient_reaches_every_token():
    # eps 0.2/0.2: s0 = 1.105 and s1 = 0.819 are both inside [0.8, 1.2]:
    #   row 0 loss per token = -A*s0 = -2.2103418361512954, row 1 = -A*s1 = 0.8187307530779818.
    # d loss_it / d logp_t = -A_i * s_i for every masked token (the same for all tokens of a row,
    # unlike the token-level ratio): row 0 -> -2.2103418, row 1 -> +0.8187308, padding -> 0.
    logp, old, adv, mask = gspo_inputs()
    loss, stats = gspo_policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    close(loss, [[-2 * S0] * 3, [S1, S1, 0.0]])
    close(stats["clip_frac"], 0.0)
    close(stats["ratio_mean"], 0.9905948520765813)
    loss.sum().backward()
    close(logp.grad, [[-2 * S0] * 3, [S1, S1, 0.0]])
    assert (logp.grad[mask.bool()] != 0).all()


def test_gspo_clips_whole_sequences():
    # eps_low = 0.2, eps_high = 0.05: range [0.8, 1.05].
    #   row 0: A > 0 and s0 = 1.105 > 1.05 -> clipped: loss -2 * 1.05 = -2.1 on every token, grad 0.
    #   row 1: s1 = 0.8187 >= 0.8 -> unclipped: loss 0.8187 per token, grad 0.8187.
    # clip_frac is per sequence: 1 of 2 = 0.5 (per token it would be 3/5).
    logp, old, adv, mask = gspo_inputs()
    loss, stats = gspo_policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.05)
    close(loss, [[-2.1] * 3, [S1, S1, 0.0]])
    close(stats["clip_frac"], 0.5)
    loss.sum().backward()
    close(logp.grad, [[0.0] * 3, [S1, S1, 0.0]])


def test_gspo_default_eps_clip_both_rows():
    # defaults eps_low = 3e-4, eps_high = 4e-4: range [0.9997, 1.0004].
    #   row 0: A > 0, s0 > 1.0004 -> loss -2 * 1.0004 = -2.0008; row 1: A < 0, s1 < 0.9997 -> loss 0.9997.
    logp, old, adv, mask = gspo_inputs()
    loss, stats = gspo_policy_loss(logp, old, adv, mask)
    close(loss, [[-2.0008] * 3, [0.9997, 0.9997, 0.0]])
    close(stats["clip_frac"], 1.0)


# ---------------------------------------------------------------------------- KL estimators
# logp = [-1, -2, -0.5], ref = [-1.5, -1, -0.5]: d = logp - ref = [0.5, -1, 0], x = ref - logp = [-0.5, 1, 0]
#   k1 = d = [0.5, -1, 0]
#   k2 = 0.5 d^2 = [0.125, 0.5, 0]
#   k3 = e^x - x - 1 = [e^-0.5 + 0.5 - 1, e - 1 - 1, 0] = [0.10653065971263342, 0.7182818284590451, 0]
KL_LOGP, KL_REF = [-1.0, -2.0, -0.5], [-1.5, -1.0, -0.5]


def test_kl_estimators_hand_values():
    close(kl_k1(t(KL_LOGP), t(KL_REF)), [0.5, -1.0, 0.0])
    close(kl_k2(t(KL_LOGP), t(KL_REF)), [0.125, 0.5, 0.0])
    close(kl_k3(t(KL_LOGP), t(KL_REF)), [0.10653065971263342, 0.7182818284590451, 0.0])


def test_kl_estimators_expectation_equals_exact_kl():
    # p = [0.5, 0.5], q = [0.25, 0.75]: KL(p||q) = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.14384103622589042.
    # k1 and k3 are unbiased: sum_x p(x) k(x) equals it exactly (for k3: sum q - sum p ln(q/p) - 1 = KL).
    lp, lq = torch.log(t([0.5, 0.5])), torch.log(t([0.25, 0.75]))
    p = lp.exp()
    for fn in (kl_k1, kl_k3):
        close((p * fn(lp, lq)).sum(), 0.14384103622589042)


@pytest.mark.parametrize("name", KL_ESTIMATORS.names(builtin=True))
def test_kl_zero_when_equal(name):
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0), dtype=F64)
    assert torch.equal(KL_ESTIMATORS.get(name, "test")(x, x.clone()), torch.zeros(3, 5, dtype=F64))


def test_kl_k3_nonnegative_and_finite_on_extremes():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(64, 32, generator=g) * 5, torch.randn(64, 32, generator=g) * 5
    assert (kl_k3(a, b) >= 0).all()
    # ref - logp = 1e4 would overflow exp; it is clamped to 20, so value and gradient stay finite
    logp = t([[-1e4, 0.0]], torch.float32).requires_grad_(True)
    k = kl_k3(logp, t([[0.0, -1e4]], torch.float32))
    assert torch.isfinite(k).all()
    k.sum().backward()
    assert torch.isfinite(logp.grad).all()


# ---------------------------------------------------------------------------- aggregation
# x = [[1, 2, 3, nan], [5, 6, 7, 8], [inf, 10, 11, 12]], mask = [[1,1,0,0], [1,1,1,1], [0,0,0,0]]
# (nan/inf sit on masked positions and must not leak)
#   masked sum = 1+2 + 5+6+7+8 = 29, tokens = 6, rows with tokens = 2
#   token-mean              = 29/6 = 4.833333...
#   seq-mean-token-mean     = ((1+2)/2 + (5+6+7+8)/4 + 0) / 2 = (1.5 + 6.5)/2 = 4.0
#   seq-mean-token-sum-norm = 29 / (2 * T=4) = 3.625; with norm_constant 10: 29/20 = 1.45
AGG_X = [[1.0, 2.0, 3.0, float("nan")], [5.0, 6.0, 7.0, 8.0], [float("inf"), 10.0, 11.0, 12.0]]
AGG_MASK = [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]


@pytest.mark.parametrize(
    "mode, kwargs, expected",
    [
        ("token-mean", {}, 29 / 6),
        ("token-mean", {"total_tokens": 10}, 2.9),
        ("seq-mean-token-mean", {}, 4.0),
        ("seq-mean-token-mean", {"total_seqs": 4}, 2.0),
        ("seq-mean-token-sum-norm", {}, 3.625),
        ("seq-mean-token-sum-norm", {"norm_constant": 10}, 1.45),
    ],
)
def test_aggregate_hand_values(mode, kwargs, expected):
    for mask in (torch.tensor(AGG_MASK, dtype=torch.bool), t(AGG_MASK)):
        close(aggregate(t(AGG_X), mask, mode, **kwargs), expected)


def test_count_tokens_and_seqs_and_masked_mean():
    assert count_tokens_and_seqs(torch.tensor(AGG_MASK)) == (6.0, 2.0)
    close(masked_mean(t(AGG_X), t(AGG_MASK)), 29 / 6)
    assert masked_mean(t(AGG_X), torch.zeros(3, 4)).item() == 0.0


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_aggregate_empty_mask_is_zero_with_a_gradient(mode):
    x = t(AGG_X).requires_grad_(True)
    out = aggregate(x, torch.zeros(3, 4, dtype=torch.bool), mode, total_tokens=0, total_seqs=0)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(x.grad, torch.zeros(3, 4, dtype=F64))


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_aggregate_is_exact_under_micro_batching(mode):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 7, generator=g, dtype=F64)
    lengths = torch.tensor([7, 3, 0, 5, 1, 6])  # row 2 has no completion tokens
    mask = torch.arange(7) < lengths.unsqueeze(1)
    tokens, seqs = count_tokens_and_seqs(mask)
    assert (tokens, seqs) == (22.0, 5.0)
    totals = {"total_tokens": tokens, "total_seqs": seqs, "norm_constant": 7}

    whole_x = x.clone().requires_grad_(True)
    whole = aggregate(whole_x, mask, mode, **totals)
    whole.backward()

    # two micro-batches, the second re-padded to its own longest row (6 columns)
    parts_x = x.clone().requires_grad_(True)
    first = aggregate(parts_x[:2], mask[:2], mode, **totals)
    second = aggregate(parts_x[2:, :6], mask[2:, :6], mode, **totals)
    (first + second).backward()

    close(first + second, whole.detach(), atol=1e-12)
    close(parts_x.grad, whole_x.grad, atol=1e-12)
    # without the mini-batch totals the micro-batch sum is not the whole-batch value
    local = aggregate(x[:2], mask[:2], mode) + aggregate(x[2:, :6], mask[2:, :6], mode)
    assert abs(local.item() - whole.item()) > 1e-3


def test_aggregate_bad_input():
    with pytest.raises(KeyError, match="unknown aggregation mode 'mean'; allowed: seq-mean-token-mean"):
        aggregate(t(AGG_X), t(AGG_MASK), "mean")
    with pytest.raises(ValueError, match="total_tokens must be > 0"):
        aggregate(t(AGG_X), t(AGG_MASK), "token-mean", total_tokens=0)
    with pytest.raises(ValueError, match="mask has shape"):
        aggregate(t(AGG_X), torch.ones(3, 3), "token-mean")


# ---------------------------------------------------------------------------- registries


def test_registries_and_unknown_names():
    """The built-ins are rapo-echo's own entry points, each the function of core.py it names."""
    builtins = {
        ADVANTAGE_ESTIMATORS: {
            "grpo": grpo_advantages, "dr_grpo": dr_grpo_advantages, "rloo": rloo_advantages
        },
        POLICY_LOSSES: {"clip": clip_policy_loss, "gspo": gspo_policy_loss},
        KL_ESTIMATORS: {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3},
    }
    for registry, functions in builtins.items():
        assert registry.names(builtin=True) == sorted(functions)
        assert all(registry.get(name, "test") is fn for name, fn in functions.items())
    assert set(AGGREGATIONS) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    assert core.get(AGGREGATIONS, "token-mean", "aggregation mode") is core.agg_token_mean
    with pytest.raises(ConfigError) as info:
        ADVANTAGE_ESTIMATORS.get("ppo", "loss.advantage")
    unknown = "loss.advantage: unknown advantage estimator 'ppo'; known: dr_grpo, grpo, rloo"
    assert str(info.value).startswith(unknown)


def test_policy_losses_declare_their_aggregation():
    assert aggregation_of(gspo_policy_loss) == "seq-mean-token-mean"
    assert aggregation_of(clip_policy_loss) == "token-mean"
    with pytest.raises(ValueError, match="aggregation is one of"):
        policy_loss(aggregation="mean")


def test_config_choices_match_the_registries():
    from rapo_echo.algorithms.loss_config import LossConfig

    fields = LossConfig.model_fields
    assert set(typing.get_args(fields["agg"].annotation)) == {"auto", *AGGREGATIONS}
    assert LossConfig(advantage="rloo", policy_loss="gspo").advantage == "rloo"
    assert LossConfig(policy_loss="gspo").agg == "seq-mean-token-mean"
    for key in ("advantage", "policy_loss", "kl_estimator"):
        with pytest.raises(ValueError, match=f"{key}\n.*unknown .*'nonesuch'; known: "):
            LossConfig(**{key: "nonesuch"})
