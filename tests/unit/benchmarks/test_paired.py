"""Paired comparison of per-case success: the exact McNemar test and the paired difference, by hand."""

from __future__ import annotations

import math

import pytest

from rapo_echo.benchmarks.paired import PairedSuccess, mcnemar_exact_p, paired_success


@pytest.mark.parametrize(
    ("wins", "losses", "p"),
    [
        (0, 0, 1.0),  # no discordant case
        (0, 3, 2 * 1 / 8),  # P(X <= 0 | n=3) = 1/8
        (4, 1, 2 * (1 + 5) / 32),  # P(X <= 1 | n=5) = (C(5,0) + C(5,1)) / 2^5
        (3, 3, 1.0),  # 2 * 42/64 > 1
        (0, 6, 2 / 64),
        (2, 10, 2 * (1 + 12 + 66) / 4096),
    ],
)
def test_exact_mcnemar_by_hand(wins, losses, p):
    assert mcnemar_exact_p(wins, losses) == pytest.approx(p)
    assert mcnemar_exact_p(losses, wins) == pytest.approx(p)  # two-sided


def test_negative_counts_are_refused():
    with pytest.raises(ValueError, match="counts"):
        mcnemar_exact_p(-1, 2)


def test_difference_and_interval_by_hand():
    c = PairedSuccess(n=16, baseline_successes=15, successes=12, wins=0, losses=3)
    assert c.difference == pytest.approx(-3 / 16)
    # se = sqrt(0 + 3 - (0 - 3)^2 / 16) / 16 = sqrt(39/16) / 16
    se = math.sqrt(39 / 16) / 16
    lo, hi = c.interval
    assert se == pytest.approx(0.0975781, abs=1e-6)
    assert lo == pytest.approx(-0.1875 - 1.959964 * se) and hi == pytest.approx(-0.1875 + 1.959964 * se)
    assert (lo, hi) == pytest.approx((-0.378749, 0.003749), abs=1e-5)
    assert c.p == pytest.approx(0.25)
    # all discordant cases one way: no spread left, the interval closes on the difference
    d = PairedSuccess(n=3, baseline_successes=3, successes=0, wins=0, losses=3)
    assert d.interval == pytest.approx((-1.0, -1.0))


def rec(case_id: str, success: float | None, valid: bool = True) -> dict:
    metrics = {} if success is None else {"success": success, "turns": 3}
    return {"id": case_id, "valid": valid, "metrics": metrics}


def test_cases_are_paired_by_id_and_invalid_or_missing_ones_left_out():
    baseline = [rec("a", 1.0), rec("b", 1.0), rec("c", 0.0), rec("d", 1.0, valid=False), rec("e", 1.0)]
    other = [rec("b", 0.0), rec("a", 1.0), rec("c", 1.0), rec("d", 0.0), rec("f", 1.0)]
    c = paired_success(baseline, other)
    # paired: a (1, 1), b (1, 0), c (0, 1); d invalid in the baseline, e and f in one only
    assert c == PairedSuccess(n=3, baseline_successes=2, successes=2, wins=1, losses=1)
    assert c.difference == 0.0 and c.p == 1.0
    assert paired_success(baseline, [rec("z", 1.0)]) is None
    assert paired_success([rec("a", None)], [rec("a", 1.0)]) is None  # no success metric
