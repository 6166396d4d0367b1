"""The GRPO core as pure tensor functions: advantages, policy losses, KL, aggregation.

Everything here is plain torch (no model, no config), runs on CPU and is differentiable where a
loss is computed. The advantage estimators, policy losses and KL estimators are declared with the
decorators of :mod:`.registries` and registered under the names the config accepts as entry points
(rapo-echo's pyproject.toml), as a package registers its own; ``AGGREGATIONS`` maps the aggregation
modes, and :func:`get` looks one up and fails with the allowed names. Shapes: ``N`` samples, ``B``
sequences, ``T`` padded tokens.

Masks are bool or float ``[B, T]`` (non-zero = a completion token that counts). Masked-out
positions never leak into results, even when they hold ``inf`` or ``nan`` (padding), and an empty
mask gives 0, never NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .registries import advantage_estimator, kl_estimator, policy_loss

# Log-ratios are clamped to this range before exp (as verl does) so that a wild token cannot
# overflow; values inside the range are exact.
MAX_LOG_RATIO = 20.0


class UnknownNameError(KeyError):
    """A registry has no entry under the name asked for; the message lists the allowed names."""

    def __str__(self) -> str:
        return str(self.args[0])


def get(registry: Mapping[str, Any], name: str, kind: str) -> Any:
    """``registry[name]``, or :class:`UnknownNameError` naming ``kind`` and the allowed names."""
    if name not in registry:
        raise UnknownNameError(f"unknown {kind} {name!r}; allowed: {', '.join(sorted(registry))}")
    return registry[name]


# ---------------------------------------------------------------------------- input checks


def _check_samples(fn: str, rewards: Tensor, groups: Tensor, valid: Tensor, eps: float) -> None:
    for name, t in (("rewards", rewards), ("groups", groups), ("valid", valid)):
        if not isinstance(t, Tensor) or t.dim() != 1:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{fn}: {name} must be a 1-D tensor [N], got {shape}")
    if not (rewards.shape == groups.shape == valid.shape):
        raise ValueError(
            f"{fn}: rewards, groups and valid must have the same length, got "
            f"{len(rewards)}, {len(groups)} and {len(valid)}"
        )
    if groups.dtype.is_floating_point or groups.dtype.is_complex or groups.dtype == torch.bool:
        raise ValueError(f"{fn}: groups must be an integer tensor of group ids, got dtype {groups.dtype}")
    if valid.dtype != torch.bool:
        raise ValueError(f"{fn}: valid must be a bool tensor, got dtype {valid.dtype}")
    if eps < 0:
        raise ValueError(f"{fn}: eps must be >= 0, got {eps}")
    bad = valid & ~torch.isfinite(rewards.to(torch.float64))
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"{fn}: rewards[{i}] is {rewards[i].item()} but valid[{i}] is True; mark a sample whose "
            "reward could not be computed invalid instead"
        )


def _check_tokens(fn: str, mask: Tensor, **tensors: Tensor) -> None:
    for name, t in {**tensors, "mask": mask}.items():
        if not isinstance(t, Tensor) or t.dim() != 2:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{fn}: {name} must be a 2-D tensor [B, T], got {shape}")
    first, ref = next(iter(tensors.items()))
    for name, t in {**tensors, "mask": mask}.items():
        if t.shape != ref.shape:
            raise ValueError(
                f"{fn}: {name} has shape {tuple(t.shape)} but {first} has shape {tuple(ref.shape)}"
            )


def _check_advantages(fn: str, advantages: Tensor, batch: int, like: Tensor | None = None) -> None:
    """``advantages`` is [B] (one per sequence), or [B, T] like ``like`` (one per token) when given."""
    if isinstance(advantages, Tensor) and like is not None and advantages.shape == like.shape:
        return
    if not isinstance(advantages, Tensor) or advantages.shape != (batch,):
        shape = tuple(advantages.shape) if isinstance(advantages, Tensor) else type(advantages).__name__
        also = f" or [B, T] = {tuple(like.shape)}" if like is not None else ""
        raise ValueError(f"{fn}: advantages must have shape [B] = ({batch},){also}, got {shape}")


def _check_eps(fn: str, eps_low: float, eps_high: float) -> None:
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"{fn}: eps_low and eps_high must be >= 0, got {eps_low} and {eps_high}")


def _compute_dtype(t: Tensor) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _masked(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(x * m with masked-out positions exactly 0 even where x is inf/nan, the float mask m)."""
    m = mask.to(_compute_dtype(x) if x.dtype.is_floating_point else torch.float32)
    return torch.where(m != 0, x.to(m.dtype) * m, torch.zeros((), dtype=m.dtype, device=x.device)), m


# ---------------------------------------------------------------------------- advantages


def _group_stats(rewards: Tensor, groups: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sample (reward as float64 with invalid ones set to 0, group index, group size, group mean);
    only valid samples count towards a group's size and mean."""
    zero = torch.zeros((), dtype=torch.float64, device=rewards.device)
    r = torch.where(valid, rewards.to(torch.float64), zero)
    _, idx = torch.unique(groups, return_inverse=True)
    n_groups = int(idx.max()) + 1 if idx.numel() else 0
    w = valid.to(torch.float64)
    count = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, idx, w)
    total = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, idx, r)
    mean = total / count.clamp(min=1)
    return r, idx, count[idx], mean[idx]


def _degenerate(r: Tensor, idx: Tensor, valid: Tensor, count: Tensor) -> Tensor:
    """Per-sample True where its group has < 2 valid samples or all valid rewards equal (no signal)."""
    n_groups = int(idx.max()) + 1 if idx.numel() else 0
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=r.device)
    hi = torch.full((n_groups,), -float("inf"), dtype=torch.float64, device=r.device)
    lo = torch.full((n_groups,), float("inf"), dtype=torch.float64, device=r.device)
    hi = hi.scatter_reduce(0, idx, torch.where(valid, r, -inf), reduce="amax")
    lo = lo.scatter_reduce(0, idx, torch.where(valid, r, inf), reduce="amin")
    return (count < 2) | (hi[idx] == lo[idx])


def _finish(adv: Tensor, valid: Tensor, degenerate: Tensor, like: Tensor) -> Tensor:
    out = torch.where(valid & ~degenerate, adv, torch.zeros((), dtype=adv.dtype, device=adv.device))
    return out.to(like.dtype if like.dtype.is_floating_point else torch.get_default_dtype())


@advantage_estimator
def grpo_advantages(rewards: Tensor, groups: Tensor, valid: Tensor, *, eps: float = 1e-4) -> Tensor:
    """``(r - mean_g) / (std_g + eps)`` with the unbiased (Bessel) std over the valid samples of each group.
    Invalid samples are left out of every statistic and get 0; a group with fewer than 2 valid samples or
    all-equal rewards gets 0. ``groups`` holds any integer ids (not necessarily contiguous)."""
    _check_samples("grpo_advantages", rewards, groups, valid, eps)
    r, idx, count, mean = _group_stats(rewards, groups, valid)
    n_groups = int(idx.max()) + 1 if idx.numel() else 0
    dev = torch.where(valid, r - mean, torch.zeros((), dtype=r.dtype, device=r.device))
    sq = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, idx, dev * dev)
    std = (sq[idx] / (count - 1).clamp(min=1)).sqrt()
    return _finish(dev / (std + eps), valid, _degenerate(r, idx, valid, count), rewards)


@advantage_estimator
def dr_grpo_advantages(rewards: Tensor, groups: Tensor, valid: Tensor, *, eps: float = 1e-4) -> Tensor:
    """``r - mean_g`` over the valid samples of each group (Dr. GRPO: no std division; ``eps`` unused);
    invalid samples and degenerate groups as in :func:`grpo_advantages`."""
    _check_samples("dr_grpo_advantages", rewards, groups, valid, eps)
    r, idx, count, mean = _group_stats(rewards, groups, valid)
    return _finish(r - mean, valid, _degenerate(r, idx, valid, count), rewards)


@advantage_estimator
def rloo_advantages(rewards: Tensor, groups: Tensor, valid: Tensor, *, eps: float = 1e-4) -> Tensor:
    """``r_i`` minus the mean of the other valid samples of its group (leave-one-out, computed as
    ``n / (n - 1) * (r_i - mean_g)``; ``eps`` unused); invalid samples and degenerate groups as in
    :func:`grpo_advantages`."""
    _check_samples("rloo_advantages", rewards, groups, valid, eps)
    r, idx, count, mean = _group_stats(rewards, groups, valid)
    adv = count / (count - 1).clamp(min=1) * (r - mean)
    return _finish(adv, valid, _degenerate(r, idx, valid, count), rewards)


# ---------------------------------------------------------------------------- policy losses


def _pessimistic(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """(``-min(ratio*A, clamp(ratio)*A)``, bool where the clipped branch is taken); where both are equal
    the unclipped one is taken, so its gradient flows in full."""
    unclipped = -ratio * adv
    clipped = -ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    active = clipped > unclipped
    return torch.where(active, clipped, unclipped), active


@policy_loss
def clip_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO / GRPO clipped surrogate per token; clip-higher (DAPO) when ``eps_high > eps_low``.

    ``ratio = exp(logp - old_logp)``, ``loss = -min(ratio*A, clamp(ratio, 1-eps_low, 1+eps_high)*A)``.
    ``advantages`` is one value per sequence ``[B]`` (GRPO) or per token ``[B, T]`` (PPO with GAE).
    Returns (loss ``[B, T]``, 0 where ``mask`` is 0; stats ``clip_frac`` = fraction of masked
    tokens where the clipped branch is taken, ``ratio_mean`` = mean ratio over masked tokens).
    ``old_logp`` and ``advantages`` are treated as constants.
    """
    fn = "clip_policy_loss"
    _check_tokens(fn, mask, logp=logp, old_logp=old_logp)
    _check_advantages(fn, advantages, logp.shape[0], like=logp)
    _check_eps(fn, eps_low, eps_high)
    dtype = _compute_dtype(logp)
    on = mask != 0
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    log_ratio = torch.where(on, logp.to(dtype) - old_logp.detach().to(dtype), zero)
    ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
    adv = advantages.detach().to(dtype)
    adv = torch.where(on, adv, zero) if adv.dim() == 2 else adv.unsqueeze(-1)
    loss, active = _pessimistic(ratio, adv, eps_low, eps_high)
    stats = {
        "clip_frac": (active & on).sum().to(dtype) / on.sum().clamp(min=1).to(dtype),
        "ratio_mean": masked_mean(ratio.detach(), mask),
    }
    return torch.where(on, loss, zero), stats


# GSPO weights sequences equally (its objective is a mean over sequences of sequence-level terms; verl
# hard-codes ``seq-mean-token-mean`` for it), where ``token-mean`` would weigh a reply by its length.
@policy_loss(aggregation="seq-mean-token-mean")
def gspo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (arXiv 2507.18071): the clipped surrogate on the length-normalised sequence ratio.

    ``s_i = exp(mean over masked tokens of (logp - old_logp))``; each token carries
    ``s_it = sg(s_i) * exp(logp_t - sg(logp_t))`` (value ``s_i``, gradient through every token) and
    ``loss_it = -min(s_it*A_i, clamp(s_it, 1-eps_low, 1+eps_high)*A_i)``, so a whole sequence is
    clipped or not. Stats: ``clip_frac`` = fraction of sequences (with any token) that are
    clipped, ``ratio_mean`` = mean of ``s_it`` over masked tokens.
    """
    fn = "gspo_policy_loss"
    _check_tokens(fn, mask, logp=logp, old_logp=old_logp)
    _check_advantages(fn, advantages, logp.shape[0])
    _check_eps(fn, eps_low, eps_high)
    dtype = _compute_dtype(logp)
    on = mask != 0
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    m = mask.to(dtype)
    lp = torch.where(on, logp.to(dtype), zero)
    diff = torch.where(on, lp - old_logp.detach().to(dtype), zero)
    row_tokens = m.sum(-1)
    seq_log_ratio = (diff * m).sum(-1) / torch.where(row_tokens > 0, row_tokens, torch.ones_like(row_tokens))
    seq_log_ratio = seq_log_ratio.detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    token_ratio = (lp - lp.detach() + seq_log_ratio.unsqueeze(-1)).exp()
    adv = advantages.detach().to(dtype).unsqueeze(-1)
    loss, active = _pessimistic(token_ratio, adv, eps_low, eps_high)
    has = on.any(-1)
    stats = {
        "clip_frac": ((active & on).any(-1) & has).sum().to(dtype) / has.sum().clamp(min=1).to(dtype),
        "ratio_mean": masked_mean(token_ratio.detach(), mask),
    }
    return torch.where(on, loss, zero), stats


# ---------------------------------------------------------------------------- KL estimators


def _kl_inputs(fn: str, logp: Tensor, ref_logp: Tensor, mask: Tensor | None) -> Tensor:
    """``logp - ref_logp``; with ``mask``, both are set to 0 at masked-out positions first, so padding
    that holds ``inf`` or ``nan`` reaches neither the value nor the gradient."""
    if logp.shape != ref_logp.shape:
        raise ValueError(
            f"{fn}: logp has shape {tuple(logp.shape)} but ref_logp has shape {tuple(ref_logp.shape)}"
        )
    ref = ref_logp.to(logp.dtype)
    if mask is None:
        return logp - ref
    if mask.shape != logp.shape:
        raise ValueError(f"{fn}: mask has shape {tuple(mask.shape)} but logp has shape {tuple(logp.shape)}")
    on = mask != 0
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    return torch.where(on, logp, zero) - torch.where(on, ref, zero)


def _kl_out(kl: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return kl
    return torch.where(mask != 0, kl, torch.zeros((), dtype=kl.dtype, device=kl.device))


@kl_estimator
def kl_k1(logp: Tensor, ref_logp: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """k1 estimate of KL(pi || pi_ref) per token: ``logp - ref_logp`` (unbiased, high variance). With
    ``mask`` (every estimator takes it), masked-out positions are 0 and their inputs, even ``inf`` or
    ``nan``, touch neither the values nor the gradients."""
    return _kl_out(_kl_inputs("kl_k1", logp, ref_logp, mask), mask)


@kl_estimator
def kl_k2(logp: Tensor, ref_logp: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """k2 estimate per token: ``0.5 * (logp - ref_logp)**2`` (biased, low variance, >= 0)."""
    return _kl_out(0.5 * _kl_inputs("kl_k2", logp, ref_logp, mask).square(), mask)


@kl_estimator
def kl_k3(logp: Tensor, ref_logp: Tensor, *, mask: Tensor | None = None) -> Tensor:
    """k3 estimate per token (Schulman): ``exp(ref_logp - logp) - (ref_logp - logp) - 1`` (unbiased, >= 0);
    ``ref_logp - logp`` is clamped to +-20 before exp so padding or a wild token cannot overflow."""
    x = (-_kl_inputs("kl_k3", logp, ref_logp, mask)).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return _kl_out(x.exp() - x - 1, mask)


# ---------------------------------------------------------------------------- GAE and value loss


def gae_advantages(
    rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the masked (action) tokens of each row.

    Positions where ``mask`` is 0 (padding, or the user's tokens inside a dialogue) are skipped: the
    next action token's value and advantage carry across them. For the action tokens ``t`` of a row,
    in order, with ``V`` after the row's last action token taken as 0:

        ``delta_t = r_t + gamma * V_{t+1} - V_t``,  ``A_t = delta_t + gamma * lam * A_{t+1}``,
        ``returns_t = A_t + V_t``.

    ``rewards`` must be 0 outside the mask (a reward on a skipped token is an error). Returns
    (advantages, returns), both ``[B, T]`` and 0 where ``mask`` is 0. Computed in float64.
    """
    fn = "gae_advantages"
    _check_tokens(fn, mask, rewards=rewards, values=values)
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError(f"{fn}: gamma and lam must be in [0, 1], got {gamma} and {lam}")
    on = mask != 0
    r = rewards.detach().to(torch.float64)
    if (torch.where(on, torch.zeros_like(r), r) != 0).any():
        raise ValueError(f"{fn}: rewards must sit on masked (action) tokens; a skipped token holds one")
    v = torch.where(on, values.detach().to(torch.float64), torch.zeros_like(r))
    adv = torch.zeros_like(r)
    next_value = torch.zeros(r.shape[0], dtype=torch.float64, device=r.device)
    next_adv = torch.zeros_like(next_value)
    for t in range(r.shape[1] - 1, -1, -1):
        delta = r[:, t] + gamma * next_value - v[:, t]
        here = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(on[:, t], here, torch.zeros_like(here))
        next_value = torch.where(on[:, t], v[:, t], next_value)
        next_adv = torch.where(on[:, t], here, next_adv)
    return adv, torch.where(on, adv + v, torch.zeros_like(adv))


def masked_whiten(x: Tensor, mask: Tensor, *, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / (std + eps)`` with mean and (population) std over the masked positions; 0 elsewhere."""
    if x.shape != mask.shape:
        raise ValueError(
            f"masked_whiten: x has shape {tuple(x.shape)} but mask has shape {tuple(mask.shape)}"
        )
    xm, m = _masked(x, mask)
    on = m != 0
    x = torch.where(on, x.to(m.dtype), torch.zeros_like(m))  # masked first: inf/nan padding never leaks
    n = m.sum().clamp(min=1)
    mean = xm.sum() / n
    var = (torch.where(on, (x - mean) ** 2, torch.zeros_like(m))).sum() / n
    out = (x - mean) / (var.sqrt() + eps)
    return torch.where(on, out, torch.zeros_like(out))


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip: float | None = 0.2
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's value loss per token: ``0.5 * max((V - R)^2, (V_old + clamp(V - V_old, -clip, clip) - R)^2)``
    (``0.5 * (V - R)^2`` when ``clip`` is None). ``old_values`` and ``returns`` are constants. Returns
    (loss ``[B, T]``, 0 where ``mask`` is 0; stats ``clip_frac`` = fraction of masked tokens where the
    clipped term is the larger one)."""
    fn = "value_loss"
    _check_tokens(fn, mask, values=values, old_values=old_values, returns=returns)
    if clip is not None and clip <= 0:
        raise ValueError(f"{fn}: clip must be > 0 or None, got {clip}")
    dtype = _compute_dtype(values)
    on = mask != 0
    zero = torch.zeros((), dtype=dtype, device=values.device)
    v = torch.where(on, values.to(dtype), zero)
    old = torch.where(on, old_values.detach().to(dtype), zero)
    ret = torch.where(on, returns.detach().to(dtype), zero)
    plain = (v - ret) ** 2
    if clip is None:
        loss, active = plain, torch.zeros_like(on)
    else:
        clipped = (old + (v - old).clamp(-clip, clip) - ret) ** 2
        active = clipped > plain
        loss = torch.where(active, clipped, plain)
    stats = {"clip_frac": (active & on).sum().to(dtype) / on.sum().clamp(min=1).to(dtype)}
    return torch.where(on, 0.5 * loss, zero), stats


# ---------------------------------------------------------------------------- aggregation


def count_tokens_and_seqs(mask: Tensor) -> tuple[float, float]:
    """(sum of ``mask``, number of rows with any masked token): the totals to pass to :func:`aggregate`."""
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"count_tokens_and_seqs: mask must be a 2-D tensor [B, T], got {shape}")
    return float(mask.to(torch.float64).sum()), float((mask != 0).any(-1).sum())


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """``sum(x * m) / max(sum(m), 1)``: 0 for an empty mask, never NaN."""
    if x.shape != mask.shape:
        raise ValueError(f"masked_mean: x has shape {tuple(x.shape)} but mask has shape {tuple(mask.shape)}")
    xm, m = _masked(x, mask)
    return xm.sum() / m.sum().clamp(min=1)


def _divide(num: Tensor, denom: float | Tensor, has_tokens: bool, what: str) -> Tensor:
    """``num / denom``; 0 (still in the graph) when this call has no tokens."""
    if not has_tokens:
        return num
    d = float(denom)
    if not d > 0:
        raise ValueError(f"aggregate: {what} must be > 0 when the mask has tokens, got {d}")
    return num / d


def _agg_inputs(per_token: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, bool]:
    _check_tokens("aggregate", mask, per_token=per_token)
    xm, m = _masked(per_token, mask)
    return xm, m, bool((mask != 0).any())


def agg_token_mean(
    per_token: Tensor, mask: Tensor, *, total_tokens: float | Tensor | None = None, **unused: object
) -> Tensor:
    """``sum(x*m) / total_tokens`` (``total_tokens`` defaults to this call's ``sum(m)``)."""
    xm, m, has = _agg_inputs(per_token, mask)
    denom = m.sum() if total_tokens is None else total_tokens
    return _divide(xm.sum(), denom, has, "total_tokens")


def agg_seq_mean_token_mean(
    per_token: Tensor, mask: Tensor, *, total_seqs: float | Tensor | None = None, **unused: object
) -> Tensor:
    """``sum_i [sum_t x*m / sum_t m] / total_seqs`` (original GRPO; ``total_seqs`` defaults to this call's
    rows with any token); rows without tokens add 0."""
    xm, m, has = _agg_inputs(per_token, mask)
    row_tokens = m.sum(-1)
    row_means = xm.sum(-1) / torch.where(row_tokens != 0, row_tokens, torch.ones_like(row_tokens))
    denom = (mask != 0).any(-1).sum() if total_seqs is None else total_seqs
    return _divide(row_means.sum(), denom, has, "total_seqs")


def agg_seq_mean_token_sum_norm(
    per_token: Tensor,
    mask: Tensor,
    *,
    total_seqs: float | Tensor | None = None,
    norm_constant: float | None = None,
    **unused: object,
) -> Tensor:
    """``sum(x*m) / (total_seqs * norm_constant)`` (Dr. GRPO's constant normaliser); the defaults are this
    call's rows with any token and padded length ``T``: pass both under micro-batching."""
    xm, _, has = _agg_inputs(per_token, mask)
    seqs = (mask != 0).any(-1).sum() if total_seqs is None else total_seqs
    const = per_token.shape[-1] if norm_constant is None else norm_constant
    if float(const) <= 0:
        raise ValueError(f"aggregate: norm_constant must be > 0, got {const}")
    return _divide(xm.sum(), float(seqs) * float(const), has, "total_seqs * norm_constant")


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "token-mean": agg_token_mean,
    "seq-mean-token-mean": agg_seq_mean_token_mean,
    "seq-mean-token-sum-norm": agg_seq_mean_token_sum_norm,
}


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: str,
    *,
    total_tokens: float | Tensor | None = None,
    total_seqs: float | Tensor | None = None,
    norm_constant: float | None = None,
) -> Tensor:
    """Reduce a per-token ``[B, T]`` quantity to the scalar loss with the aggregation ``mode``.

    Exact under micro-batching: with the mini-batch's totals (see :func:`count_tokens_and_seqs`,
    and ``norm_constant`` for Dr. GRPO), the sum over micro-batches equals the whole mini-batch.
    """
    fn = get(AGGREGATIONS, mode, "aggregation mode")
    return fn(per_token, mask, total_tokens=total_tokens, total_seqs=total_seqs, norm_constant=norm_constant)
