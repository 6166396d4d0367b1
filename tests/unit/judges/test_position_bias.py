"""Position and instruction bias of the comparing judges (rapo_echo/judges/bias.py): the tally and its
per-step metrics by hand, the run's figure weighted by decisions, the merge of several judges, and the run
report's table."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rapo_echo.benchmarks.training_report import judge_bias_table
from rapo_echo.judges.bias import (
    InjectionProbe,
    PositionBias,
    first_rank_share,
    merge_metrics,
    run_first_share,
    run_injection_shift,
)

P = "judge/position_bias/"


def test_first_share_by_hand() -> None:
    bias = PositionBias()
    for share in (1.0, 1.0, 0.5, 0.0):  # A, A, tie, B
        bias.add(share, 0.5)
    # (1 + 1 + 0.5 + 0) / 4 = 0.625
    assert bias.step_metrics() == {P + "first_share": 0.625, P + "chance": 0.5, P + "n": 4.0}
    assert bias.first_share == 0.625 and not bias.biased(0.7) and bias.biased(0.6)
    bias.add(first_rank_share([2.0, 1.0, 3.0], first=1), 1 / 3)  # the first-shown (index 1) took rank 1
    bias.add(first_rank_share([1.5, 1.5, 3.0], first=0), 1 / 3)  # it shared rank 1 with one other: 1/2
    bias.add(first_rank_share([1.0, 2.0, 3.0], first=2), 1 / 3)  # it came last
    assert bias.step_metrics() == pytest.approx({P + "first_share": 0.5, P + "chance": 1 / 3, P + "n": 3.0})
    assert bias.step_metrics() == {}


def test_always_b_is_as_biased_as_always_a() -> None:
    bias = PositionBias()
    for _ in range(10):
        bias.add(0.0, 0.5)
    assert bias.biased(0.6) and bias.both_orders("auto", auto_probe=5, auto_threshold=0.6)
    assert not bias.both_orders("random", 5, 0.6) and bias.both_orders("both", 5, 0.6)


def test_merge_and_run_figures_weight_by_decisions() -> None:
    merged = merge_metrics(
        [
            {P + "first_share": 1.0, P + "chance": 0.5, P + "n": 2.0},
            {P + "first_share": 0.25, P + "chance": 0.25, P + "n": 6.0},
            {},
        ]
    )
    # (1 x 2 + 0.25 x 6) / 8 = 0.4375; chance (0.5 x 2 + 0.25 x 6) / 8 = 0.3125
    assert merged == pytest.approx({P + "first_share": 0.4375, P + "chance": 0.3125, P + "n": 8.0})
    rows = [
        {"step": 1, P + "first_share": 0.75, P + "chance": 0.5, P + "n": 4.0},
        {"step": 2},
        {"step": 3, P + "first_share": 0.5, P + "chance": 0.5, P + "n": 12.0},
        {"step": 4, P + "first_share": float("nan"), P + "chance": 0.5, P + "n": 3.0},  # ignored
    ]
    # (0.75 x 4 + 0.5 x 12) / 16 = 0.5625
    assert run_first_share(rows) == (pytest.approx(0.5625), pytest.approx(0.5), 16)
    assert run_first_share([{"step": 1}]) is None
    probe = InjectionProbe(3)
    probe.add(0.5)
    probe.add(-0.1)
    assert probe.remaining == 1
    shown = probe.step_metrics()
    assert shown["judge/injection_bias/shift"] == pytest.approx(0.2) and shown["judge/injection_bias/n"] == 2
    assert run_injection_shift([{"judge/injection_bias/shift": 0.2, "judge/injection_bias/n": 2.0}]) == (
        pytest.approx(0.2),
        2,
    )


def test_report_table_shows_each_runs_bias() -> None:
    runs = [
        SimpleNamespace(
            path=Path("run_a"),
            rows=[
                {"step": 1, P + "first_share": 0.9, P + "chance": 0.5, P + "n": 10.0},
                {"step": 1, "judge/injection_bias/shift": 0.25, "judge/injection_bias/n": 8.0},
            ],
        ),
        SimpleNamespace(path=Path("run_b"), rows=[{"step": 1, "reward/mean": 0.5}]),
    ]
    header, rows = judge_bias_table(runs)  # type: ignore[misc]  # a table of two parts
    assert header[0] == "run" and rows == [["run_a", "0.900 (chance 0.500, n 10)", "+0.250 (n 8)"]]
    assert judge_bias_table(runs[1:]) is None


def test_merge_keeps_the_injection_shift() -> None:
    """The trainer merges every judge's step metrics through merge_metrics: the injection probe's shift
    must survive it (it had been dropped, so no run showed judge/injection_bias/*)."""
    inj = "judge/injection_bias/"
    merged = merge_metrics(
        [
            {P + "first_share": 1.0, P + "chance": 0.5, P + "n": 8.0, inj + "shift": 0.2, inj + "n": 2.0},
            {inj + "shift": -0.1, inj + "n": 1.0},
        ]
    )
    # (0.2 x 2 - 0.1 x 1) / 3 = 0.1
    assert merged[inj + "shift"] == pytest.approx(0.1) and merged[inj + "n"] == 3.0
    assert merged[P + "first_share"] == 1.0
