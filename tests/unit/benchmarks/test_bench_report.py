"""``rapo-echo report``: discovery, the comparison table, plots, escaping, self-containment, and a
screenshot of the page in headless Chromium (skipped where Chromium is not installed, except on CI)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.plots import curve_keys
from rapo_echo.benchmarks.report import (
    EvalResult,
    build_report,
    comparison_table,
    discover,
    markdown_table,
    paired_table,
    render_html,
)
from rapo_echo.benchmarks.runner import get_benchmark, run_eval
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.errors import DataError
from tests.helpers.answers import SOTOPIA_SCORES, sotopia_rules
from tests.helpers.data_files import esconv_file

SCORES = SOTOPIA_SCORES
LOW = {
    "believability": 2,
    "relationship": -2,
    "knowledge": 1,
    "secret": -5,
    "social_rules": -3,
    "financial_and_material_benefits": 0,
    "goal": 1,
}


@pytest.fixture
def results(tmp_path) -> Path:
    """Evals of two policies on all three benchmarks plus one training run, under one folder."""
    root = tmp_path / "results"
    data = esconv_file(tmp_path)
    for policy, reply, scores in (
        ("policy-a", "I am <script>alert(1)</script> sorry.", SCORES),
        ("policy-b", "Tell me more.", LOW),
    ):
        engine = ScriptedEngine(default=reply)
        speaker = ScriptedEngine(default='{"action_type": "speak", "argument": "Hello."}')
        models = {"policy": policy}
        run_eval(
            get_benchmark("esconv-ref"),
            Roles(engine),
            EvalSettings(),
            root / f"{policy}-ref",
            data=data,
            models=models,
        )
        critic = ScriptedEngine(default="better" if policy == "policy-b" else "solved")
        run_eval(
            get_benchmark("esconv"),
            Roles(engine, ScriptedEngine(default="ok"), critic),
            EvalSettings(max_turns=2),
            root / f"{policy}-esconv",
            data=data,
            models=models,
        )
        run_eval(
            get_benchmark("sotopia"),
            Roles(speaker, speaker, ScriptedEngine(rules=sotopia_rules(scores))),
            EvalSettings(max_turns=2),
            root / f"{policy}-sotopia",
            limit=4,
            models=models,
        )
    run = root / "run1"
    run.mkdir()
    rows = [
        {
            "step": s,
            "reward/mean": 0.1 * s,
            "loss/total": 1.0 / s,
            "kl": 0.01 * s,
            "time/rollout": 2.0,
            "note": "x",
        }
        for s in range(1, 6)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_discover_and_comparison_table(results):
    evals, runs = discover([results])
    assert len(evals) == 6 and [r.path.name for r in runs] == ["run1"]
    header, rows = comparison_table(evals)
    assert header[:5] == ["policy", "ESConv SR", "ESConv AT", "esconv valid/n", "BLEU-1"]
    assert "ESConv SR" in header and "SOTOPIA goal" in header and "sotopia valid/n" in header
    by_policy = {row[0]: dict(zip(header, row)) for row in rows}
    assert set(by_policy) == {"policy-a", "policy-b"}
    # each figure with its 95% interval over cases (every case alike here: the interval closes on the mean)
    assert by_policy["policy-a"]["ESConv SR"] == "1.000 [1.000, 1.000]"
    assert by_policy["policy-b"]["ESConv SR"] == "0.000 [0.000, 0.000]"
    assert by_policy["policy-a"]["ESConv AT"] == "1.000 [1.000, 1.000]"
    assert by_policy["policy-b"]["ESConv AT"] == "2.000 [2.000, 2.000]"
    assert by_policy["policy-a"]["SOTOPIA goal"].startswith("7.000 [")
    assert by_policy["policy-b"]["SOTOPIA goal"].startswith("1.000 [")
    assert by_policy["policy-a"]["sotopia valid/n"] == "4/4"
    assert by_policy["policy-a"]["BLEU-1"].count("[") == 0  # a corpus figure: no interval over cases
    md = markdown_table(header, rows)
    assert md.startswith("| policy | ESConv SR |") and md.count("\n") == 4


def test_report_page_is_self_contained_and_escaped(results, tmp_path):
    html_path, md_path = build_report([results], tmp_path / "rep", max_transcripts=2, title="My <report>")
    page = html_path.read_text()
    assert "<script" not in page.lower().replace("&lt;script", "")  # the model's "<script>" is escaped
    assert "I am &lt;script&gt;alert(1)&lt;/script&gt; sorry." in page
    assert not re.search(r"(src|href)=[\"']?(https?:)?//", page)  # nothing loaded from elsewhere
    assert "<title>My &lt;report&gt;</title>" in page
    # sotopia dims, esconv (a rate and a turn count: two charts), esconv-ref, training curves
    assert page.count('src="data:image/png;base64,') >= 5
    assert 'alt="esconv rate (0-1)"' in page and 'alt="esconv turns"' in page
    # per evaluation its benchmark card, then two transcripts
    assert page.count("<summary>benchmark card</summary>") == 6
    assert page.count("<details>") == 6 * 3 and "Transcripts (2 of 4)" in page
    assert "critic: turn 1: 1.000 (solved)" in page and "evaluator: believability: 8" in page
    md = md_path.read_text()
    # one comparison table per benchmark, each under its name
    assert md.startswith("# My <report>\n\n**esconv**\n\n| policy | ESConv SR | ESConv AT | esconv valid/n |")
    assert "**sotopia**\n\n| policy | SOTOPIA goal |" in md and "policy-b" in md


def test_training_curve_keys_come_first_then_sorted():
    rows = [
        {
            "step": 1,
            "kl": 0.1,
            "loss/total": 1.0,
            "note": "x",
            "reward/mean": 0.5,
            "invalid": 0,
            "bad": float("nan"),
        }
    ]
    # the priority order first (kl before invalid), bookkeeping keys and non-numbers left out
    rows[0]["lr"] = 1e-5
    rows[0]["zeta"] = 2.0
    assert curve_keys(rows) == ["reward/mean", "loss/total", "kl", "invalid", "zeta"]


def test_a_run_folder_alone_and_a_folder_with_nothing(tmp_path, results):
    html_path, md_path = build_report([results / "run1"], tmp_path / "only-run")
    assert "Training curves" in html_path.read_text()
    assert "| run1 | 5 | 0.1 → 0.5 |" in md_path.read_text()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no eval results"):
        build_report([tmp_path / "empty"], tmp_path / "x")


def test_same_policy_twice_on_one_benchmark_gets_folder_names(results, tmp_path):
    shutil.copytree(results / "policy-a-ref", tmp_path / "again")
    evals, _ = discover([results / "policy-a-ref", tmp_path / "again"])
    assert [e.label for e in evals] == ["policy-a [policy-a-ref]", "policy-a [again]"]


def headless(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium in a 1280 x 2000 window, with its own profile folder and no background traffic."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--window-size=1280,2000"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
    cmd = [chromium, *flags, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_report_renders_in_headless_chromium(results, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        if os.environ.get("CI") == "true":  # .ci/run installs it: on CI the check must run, not skip
            pytest.fail("headless Chromium is not installed on CI (.ci/run installs it with apt-get as root)")
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    html_path, _ = build_report([results], tmp_path / "rep")
    shot = tmp_path / "report.png"
    proc = headless(chromium, tmp_path / "chrome", f"--screenshot={shot}", html_path.resolve().as_uri())
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1280, 2000)
    # a rendered page is not blank: a blank screenshot compresses to a few kB
    assert len(png) > 50_000
    # as laid out at 1280 px: nothing wider than the window, and every comparison table fits its box; also
    # with five benchmarks of six headline metrics each (one table of 36 columns before)
    wide = tmp_path / "wide.html"
    wide.write_text(render_html(many_benchmarks(), [], title="wide", max_transcripts=0))
    for page in (html_path, wide):
        layout = measure_layout(chromium, page, tmp_path)
        assert layout["page"] <= layout["window"] == 1280, layout
        assert layout["comparison"] and all(w <= box for w, box in layout["comparison"]), layout
        assert all(w <= layout["window"] for w in layout["images"]), layout


def many_benchmarks() -> list[EvalResult]:
    """Three policies with long names on five benchmarks of six headline metrics each."""
    evals = []
    for b in range(5):
        headline = [[f"metric_{k}", f"benchmark {b} metric {k}"] for k in range(6)]
        for p in range(3):
            summary = {
                "benchmark": f"bench-{b}",
                "headline": headline,
                "metrics": {f"metric_{k}": 0.1 * k + p for k in range(6)},
                "n_valid": 8,
                "n_cases": 8,
                "models": {"policy": f"runs/a-rather-long-policy-name-{p}/final"},
                "data": "bundled",
            }
            evals.append(EvalResult(Path(f"/tmp/eval-{b}-{p}"), summary, [], summary["models"]["policy"]))
    return evals


MEASURE = """<script>
const comparison = [];
const first = document.querySelector("h2");  // the Comparison section: up to the next h2
for (let el = first && first.nextElementSibling; el && el.tagName !== "H2"; el = el.nextElementSibling) {
  if (el.classList.contains("wide")) comparison.push([el.scrollWidth, el.clientWidth]);
}
document.title = JSON.stringify({
  window: window.innerWidth,
  page: document.documentElement.scrollWidth,
  comparison,
  images: [...document.images].map(i => Math.ceil(i.getBoundingClientRect().right)),
});
</script>"""


def measure_layout(chromium: str, html_path: Path, tmp_path: Path) -> dict:
    """The page's layout in headless Chromium at 1280 px: a copy of the report with a script that writes
    the widths into its title, read back from the DOM Chromium dumps."""
    probe = tmp_path / "probe.html"
    probe.write_text(html_path.read_text().replace("</body>", MEASURE + "</body>"))
    proc = headless(chromium, tmp_path / "chrome-dom", "--dump-dom", probe.resolve().as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    title = re.search(r"<title>(.*?)</title>", proc.stdout, flags=re.S)
    assert title is not None, proc.stdout[:500]
    import html as html_lib

    return json.loads(html_lib.unescape(title.group(1)))


def test_training_run_samples_show_reactions_and_critiques(tmp_path):
    from rapo_echo.benchmarks.training_report import read_samples, samples_html

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "reward/mean": 0.5, "sim/emotion_delta": 1.5}) + "\n"
    )
    rows = [
        {
            "step": 1,
            "scenario": "s0",
            "group": 0,
            "prompt": [{"role": "user", "content": "I lost my job <today>"}],
            "reply": r,
            "reward": w,
            "advantage": w - 0.5,
            "critique": f"critique {i}",
            "info": {"rank": i + 1, "reaction": {"message": f"reaction {i}", "emotion_delta": 2.0 - i}},
        }
        for i, (r, w) in enumerate([("That is hard.", 1.0), ("Move on.", 0.0)])
    ]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    got = read_samples(run)
    assert len(got) == 2
    page = samples_html(got)
    assert "I lost my job &lt;today&gt;" in page and "reaction 0 (emotion +2.0)" in page
    assert page.index("That is hard.") < page.index("Move on.") and "critique 1" in page
    html_path, md_path = build_report([run], tmp_path / "rep")
    assert (
        "emotion change (first → last)" in md_path.read_text() and "Samples of run" in html_path.read_text()
    )


def test_paired_comparison_against_the_first_folder_or_the_named_baseline(results, tmp_path):
    evals, _ = discover([results])
    _, rows = paired_table(evals)
    # ESConv only (SOTOPIA and the reference benchmark have no per-case success); policy-a's critic said
    # "solved" on all three cases, policy-b's only "better" (0.5, not above the threshold)
    sr = [r for r in rows if r[3] == "ESConv SR"]
    assert sr == [
        ["esconv", "policy-b", "policy-a", "ESConv SR", "3", "1.000", "0.000", "-1.000 [-1.000, -1.000]"]
        + ["0.250", "exact McNemar: 0 only policy, 3 only baseline"]
    ]
    # every other figure too: ESConv's turns and final reward, SOTOPIA's dimensions (Wilcoxon); esconv-ref's
    # corpus scores have no per-case figure
    figures = {(r[0], r[3]) for r in rows}
    assert ("esconv", "ESConv AT") in figures and ("sotopia", "SOTOPIA goal") in figures
    assert not any(r[0] == "esconv-ref" for r in rows)
    goal = next(r for r in rows if r[3] == "SOTOPIA goal")
    assert goal[5:7] == ["7.000", "1.000"] and goal[9] == "Wilcoxon signed-rank"
    _, rows = paired_table(evals, baseline="policy-b")
    assert [r[1:3] + r[9:] for r in rows if r[3] == "ESConv SR"] == [
        ["policy-a", "policy-b", "exact McNemar: 3 only policy, 0 only baseline"]
    ]
    assert paired_table(evals, baseline=str(results / "policy-b-esconv"))[1][0][1] == "policy-a"
    with pytest.raises(DataError, match="--baseline nobody"):
        paired_table(evals, baseline="nobody")
    html_path, md_path = build_report([results], tmp_path / "rep", baseline="policy-a")
    assert "<h2>Paired comparison</h2>" in html_path.read_text()
    assert "exact McNemar" in md_path.read_text() and "Wilcoxon signed-rank" in md_path.read_text()


def test_a_zero_rate_is_drawn_on_a_zero_to_one_axis():
    """An ESConv success rate of 0 was drawn on a -0.04..0.04 axis: the panel looked empty (issue 49)."""
    from rapo_echo.benchmarks.plots import bars_figure, metric_unit, pyplot

    fig = bars_figure("esconv", ["success rate"], {"policy": [0.0]}, ylabel=metric_unit("success_rate"))
    ax = fig.axes[0]
    assert ax.get_ylim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.texts] == ["0"]  # the bar says its value
    pyplot().close(fig)
    zeros = bars_figure("sage", ["score"], {"a": [0.0], "b": [0.0]}, ylabel="score")
    assert zeros.axes[0].get_ylim() == (0.0, 1.0)
    pyplot().close(zeros)
    scores = bars_figure("sage", ["score"], {"a": [30.0], "b": [None]}, ylabel="score")
    assert scores.axes[0].get_ylim()[1] > 30  # any other scale stays matplotlib's
    pyplot().close(scores)


def test_short_curves_have_markers_and_every_panel_a_legend():
    from rapo_echo.benchmarks.plots import metric_unit, pyplot, training_figure

    one_step = [{"step": 1, "reward/mean": 0.5, "kl": 0.01}]
    longer = [{"step": s, "reward/mean": 0.1 * s, "kl": 0.01 * s} for s in range(1, 41)]
    fig, _ = training_figure({"one-step": one_step, "forty-steps": longer})
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["reward/mean", "kl"]
    for ax in axes:
        assert ax.get_legend() is not None
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["one-step", "forty-steps"]
        short, long_ = ax.get_lines()
        assert short.get_marker() == "o" and long_.get_marker() in ("None", None, "")
    pyplot().close(fig)
    alone, _ = training_figure({"only": one_step})
    assert all(ax.get_legend() is None for ax in alone.axes)  # one run: nothing to tell apart
    pyplot().close(alone)
    assert [metric_unit(k) for k in ("success_rate", "avg_turns", "bleu_2", "successes", "epmq")] == [
        "rate (0-1)",
        "turns",
        "percent",
        "dialogues",
        "score",
    ]
