"""Paired comparisons of every figure (by hand) and ``rapo-echo compare`` on scripted SAGE runs: the
table, the refusal of runs measured differently and the flag that shows them anyway."""

from __future__ import annotations

import numpy as np
import pytest

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.figures import Figure
from rapo_echo.benchmarks.paired import MCNEMAR, WILCOXON, case_means, paired_figure
from rapo_echo.benchmarks.runner import get_benchmark, run_eval
from rapo_echo.benchmarks.stats import resample_weights
from rapo_echo.cli import main
from rapo_echo.engines.scripted import ScriptedEngine
from tests.unit.benchmarks.test_bench_sage import hashing_simulator, profiles_file, row


def rec(case: str, repeat: int = 0, **metrics) -> dict:
    r = {"id": case if repeat == 0 else f"{case}#r{repeat}", "valid": True, "metrics": metrics}
    if repeat:
        r.update(case=case, repeat=repeat)
    return r


def test_a_continuous_figure_by_hand():
    base = [rec(c, x=v) for c, v in zip("abcd", (10, 20, 30, 40))]
    other = [rec(c, x=v) for c, v in zip("abcde", (15, 18, 38, 44, 99))]
    c = paired_figure("x", Figure("x"), base, other)
    # shared a-d, differences 5, -2, 8, 4: mean 3.75. Ranks of |d|: 2->1, 4->2, 5->3, 8->4; W+ 9, W- 1.
    # Of the 16 sign patterns of ranks 1..4, W+ >= 9 in two ({2,3,4}, {1,2,3,4}): p = 2 * 2/16
    assert (c.n, c.baseline, c.other, c.difference) == (4, 25.0, 28.75, 3.75)
    assert c.p == pytest.approx(0.25) and c.test == WILCOXON
    w = resample_weights(4)
    boots = w @ np.array([5.0, -2.0, 8.0, 4.0]) / 4
    assert c.interval == pytest.approx(tuple(np.percentile(boots, [2.5, 97.5])))


def test_a_case_with_repeats_counts_once_with_its_mean():
    records = [rec("a", 0, x=1.0), rec("a", 1, x=0.0), rec("b", 0, x=1.0), rec("b", 1, x=1.0)]
    assert case_means(records, Figure("x")) == ({"a": 0.5, "b": 1.0}, False)
    # success with repeats is a rate per case: the Wilcoxon test, not McNemar
    other = [rec("a", 0, x=0.0), rec("a", 1, x=0.0), rec("b", 0, x=0.0), rec("b", 1, x=0.0)]
    c = paired_figure("x", Figure("x"), records, other)
    assert c.test == WILCOXON and c.difference == pytest.approx(-0.75)


def test_a_binary_figure_with_one_repeat_keeps_mcnemar():
    base = [rec(c, s=v) for c, v in zip("abc", (1.0, 1.0, 1.0))]
    other = [rec(c, s=v) for c, v in zip("abc", (0.0, 0.0, 0.0))]
    c = paired_figure("s", Figure("s"), base, other)
    assert c.test == MCNEMAR and c.p == pytest.approx(0.25) and c.interval == pytest.approx((-1.0, -1.0))
    assert paired_figure("s", Figure("s"), base, [rec("z", s=1.0)]) is None


def sage(tmp_path, out, reply: str, **settings) -> str:
    data = profiles_file(tmp_path, [row(f"p{i}", "0") for i in range(6)])
    policy = ScriptedEngine(fn=lambda p: f"{reply}: {p[-1]['content'][:12]}")
    run_eval(
        get_benchmark("sage"),
        Roles(policy, hashing_simulator()),
        EvalSettings(**settings),
        tmp_path / out,
        data=data,
        models={"policy": reply, "simulator": "scripted"},
    )
    return str(tmp_path / out)


def test_compare_prints_every_figure_with_its_interval_and_p(tmp_path, capsys):
    a, b = sage(tmp_path, "a", "I hear you", repeats=2), sage(tmp_path, "b", "Tell me more", repeats=2)
    assert main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    lines = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert set(lines) >= {"figure", "SAGE score", "success rate", "failure rate", "avg turns"}
    for figure in ("SAGE score", "success rate"):  # success is a rate per case over its two repeats
        cells = [c.strip() for c in lines[figure].split("|")[1:-1]]
        assert cells[1] == "6" and cells[5].startswith("[") and float(cells[6]) <= 1.0
        assert cells[7] == WILCOXON
    assert "Wilcoxon signed-rank test" in out and "judge self-agreement" in out and "rechecks)" in out


def test_compare_refuses_runs_measured_differently_and_shows_them_marked(tmp_path, capsys):
    cold = sage(tmp_path, "cold", "I hear you")
    warm = sage(tmp_path, "warm", "I hear you", simulator_temperature=0.7)
    assert main(["compare", cold, warm]) == 2
    err = capsys.readouterr().err
    assert "sampling.simulator.temperature: 0.0 vs 0.7" in err and "--show-incomparable" in err
    assert main(["compare", cold, warm, "--show-incomparable"]) == 0
    out = capsys.readouterr().out
    assert "NOT COMPARABLE" in out and "sampling.simulator.temperature: 0.0 vs 0.7" in out
    assert "| SAGE score |" in out


def test_report_leaves_out_runs_measured_differently_and_shows_them_marked(tmp_path):
    from rapo_echo.benchmarks.report import build_report

    root = tmp_path / "runs"
    sage(tmp_path, "runs/cold", "I hear you", repeats=2)
    sage(tmp_path, "runs/warm", "Tell me more", repeats=2, simulator_temperature=0.7)
    sage(tmp_path, "runs/cold-b", "Tell me more", repeats=2)
    html_path, md_path = build_report([root], tmp_path / "rep")
    md = md_path.read_text()
    assert "| Tell me more [cold-b] |" in md and "| I hear you |" in md
    assert "Tell me more [warm]" in md and "left out of the comparison" in md
    assert "sampling.simulator.temperature: 0.0 vs 0.7" in md
    table = md.split("\n\n")[2]  # the SAGE comparison table: the runs measured alike only
    assert "[warm]" not in table and "[cold-b]" in table
    assert "SAGE score" in table and table.count(" [") >= 3  # every cell with its interval
    assert "Paired comparison" in md and "| sage | Tell me more [cold-b] | I hear you | SAGE score |" in md
    assert "| sage | I hear you | 0.417 [0.250, 0.500] | 7.500 | 6 |" in md  # judge consistency; a count
    page = html_path.read_text()
    assert "sampling.simulator.temperature: 0.0 vs 0.7" in page and "benchmark card" in page
    assert "<h2>sage — Tell me more [warm]</h2>" in page  # not compared, but shown on its own
    assert "95% interval" in page and "sd across repeats" in page and "Judge consistency" in page

    html_path, md_path = build_report([root], tmp_path / "shown", show_incomparable=True)
    md = md_path.read_text()
    assert "| Tell me more [warm] [card differs] |" in md and "shown as asked (--show-incomparable)" in md
    assert "card differs: sampling.simulator.temperature" in html_path.read_text()
    assert main(["report", str(root), "--output", str(tmp_path / "cli"), "--show-incomparable"]) == 0
