"""Alarms for a run going bad: pure functions over metric series (one value per step, oldest first; None
where a step did not log it), each returning its evidence as one sentence, or None (docs/monitor.md).
"Baseline" is the mean of the first ``baseline`` values, "recent" the mean of the last ``window``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

Series = Sequence[float | None]


@dataclass(frozen=True)
class AlarmSpec:
    """What an alarm reads and where to look when it fires."""

    metric: str
    switch: str


ALARMS: dict[str, AlarmSpec] = {
    "entropy_collapse": AlarmSpec(
        "entropy", "loss.entropy_coef, rollout.temperature, train.lr, rapo.sd.coef"
    ),
    "entropy_blowup": AlarmSpec("entropy", "rapo.sd.loss, rapo.sd.coef, rapo.sd.ref_kl, train.lr"),
    "length_spike": AlarmSpec("reply_len/mean", "rollout.max_new_tokens, loss.agg, a length penalty reward"),
    "replies_converge": AlarmSpec(
        "reply/distinct_2, reply/top_share", "rollout.temperature, loss.entropy_coef, rapo.sd.coef"
    ),
    "kl_drift": AlarmSpec("kl (with reward key)", "loss.beta, rapo.sd.ref_kl, train.lr"),
    "sd_dominates": AlarmSpec("sd/pg_ratio", "rapo.sd.coef, rapo.sd.verify, rapo.sd.decay"),
    "reward_oscillates": AlarmSpec(
        "the reward key (monitor.reward_key)", "train.lr, rollout.group_size, rapo.judge.orders"
    ),
}


def values(series: Series) -> list[float]:
    """The finite values of a series, in order."""
    return [float(v) for v in series if v is not None and math.isfinite(float(v))]


def baseline_recent(series: Series, baseline: int, window: int) -> tuple[float, float] | None:
    """(mean of the first ``baseline`` values, mean of the last ``window``); None until the series has
    more than ``baseline`` values."""
    xs = values(series)
    if len(xs) <= baseline:
        return None
    return statistics.fmean(xs[:baseline]), statistics.fmean(xs[-window:])


def trend(xs: Sequence[float]) -> tuple[float, float]:
    """(slope per step, its t statistic) of the least-squares line through ``xs`` at steps 0..n-1.
    t is +-inf for a perfect line and 0 for a flat one; needs n >= 3."""
    n = len(xs)
    if n < 3:
        raise ValueError(f"trend needs at least 3 values, got {n}")
    tm = (n - 1) / 2
    sxx = sum((t - tm) ** 2 for t in range(n))
    ym = statistics.fmean(xs)
    slope = sum((t - tm) * (y - ym) for t, y in enumerate(xs)) / sxx
    resid = sum((y - ym - slope * (t - tm)) ** 2 for t, y in enumerate(xs))
    se = math.sqrt(resid / (n - 2) / sxx)
    if se == 0:
        return slope, 0.0 if slope == 0 else math.copysign(math.inf, slope)
    return slope, slope / se


def entropy_collapse(entropy: Series, *, baseline: int, window: int, frac: float) -> str | None:
    """Recent entropy <= ``frac`` x its baseline."""
    br = baseline_recent(entropy, baseline, window)
    if br is None or br[0] <= 0 or br[1] > frac * br[0]:
        return None
    return f"entropy {br[1]:.3g} (last {window} steps) fell to <= {frac:g} x the baseline {br[0]:.3g}"


def entropy_blowup(entropy: Series, *, baseline: int, window: int, rise: float) -> str | None:
    """Recent entropy >= ``rise`` x its baseline: the policy spreads out instead of learning (the
    off-policy collapse of Critique-GRPO's issue #6, entropy and KL "increasing crazily")."""
    br = baseline_recent(entropy, baseline, window)
    if br is None or br[0] <= 0 or br[1] < rise * br[0]:
        return None
    return f"entropy {br[1]:.3g} (last {window} steps) rose to >= {rise:g} x the baseline {br[0]:.3g}"


def followed(reward: Series, *, baseline: int, window: int) -> float | None:
    """How far the reward's recent mean (last ``window``) stands above its baseline (first ``baseline``), in
    standard errors of the difference (Welch); None until both exist with two values each."""
    xs = values(reward)
    if len(xs) < baseline + window or baseline < 2 or window < 2:
        return None
    b, r = xs[:baseline], xs[-window:]
    se = math.sqrt(statistics.variance(b) / len(b) + statistics.variance(r) / len(r))
    diff = statistics.fmean(r) - statistics.fmean(b)
    if se == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / se


def length_spike(
    length: Series, *, baseline: int, window: int, max_new_tokens: int, frac: float, rise: float
) -> str | None:
    """Recent mean reply length >= ``frac`` x ``max_new_tokens`` and >= ``rise`` x its baseline."""
    br = baseline_recent(length, baseline, window)
    if br is None:
        return None
    base, recent = br
    if recent < frac * max_new_tokens or recent < rise * base:
        return None
    return (
        f"mean reply length {recent:.1f} tokens (last {window} steps) is >= {frac:g} x max_new_tokens "
        f"{max_new_tokens} and >= {rise:g} x the baseline {base:.1f}"
    )


def replies_converge(
    distinct2: Series,
    top_share: Series,
    *,
    baseline: int,
    window: int,
    distinct_frac: float,
    top_share_max: float,
) -> str | None:
    """The replies converge: recent Distinct-2 <= ``distinct_frac`` x its baseline, or one reply
    dominates its group (recent mean share of a group's most frequent reply >= ``top_share_max``)."""
    why = []
    d = baseline_recent(distinct2, baseline, window)
    if d is not None and d[0] > 0 and d[1] <= distinct_frac * d[0]:
        why.append(
            f"Distinct-2 {d[1]:.3f} (last {window} steps) fell to <= {distinct_frac:g} x the baseline "
            f"{d[0]:.3f}"
        )
    t = baseline_recent(top_share, baseline, window)
    if t is not None and t[1] >= top_share_max and t[1] > t[0]:
        why.append(
            f"a group's most frequent reply makes up {t[1]:.0%} of it on average (last {window} steps; "
            f"baseline {t[0]:.0%}, threshold {top_share_max:.0%})"
        )
    return "; ".join(why) or None


def kl_drift(
    kl: Series,
    reward: Series,
    *,
    baseline: int,
    window: int,
    trend_window: int,
    kl_min: float,
    t_grow: float,
    follow_z: float,
) -> str | None:
    """The KL to the reference grows (mean >= ``kl_min``, slope t >= ``t_grow`` over ``trend_window``
    steps) while the reward stands < ``follow_z`` standard errors above its baseline (:func:`followed`)."""
    ks = values(kl)
    if len(ks) < trend_window:
        return None
    ks = ks[-trend_window:]
    z = followed(reward, baseline=baseline, window=window)
    mean_kl = statistics.fmean(ks)
    slope, t = trend(ks)
    if z is None or mean_kl < kl_min or t < t_grow or z >= follow_z:
        return None
    return (
        f"KL to the reference {mean_kl:.3g} on average over the last {trend_window} steps and rising "
        f"({slope:+.3g}/step, t {t:.1f}) while the reward did not follow (its last {window} steps stand "
        f"{z:.1f} standard errors above its first {baseline}; needs {follow_z:g})"
    )


def sd_dominates(ratio: Series, *, window: int, max_ratio: float) -> str | None:
    """The self-distillation loss pulls harder than the GRPO loss: the recent mean of ``sd/pg_ratio``
    (the SD term's gradient over the GRPO term's, on the token log-probs) >= ``max_ratio``."""
    xs = values(ratio)
    if len(xs) < window:
        return None
    recent = statistics.fmean(xs[-window:])
    if recent < max_ratio:
        return None
    return (
        f"the SD loss pulls {recent:.2f} x as hard as the GRPO loss on the token log-probs (last {window} "
        f"steps; threshold {max_ratio:g})"
    )


def reward_oscillates(
    reward: Series, spread: Series, count: Series, *, window: int, ratio: float, t_max: float
) -> str | None:
    """The reward swings without a trend (RLVER's issue #4): over the last ``window`` steps, the step means'
    std is >= ``ratio`` x their sampling error (RMS of ``spread / sqrt(count)``; noise alone gives about
    1) while the slope's |t| stays below ``t_max``."""
    rows = [
        (float(m), float(s), float(n))
        for m, s, n in zip(reward, spread, count)
        if m is not None and s is not None and n is not None
        if math.isfinite(float(m)) and math.isfinite(float(s)) and float(n) > 0
    ][-window:]
    if len(rows) < window:
        return None
    means = [m for m, _, _ in rows]
    noise = math.sqrt(statistics.fmean(s * s / n for _, s, n in rows))
    sd = statistics.stdev(means)
    slope, t = trend(means)
    if sd == 0 or sd < ratio * noise or abs(t) >= t_max:  # a constant reward does not swing
        return None
    return (
        f"the reward swings (std {sd:.3g} of the step means over the last {window} steps, "
        f"{sd / max(noise, 1e-12):.1f} x their sampling error {noise:.3g}; range {min(means):.3g}.."
        f"{max(means):.3g}) without a trend "
        f"({slope:+.3g}/step, |t| {abs(t):.1f} < {t_max:g})"
    )
