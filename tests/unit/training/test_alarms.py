"""The alarms of a run going bad (rapo_echo/alarms.py), each on a synthetic metric series that trips it and
one that does not, with the numbers worked by hand; the monitor wires them into flags, names the metric
and switch, shows the step's replies, writes alarms.jsonl, and ``train.stop_on_alarm`` ends a run."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from rapo_echo import alarms
from rapo_echo.config import MonitorConfig
from rapo_echo.monitor import ALARMS_FILE, PREFIX, SIGNATURES, RewardHackingMonitor, pull_ratio, spread_key
from tests.helpers.runs import SMALL, metrics, run_config


def test_trend_by_hand() -> None:
    assert alarms.trend([1.0, 2.0, 3.0]) == (1.0, math.inf)
    assert alarms.trend([2.0, 2.0, 2.0]) == (0.0, 0.0)
    # x = 0..3 centred -1.5 -0.5 0.5 1.5 (sxx 5); y = 0 2 1 3, mean 1.5: slope (2.25 - 0.25 - 0.25 + 2.25) / 5
    # = 0.8; residuals -(-1.2) ... : y - 1.5 - 0.8 (x - 1.5) = 0.3, 0.9, -0.9, -0.3 -> SSR 1.8
    # se = sqrt(1.8 / 2 / 5) = 0.4243; t = 0.8 / 0.4243 = 1.886
    slope, t = alarms.trend([0.0, 2.0, 1.0, 3.0])
    assert slope == pytest.approx(0.8) and t == pytest.approx(0.8 / math.sqrt(0.18))
    with pytest.raises(ValueError):
        alarms.trend([1.0, 2.0])


def test_values_skip_none_and_nan() -> None:
    assert alarms.values([1.0, None, float("nan"), 2.0]) == [1.0, 2.0]


def test_entropy_collapse() -> None:
    # baseline mean(2.0, 2.2, 1.8) = 2.0; recent mean(0.9, 0.5, 0.3) = 0.567 <= 0.3 x 2.0 = 0.6
    falling = [2.0, 2.2, 1.8, 1.5, 0.9, 0.5, 0.3]
    assert "0.567" in alarms.entropy_collapse(falling, baseline=3, window=3, frac=0.3)
    # one step earlier: mean(1.5, 0.9, 0.5) = 0.967 > 0.6
    assert alarms.entropy_collapse(falling[:-1], baseline=3, window=3, frac=0.3) is None


def test_length_spike() -> None:
    lengths = [20, 22, 21, 50, 62, 63]  # baseline 21; recent mean(50, 62, 63) = 58.3 >= 57.6 and >= 31.5
    assert "58.3" in alarms.length_spike(lengths, baseline=3, window=3, max_new_tokens=64, frac=0.9, rise=1.5)
    near_limit = [60, 61, 62, 62, 63, 63]  # at the limit from the start: no rise over the baseline
    assert (
        alarms.length_spike(near_limit, baseline=3, window=3, max_new_tokens=64, frac=0.9, rise=1.5) is None
    )


def test_replies_converge_by_distinct_and_by_one_reply() -> None:
    kw = {"baseline": 3, "window": 3, "distinct_frac": 0.5, "top_share_max": 0.75}
    distinct = [0.8, 0.9, 0.7, 0.5, 0.4, 0.3]  # baseline 0.8, recent 0.4 <= 0.4
    flat_share = [0.25] * 6
    assert "Distinct-2 0.400" in alarms.replies_converge(distinct, flat_share, **kw)
    assert alarms.replies_converge([0.8, 0.9, 0.7, 0.6, 0.5, 0.45], flat_share, **kw) is None  # 0.517 > 0.4
    dominated = [0.25, 0.25, 0.25, 0.5, 0.75, 1.0]  # recent mean 0.75 >= 0.75, above its baseline 0.25
    assert "75%" in alarms.replies_converge([0.8] * 6, dominated, **kw)
    assert alarms.replies_converge([0.8] * 6, [0.25, 0.25, 0.25, 0.5, 0.5, 0.75], **kw) is None  # 0.583


def test_followed_by_hand() -> None:
    # baseline (0, 2): mean 1, variance 2; recent (4, 6): mean 5, variance 2 -> se sqrt(2/2 + 2/2) = 1.414
    assert alarms.followed([0.0, 2.0, 9.0, 4.0, 6.0], baseline=2, window=2) == pytest.approx(4 / math.sqrt(2))
    assert alarms.followed([0.0, 2.0, 4.0], baseline=2, window=2) is None  # not yet two disjoint windows
    assert alarms.followed([1.0, 1.0, 1.0, 1.0], baseline=2, window=2) == 0.0


def test_kl_drift_needs_a_rising_kl_and_a_reward_that_does_not_follow() -> None:
    kw = {"baseline": 2, "window": 2, "trend_window": 5, "kl_min": 0.05, "t_grow": 3.0, "follow_z": 3.0}
    kl = [0.01, 0.02, 0.04, 0.06, 0.08, 0.10]  # last 5: mean 0.06 >= 0.05, a perfect rise (t = inf)
    flat = [0.5, 0.4, 0.6, 0.4, 0.5, 0.4]  # baseline (0.5, 0.4), recent (0.5, 0.4): z = 0
    assert "0.06 on average" in alarms.kl_drift(kl, flat, **kw)
    # the reward follows: baseline (0.1, 0.2) mean .15 var .005, recent (0.9, 1.0) mean .95 var .005:
    # z = 0.8 / sqrt(.005) = 11.3 >= 3
    assert alarms.kl_drift(kl, [0.1, 0.2, 0.4, 0.6, 0.9, 1.0], **kw) is None
    assert alarms.kl_drift([0.0, 0.01, 0.02, 0.03, 0.04, 0.05], flat, **kw) is None  # mean 0.03 < kl_min
    assert alarms.kl_drift(kl[:4], flat[:4], **kw) is None  # fewer steps than the trend window


def test_entropy_blowup() -> None:
    rising = [2.0, 2.2, 1.8, 2.4, 2.6, 2.9]  # baseline 2.0; recent mean(2.4, 2.6, 2.9) = 2.633 >= 1.3 x 2
    assert "2.63" in alarms.entropy_blowup(rising, baseline=3, window=3, rise=1.3)
    assert alarms.entropy_blowup(rising[:-1], baseline=3, window=3, rise=1.3) is None  # 2.4 < 2.6


def test_sd_dominates() -> None:
    assert "3.33" in alarms.sd_dominates([0.5, 3.0, 3.0, 4.0], window=3, max_ratio=3.0)  # mean 3.333
    assert alarms.sd_dominates([5.0, 3.0, 2.0, 3.0], window=3, max_ratio=3.0) is None  # mean 2.667


def test_reward_oscillates_beyond_its_sampling_error_without_a_trend() -> None:
    kw = {"window": 6, "ratio": 2.0, "t_max": 2.0}
    swing = [0.2, 0.8, 0.2, 0.8, 0.2, 0.8]  # std 0.3286; slope 0.0857/step, t 0.88
    # sampling error: spread 0.2 over 16 samples -> 0.05; 0.3286 >= 2 x 0.05
    why = alarms.reward_oscillates(swing, [0.2] * 6, [16] * 6, **kw)
    assert why is not None and "6.6 x" in why
    # the same swings with a within-step spread of 1.0 (error 0.25): 0.3286 < 0.5, sampling noise
    assert alarms.reward_oscillates(swing, [1.0] * 6, [16] * 6, **kw) is None
    climbing = [0.1, 0.3, 0.2, 0.5, 0.4, 0.7]  # a clear trend: t = 4.2 >= 2
    assert alarms.reward_oscillates(climbing, [0.2] * 6, [16] * 6, **kw) is None


# ---------------------------------------------------------------------------- wired into the monitor


def sample(text: str, group: int = 0, rewrite: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(text=text, group=group, info={"rewrite": {"text": rewrite}} if rewrite else {})


def test_the_monitor_derives_the_pull_ratio_and_the_spread_key() -> None:
    assert pull_ratio({"sd/pull": 3.0, "pg/pull": 1.5}) == 2.0
    assert pull_ratio({"sd/pull": 3.0}) is None and pull_ratio({"sd/pull": 1.0, "pg/pull": 0.0}) is None
    assert (
        spread_key("reward/mean") == "reward/std"
        and spread_key("sim/emotion_delta") == "sim/emotion_delta_std"
    )


def test_an_alarm_names_step_metric_switch_and_replies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mon = RewardHackingMonitor(MonitorConfig(), 32, run_dir=tmp_path)
    steps = [
        (
            {"reply/distinct_2": 0.8, "reply/top_share": 0.25},
            [sample("How are you?"), sample("Tell me more.")],
        ),
        ({"reply/distinct_2": 0.8, "reply/top_share": 0.25}, [sample("What happened?"), sample("I see.")]),
        ({"reply/distinct_2": 0.8, "reply/top_share": 0.25}, [sample("That is hard."), sample("Go on.")]),
        ({"reply/distinct_2": 0.2, "reply/top_share": 1.0}, [sample("I'm sorry.")] * 2),
        ({"reply/distinct_2": 0.2, "reply/top_share": 1.0}, [sample("I'm sorry.")] * 2),
    ]
    with caplog.at_level(logging.WARNING, "rapo_echo.monitor"):
        rows = [mon.update(i + 1, m, s) for i, (m, s) in enumerate(steps)]
    # step 5: recent Distinct-2 mean(0.8, 0.2, 0.2) = 0.4 <= 0.5 x 0.8; step 4: 0.6 > 0.4, top share 0.5
    assert [r[PREFIX + "replies_converge"] for r in rows] == [0, 0, 0, 0, 1]
    [alarm] = [json.loads(x) for x in (tmp_path / ALARMS_FILE).read_text().splitlines()]
    assert alarm["step"] == 5 and alarm["alarm"] == "replies_converge"
    assert alarm["metric"] == "reply/distinct_2, reply/top_share" and "rollout.temperature" in alarm["switch"]
    assert alarm["samples"] == ["I'm sorry. (x2)"] and mon.fired == [alarm]
    [warning] = caplog.records
    assert "replies_converge at step 5" in warning.getMessage() and "I'm sorry." in warning.getMessage()
    mon.update(6, {"reply/distinct_2": 0.2, "reply/top_share": 1.0}, [sample("I'm sorry.")] * 2)
    assert mon.fired == []  # raised once


def test_every_signature_has_a_flag_and_the_alarms_a_spec() -> None:
    mon = RewardHackingMonitor(MonitorConfig(), 32)
    out = mon.update(1, {"reward/mean": 0.5})
    assert {PREFIX + s for s in SIGNATURES} <= set(out)
    assert set(alarms.ALARMS) <= set(SIGNATURES)


def test_stop_on_alarm_ends_the_run_with_a_checkpoint(
    tmp_path: Path, tiny_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An alarm that fires at step 2 stops a 4-step run after step 2 with a checkpoint to resume from."""
    from rapo_echo.training.run import Run

    monkeypatch.setattr(alarms, "sd_dominates", lambda series, **kw: "fired" if len(series) >= 2 else None)
    run = tmp_path / "run"
    cfg = run_config(
        tiny_folder, run, *SMALL, "train.max_steps=4", "train.stop_on_alarm=true", "monitor.reference_kl=true"
    )
    run_ = Run(cfg)
    run_.train()
    rows = metrics(run)
    assert run_.step == 2 and [r["step"] for r in rows] == [1, 2]
    assert run_.stopped_by == "monitor: alarm sd_dominates" and (run / "checkpoints" / "step-2").is_dir()
    assert json.loads((run / ALARMS_FILE).read_text())["step"] == 2
    assert "kl" in rows[0] and "reply/distinct_2" in rows[0]  # the KL to the reference without loss.beta


def test_replay_judges_a_finished_run_by_other_thresholds() -> None:
    from rapo_echo.monitor import replay

    rows = [
        {"step": s + 1, "entropy": e, "monitor/entropy_collapse": 0.0}
        for s, e in enumerate([2.0, 2.0, 2.0, 1.0, 0.5, 0.4])
    ]
    # recent means 1.667, 1.167, 0.633: <= 0.3 x 2.0 = 0.6 never; <= 0.5 x 2.0 = 1.0 from step 6
    assert replay(rows, MonitorConfig(), 32) == {}
    assert replay(rows, MonitorConfig(entropy_frac=0.5), 32) == {"entropy_collapse": 6}


def test_a_constant_reward_does_not_oscillate() -> None:
    # the long-run study's converged runs: every reply rated alike, so each step's mean is 0.5 with no
    # spread (noise 0) and std 0: 0 is not >= 2 x 0, it is no swing at all
    kw = {"window": 6, "ratio": 2.0, "t_max": 2.0}
    assert alarms.reward_oscillates([0.5] * 6, [0.0] * 6, [8] * 6, **kw) is None
