"""SAGE's hard-to-help seekers, the state probe (emotional state tracking, by hand) and the simulated
user's emotion reading asked again (its self-agreement), with scripted engines."""

from __future__ import annotations

from collections import Counter

import pytest

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.results import read_records
from rapo_echo.benchmarks.runner import get_benchmark, run_eval
from rapo_echo.benchmarks.sage.tracking import tracking_metrics
from rapo_echo.data.sage_profiles import BUNDLED_HARD_PROFILES, load_profiles
from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.errors import ConfigError
from tests.unit.benchmarks.test_bench_sage import hashing_simulator, profiles_file, row, stepping_simulator

STYLES = {"withdrawn", "hostile", "contradictory", "testing", "humour", "shifting"}


def test_the_hard_profiles_cover_six_kinds_of_seeker_twice():
    profiles = load_profiles("bundled:" + BUNDLED_HARD_PROFILES)
    assert Counter(p.style for p in profiles) == {s: 2 for s in STYLES}
    for p in profiles:
        assert p.first_talk and p.hidden_intention and p.id.startswith(f"hard-{p.style}-")
        assert "How replies land" in p.background and "Way of speaking" in p.persona


def test_profiles_hard_is_the_bundled_set_and_refuses_data(tmp_path):
    sage = get_benchmark("sage")
    cases = sage.load_cases(None, EvalSettings(profiles="hard"))
    assert len(cases) == 12 and cases[0].data.style == "withdrawn"
    with pytest.raises(ConfigError, match="drop --data"):
        sage.load_cases(profiles_file(tmp_path, [row("x", "0")]), EvalSettings(profiles="hard"))


def test_a_reading_is_alike_at_the_grain_of_the_change_options():
    from rapo_echo.benchmarks.sage.run import nearest_change

    assert [nearest_change(x) for x in (0.28, 1.03, 2.4, 2.6, -7.6, 14.0)] == [0, 0, 0, 5, -10, 10]


def test_tracking_by_hand():
    probes = [
        {"estimate": 40, "hidden": 40.0},
        {"estimate": 50, "hidden": 45.0},
        {"estimate": None, "hidden": 50.0},  # unreadable: left out
        {"estimate": 50, "hidden": 40.0},
    ]
    # errors 0, 5, 10 -> 5; moves (40 -> 50 vs 40 -> 45: both up), (50 -> 50 vs 45 -> 40: flat vs down)
    assert tracking_metrics(probes) == {"tracking_error": 5.0, "tracking_direction": 0.5}
    assert tracking_metrics([{"estimate": 30, "hidden": 40.0}]) == {"tracking_error": 10.0}
    assert tracking_metrics([{"estimate": None, "hidden": 40.0}]) == {}


def probing_policy(estimate: str = "40") -> ScriptedEngine:
    def fn(prompt):
        text = prompt_text(prompt)
        return estimate if "How does the person feel right now" in text else "I hear you."

    return ScriptedEngine(fn=fn)


def test_the_state_probe_measures_tracking_against_the_hidden_emotion(tmp_path):
    data = profiles_file(tmp_path, [row("up", "+5")])
    policy = probing_policy("40")
    settings = EvalSettings(max_turns=4, state_probe="on")
    summary = run_eval(
        get_benchmark("sage"), Roles(policy, stepping_simulator()), settings, tmp_path / "o", data=data
    )
    (r,) = read_records(tmp_path / "o" / "results.jsonl")
    # before each of the 4 replies the policy says 40; the hidden emotion then is 40, 45, 50, 55
    probes = r["info"]["state_probe"]
    assert [(p["turn"], p["estimate"], p["hidden"]) for p in probes] == [
        (0, 40, 40.0),
        (1, 40, 45.0),
        (2, 40, 50.0),
        (3, 40, 55.0),
    ]
    # error (0 + 5 + 10 + 15) / 4; the estimate never moves while the emotion rises: direction 0
    assert r["metrics"]["tracking_error"] == 7.5 and r["metrics"]["tracking_direction"] == 0.0
    assert summary["metrics"]["tracking_error"] == 7.5
    assert summary["figures"]["tracking_direction"]["mean"] == 0.0
    probe_prompts = [
        prompt_text(p) for c in policy.calls for p in c["prompts"] if "feel right now" in prompt_text(p)
    ]
    assert len(probe_prompts) == 4 and all("DIALOGUE" in t for t in probe_prompts)
    # off by default for the standard profiles: no probe call, no tracking figures
    plain = probing_policy()
    run_eval(
        get_benchmark("sage"),
        Roles(plain, stepping_simulator()),
        EvalSettings(max_turns=4),
        tmp_path / "p",
        data=data,
    )
    (r,) = read_records(tmp_path / "p" / "results.jsonl")
    assert "state_probe" not in r["info"] and "tracking_error" not in r["metrics"]
    assert not any("feel right now" in prompt_text(p) for c in plain.calls for p in c["prompts"])


def test_the_users_emotion_reading_is_asked_again(tmp_path):
    data = profiles_file(tmp_path, [row(f"p{i}", "+5") for i in range(3)])
    run_eval(
        get_benchmark("sage"),
        Roles(probing_policy(), stepping_simulator()),
        EvalSettings(max_turns=4),
        tmp_path / "steady",
        data=data,
    )
    for r in read_records(tmp_path / "steady" / "results.jsonl"):
        recheck = r["info"]["judge_recheck"]  # the stepping user reads +5 whatever the marker
        assert recheck == {
            "agree": 1.0,
            "abs_diff": 0.0,
            "first": {"change": 5.0},
            "again": {"change": 5.0},
            "read": [5.0, 5.0],
        }
    data = profiles_file(tmp_path, [row(f"q{i}", "0") for i in range(8)])
    summary = run_eval(
        get_benchmark("sage"),
        Roles(probing_policy(), hashing_simulator()),
        EvalSettings(max_turns=4),
        tmp_path / "noisy",
        data=data,
    )
    rechecks = [r["info"]["judge_recheck"] for r in read_records(tmp_path / "noisy" / "results.jsonl")]
    last_deltas = [
        next(e["delta"] for e in reversed(r["info"]["log"]) if "delta" in e)
        for r in read_records(tmp_path / "noisy" / "results.jsonl")
    ]
    assert [c["read"][0] for c in rechecks] == last_deltas
    assert all(c["first"]["change"] in (-10, -5, 0, 5, 10) for c in rechecks)
    assert {c["agree"] for c in rechecks} == {0.0, 1.0}  # a user whose reading hangs on the prompt marker
    assert summary["metrics"]["judge/self_agreement"] == pytest.approx(
        sum(c["agree"] for c in rechecks) / len(rechecks)
    )


def test_the_summary_gives_the_score_per_kind_of_seeker(tmp_path):
    rows = [row("a", "+5"), row("b", "-10"), row("c", "0")]
    rows[0]["style"], rows[1]["style"] = "hostile", "withdrawn"
    summary = run_eval(
        get_benchmark("sage"),
        Roles(probing_policy(), stepping_simulator()),
        EvalSettings(max_turns=3, judge_recheck=False),
        tmp_path / "s",
        data=profiles_file(tmp_path, rows),
    )
    assert summary["metrics"]["score/hostile"] == 50.0 and summary["metrics"]["score/withdrawn"] == 20.0
    assert {k for k in summary["metrics"] if k.startswith("score/")} == {"score/hostile", "score/withdrawn"}
