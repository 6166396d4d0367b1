"""Figures with their uncertainty: the mean over repeats, the spread across repeats and the bootstrap
interval over cases (repeats of one case move together), by hand; and each benchmark's figures agree
with its own summary."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rapo_echo.benchmarks.epm.run import summarize_epm
from rapo_echo.benchmarks.epm.vectors import INDEX_KEYS
from rapo_echo.benchmarks.figures import (
    CaseGrid,
    Figure,
    aggregate,
    by_repeat,
    figures_of,
    mean_metrics,
    run_figures,
)
from rapo_echo.benchmarks.runner import get_benchmark
from rapo_echo.benchmarks.sage.run import summarize_outcomes
from rapo_echo.benchmarks.sotopia.evaluator import DIMENSIONS


def rec(case: str, repeat: int, valid: bool = True, **metrics) -> dict:
    r = {"id": case if repeat == 0 else f"{case}#r{repeat}", "valid": valid, "metrics": metrics, "info": {}}
    if repeat:
        r.update(case=case, repeat=repeat)
    return r


RECORDS = [
    rec("a", 0, success=1.0, score=80.0),
    rec("b", 0, success=0.0, score=20.0),
    rec("c", 0, success=1.0, score=50.0),
    rec("a", 1, success=1.0, score=70.0),
    rec("b", 1, success=1.0, score=40.0),
    rec("c", 1, valid=False),
]


def test_mean_spread_and_counts_by_hand():
    out = run_figures(
        RECORDS,
        {"rate": Figure("success"), "n": Figure("success", count=True), "score": Figure("score")},
    )
    # repeat 0: 2 of 3 succeed, score (80 + 20 + 50) / 3 = 50; repeat 1 (c invalid): 2 of 2, score 55
    assert out["rate"]["repeats"] == pytest.approx([2 / 3, 1.0])
    assert out["rate"]["mean"] == pytest.approx(5 / 6)
    assert out["n"]["repeats"] == [2.0, 2.0] and out["n"]["mean"] == 2.0 and out["n"]["sd"] == 0.0
    assert out["score"]["repeats"] == pytest.approx([50.0, 55.0])
    assert out["score"]["mean"] == pytest.approx(52.5)
    assert out["score"]["sd"] == pytest.approx(np.std([50.0, 55.0], ddof=1))
    assert (out["score"]["min"], out["score"]["max"]) == (50.0, 55.0)
    assert out["score"]["cases"] == 3
    assert out["score"]["lo"] <= out["score"]["mean"] <= out["score"]["hi"]


def test_one_repeat_has_no_spread_and_one_case_no_interval():
    out = run_figures(RECORDS[:3], {"score": Figure("score")})["score"]
    assert out["sd"] is None and out["min"] is None and out["repeats"] == [50.0]
    single = run_figures(RECORDS[:1], {"score": Figure("score")})["score"]
    assert single["mean"] == 80.0 and single["lo"] is None and single["hi"] is None


def test_the_repeats_of_a_case_are_resampled_together():
    # two cases, each the same in both repeats: case x always 1, case y always 0. Resampling cases gives
    # means 0, 0.5 or 1 only; resampling rows independently would give 0.25 and 0.75 too
    records = [rec("x", 0, s=1.0), rec("y", 0, s=0.0), rec("x", 1, s=1.0), rec("y", 1, s=0.0)]
    grid = CaseGrid(records)
    values = grid.values(Figure("s"))
    assert values.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    weights = np.array([[2.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    per_repeat = aggregate(weights, values, count=False)
    assert per_repeat.tolist() == [[1.0, 1.0], [0.5, 0.5], [0.0, 0.0]]
    out = run_figures(records, {"s": Figure("s")})["s"]
    assert (out["lo"], out["hi"]) == (0.0, 1.0) and out["mean"] == 0.5


def test_where_limits_the_records_and_invalid_or_missing_values_are_left_out():
    records = [rec("a", 0, goal=8.0), rec("b", 0, goal=2.0), rec("c", 0, valid=False, goal=0.0)]
    records[0]["info"]["hard"] = True
    out = run_figures(records, {"hard": Figure("goal", where=lambda r: bool(r["info"].get("hard")))})
    assert out["hard"]["mean"] == 8.0 and out["hard"]["cases"] == 1
    assert run_figures(records, {"none": Figure("missing")}) == {}


def test_mean_metrics_of_repeats():
    merged = mean_metrics(
        [{"score": 50, "n": 2, "name": "x", "gone": None}, {"score": 55.0, "n": 3, "gone": 1}]
    )
    assert merged == {"score": 52.5, "n": 2.5, "name": "x", "gone": 1}
    assert mean_metrics([{"a": 1}]) == {"a": 1}
    assert by_repeat(RECORDS).keys() == {0, 1}


def test_judge_figures_appear_with_rechecks():
    records = [rec("a", 0, success=1.0), rec("b", 0, success=0.0)]
    sage = get_benchmark("sage")
    assert "judge/self_agreement" not in figures_of(sage, records)
    records[0]["info"]["judge_recheck"] = {"agree": 1.0, "abs_diff": 0.0}
    records[1]["info"]["judge_recheck"] = {"agree": 0.0, "abs_diff": 5.0}
    out = run_figures(records, figures_of(sage, records))
    assert out["judge/self_agreement"]["mean"] == 0.5 and out["judge/abs_diff"]["mean"] == 2.5
    assert out["judge/rechecks"]["mean"] == 2.0


def _means(benchmark: str, records: list[dict]) -> dict:
    b = get_benchmark(benchmark)
    return {k: v["mean"] for k, v in run_figures(records, b.figures).items()}


def test_each_benchmarks_figures_are_its_summary():
    rng = random.Random(0)
    sage = [
        rec(f"s{i}", 0, final_emotion=float(e), success=float(e >= 100), failure=float(e < 10), turns=t)
        for i, (e, t) in enumerate([(100, 3), (5, 4), (55, 10), (70, 10)])
    ]
    summary = summarize_outcomes(sage)
    for key, value in _means("sage", sage).items():
        assert value == pytest.approx(summary[key]), key

    esconv = [rec(f"e{i}", 0, success=float(i % 2), turns=i + 1, final_reward=0.5 - i / 4) for i in range(4)]
    summary = get_benchmark("esconv").summarize(esconv)
    assert _means("esconv", esconv) == pytest.approx(summary)

    sotopia = []
    for i in range(4):
        scores = {d: float(rng.randint(lo, hi)) for d, (lo, hi) in DIMENSIONS.items()}
        r = rec(f"t{i}", 0, **scores, overall=sum(scores.values()) / 7, turns=4)
        r["info"] = {"hard": i < 2, "turns": 4, "policy_actions": 2, "policy_loose_actions": 0}
        sotopia.append(r)
    summary = get_benchmark("sotopia").summarize(sotopia)
    for key, value in _means("sotopia", sotopia).items():
        assert value == pytest.approx(summary[key]), key

    epm = []
    for i in range(5):
        r = rec(
            f"m{i}", 0, success=float(i % 2), turns=10 + i, **{k: rng.uniform(0, 120) for k in INDEX_KEYS}
        )
        r["info"] = {"epmq_weights": [0.5, 0.2, 0.3], "end": "timeout"}
        epm.append(r)
    summary = summarize_epm(epm)
    means = _means("epm", epm)
    assert {"epmq", "outcome", "efficiency", "stability", "success_rate", "avg_turns"} <= set(means)
    for key, value in means.items():
        assert value == pytest.approx(summary[key]), key
