"""The long-run study's curves and tables: the moving average by hand, one figure per metric with every
run on it (the report adds them for runs longer than LONG_RUN_STEPS), and the study driver's arms,
resumable chunks and tables (studies/long_run.py) on synthetic run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapo_echo.benchmarks.plots import LONG_RUN_STEPS, metric_figures, moving_average
from studies import long_run


def test_moving_average_by_hand() -> None:
    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert moving_average([5.0], 3) == [5.0] and moving_average([], 3) == []


def rows(n: int, score: float, alarm_at: int | None = None) -> list[dict]:
    out = []
    for s in range(1, n + 1):
        row = {
            "step": s,
            "sim/hidden_rule_score": score + 0.001 * s,
            "entropy": 2.0 - 0.01 * s,
            "kl": 0.01 * s,
        }
        row["monitor/entropy_collapse"] = 1.0 if alarm_at is not None and s >= alarm_at else 0.0
        out.append(row)
    return out


def test_one_figure_per_metric_with_every_run() -> None:
    pytest.importorskip("matplotlib")
    figs = metric_figures({"a": rows(60, 0.5, alarm_at=40), "b": rows(30, 0.6)})
    assert [k for k, _ in figs] == ["sim/hidden_rule_score", "entropy", "kl"]  # only what was logged
    assert all(png for _, png in figs)
    replayed = metric_figures({"a": rows(60, 0.5)}, keys=["kl"], alarms={"a": {"kl_drift": 30}})
    assert [k for k, _ in replayed] == ["kl"]


def write_run(
    root: Path,
    name: str,
    arm: str,
    seed: int,
    n: int,
    first: float,
    last: float,
    key: str = "sim/hidden_rule_score",
) -> None:
    run = root / name
    run.mkdir(parents=True)
    lines = []
    for s in range(1, n + 1):
        score = first if s <= n // 2 else last
        lines.append(json.dumps({"step": s, key: score, "entropy": 1.0, "time/step": 2.0}))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    state = long_run.load_state(root)
    state["runs"][name] = {"arm": arm, "seed": seed, "resumes": 1, "wall_s": 10.0}
    long_run.save_state(root, state)


def test_study_tables_and_the_gain_interval(tmp_path: Path) -> None:
    pytest.importorskip("scipy")
    for seed, (g_first, g_last, r_last) in enumerate([(0.5, 0.6, 0.8), (0.5, 0.55, 0.7), (0.5, 0.6, 0.75)]):
        write_run(tmp_path, f"grpo-s{seed}", "grpo", seed, 40, g_first, g_last)
        write_run(tmp_path, f"nll-on-s{seed}", "nll-on", seed, 40, 0.5, r_last)
    text = long_run.study_tables(tmp_path, window=20)
    assert "| nll-on-s0 | nll | on | 0 | 40 | 1 | 0.5 | 0.8 | 1 | 2 | - | none |" in text
    # gains: grpo .1, .05, .1 (mean .0833); nll-on .3, .2, .25 (mean .25); paired differences .2, .15, .15:
    # mean .1667, sd .0289, t(0.975, 2) = 4.303 -> half-width 4.303 * .0289 / sqrt 3 = .0717
    assert (
        "| nll-on | 3 | 40 | +0.250 [+0.126, +0.374] | 2.0 | - | +0.167 [+0.095, +0.238] over 3 seeds |"
        in text
    )
    # as they were at step 20: the second half is not reached, so first = last
    assert "| nll-on | 3 | 20 | +0.000" in long_run.study_tables(tmp_path, window=10, upto=20)
    assert "| grpo | 3 | 40 | +0.083" in text


def test_an_rlver_run_is_scored_by_its_final_emotion(tmp_path: Path) -> None:
    write_run(tmp_path, "rlver-turn-s0", "rlver-turn", 0, 10, 0.0, 0.2, key="emotion/final")
    text = long_run.study_tables(tmp_path, window=5)
    assert "| rlver-turn-s0 | rlver | turn | 0 | 10 | 1 | 0 | 0.2 |" in text


def test_arms_and_their_overrides() -> None:
    algo, sets = long_run.arm_config("token_kl-off")
    assert algo == "rapo" and "rapo.sd.loss=token_kl" in sets and "rapo.sd.verify=false" in sets
    assert "rapo.sd.verify=true" in long_run.arm_config("nll-on")[1]
    assert "rapo.sd.enabled=false" in long_run.arm_config("grpo")[1]
    assert long_run.arm_config("rlver-turn") == ("rlver", [*long_run.RLVER_COMMON, "rlver.reward=per_turn"])
    with pytest.raises(SystemExit, match="unknown arm"):
        long_run.arm_config("nll-maybe")
    assert LONG_RUN_STEPS == 50


def test_the_study_rlver_user_warms_to_a_question_in_the_newest_reply() -> None:
    from rapo_echo.config.yaml_files import load_yaml_text
    from rapo_echo.engines.scripted import ScriptedEngine
    from rapo_echo.llm.fencing import Fence
    from rapo_echo.simulators.sage import analysis_prompt

    engine = ScriptedEngine.from_config(load_yaml_text(long_run.QUESTION_USER, "script"))

    def shift(history: list[dict]) -> int:
        from rapo_echo.data.sage_profiles import SageProfile

        profile = SageProfile.from_mapping({"id": "p", "player": "I am P", "scene": "s", "task": "t"}, "p")
        prompt = analysis_prompt(profile, history, 10.0, Fence())
        return json.loads(engine.reply(prompt))["shift"]

    asked = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "What happened?"}]
    told = [*asked, {"role": "user", "content": "stuff"}, {"role": "assistant", "content": "I see."}]
    assert shift(asked) == 10 and shift(told) == -10  # an earlier question does not count
