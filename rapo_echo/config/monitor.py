"""The ``monitor`` section: the reward-hacking monitor's thresholds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rapo_echo.config.base import ClosedShare, OpenShare, Share, Strict


class HeldoutConfig(Strict):
    """The held-out judge (rapo_echo/judges/heldout.py): a judge the policy is never trained on scores a
    sample of each step's replies; its agreement with the training reward is logged (`heldout/*`) and a
    training score that rises while the held-out one does not is the monitor's `reward_divergence`."""

    enabled: bool = Field(False, description="Score a sample of each step's replies with a held-out judge.")
    engine: Literal["judge", "simulator"] = Field(
        "judge", description="The role whose engine (model, endpoint) the held-out judge asks."
    )
    sample: int = Field(4, ge=2, le=64, description="Replies scored per step (per process).")
    use_logprobs: Literal["auto", "always", "never"] = Field(
        "auto", description="Read P(yes) from label log-probs (`auto`: where the engine gives them)."
    )


class MonitorConfig(Strict):
    """Reward-hacking monitor (rapo_echo/monitor.py): flags Echo-N1's failure signatures and the alarms of a
    run going bad (rapo_echo/alarms.py) per step. Baselines are the means of the first ``baseline_steps``
    steps; "recent" is the mean of the last ``window`` steps; trends are taken over the last
    ``trend_window`` steps."""

    enabled: bool = Field(True, description="Log `monitor/<signature>` flags and warn once per signature.")
    baseline_steps: int = Field(3, ge=1, description="Steps whose means are the baseline.")
    window: int = Field(3, ge=1, description="Recent steps averaged against the baseline.")
    length_frac: Share = Field(
        0.9, description="length_spike: recent reply length >= this x `rollout.max_new_tokens` ..."
    )
    length_rise: float = Field(1.5, ge=1.0, description="... and >= this x the baseline length.")
    entropy_frac: OpenShare = Field(
        0.3, description="entropy_collapse: recent entropy <= this x the baseline."
    )
    reward_jump: float = Field(
        0.3, gt=0.0, description="reward_divergence: the reward rose at least this over its baseline ..."
    )
    follow_frac: ClosedShare = Field(
        0.25, description="... while `heldout_key` rose by less than this x that."
    )
    heldout_key: str | None = Field(
        None,
        description="A logged held-out metric, e.g. `reward/judge/mean` (None: `heldout/score` against "
        "`heldout/train_score` when `heldout.enabled`, else no reward_divergence).",
    )
    heldout: HeldoutConfig = Field(default_factory=HeldoutConfig, description="The held-out judge.")
    judge_text_frac: Share = Field(
        0.25, description="judge_text: at least this share of replies carry judge answer syntax."
    )
    judge_addressed_frac: Share = Field(
        0.1, description="judge_addressed: at least this share of replies address the judge (docs/judges.md)."
    )
    reference_kl: bool = Field(
        False,
        description="Keep the reference and log `kl` (to it, on the policy's tokens) even with `loss.beta` 0,"
        " for kl_drift (one more no-grad forward per step).",
    )
    reward_key: str = Field(
        "auto",
        description="The reward kl_drift and reward_oscillates read (`auto`: `sim/emotion_delta` where"
        " logged, else `reward/mean`); its per-step spread is the same key with `_std` (or `/std` for"
        " `/mean`).",
    )
    trend_window: int = Field(
        20, ge=3, description="kl_drift, reward_oscillates: steps a trend is taken over."
    )
    distinct_frac: OpenShare = Field(
        0.5, description="replies_converge: recent Distinct-2 <= this x the baseline ..."
    )
    top_share_max: Share = Field(
        0.75,
        description="... or a group's most frequent reply makes up at least this share of it (recent mean).",
    )
    kl_min: float = Field(0.05, ge=0.0, description="kl_drift: the recent mean KL is at least this ...")
    kl_t_grow: float = Field(3.0, gt=0.0, description="... rising with a slope t statistic >= this ...")
    kl_follow_z: float = Field(
        3.0,
        description="... while the reward's recent mean stands less than this many standard errors above its"
        " baseline.",
    )
    entropy_rise: float = Field(
        1.3, gt=1.0, description="entropy_blowup: recent entropy >= this x the baseline."
    )
    sd_ratio_max: float = Field(
        3.0, gt=0.0, description="sd_dominates: recent `sd/pg_ratio` >= this (SD pulls this x GRPO's pull)."
    )
    oscillation_ratio: float = Field(
        2.0,
        gt=0.0,
        description="reward_oscillates: the step means' std >= this x their sampling error (the per-step "
        "spread / sqrt(valid)) ...",
    )
    oscillation_t_max: float = Field(2.0, gt=0.0, description="... while the slope's |t| stays below this.")
