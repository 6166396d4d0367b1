"""SOTOPIA's own evaluator as the scorer (``--scorer sotopia``), tested against a fake ``sotopia`` package
with the official API's shape: the evaluator class is built with the model name and
``response_format_class=Form[SotopiaDimensions]``, called as ``await ev.__acall__(turn_number,
messages=None, history=text, temperature=0.0)`` and answers ``[(agent_key, ((dimension, score),
reasoning)), ...]``."""

from __future__ import annotations

import json
import sys
import types

import pytest

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.sotopia.official import agent_scores, load_evaluator
from rapo_echo.benchmarks.sotopia.run import Sotopia
from rapo_echo.cli import main
from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.errors import ConfigError

SCORES = {
    "believability": 9,
    "relationship": 1,
    "knowledge": 4,
    "secret": 0,
    "social_rules": -2,
    "financial_and_material_benefits": 0,
    "goal": 6,
}


class _Form:
    def __class_getitem__(cls, item):
        return (cls.__name__, item)


class SotopiaDimensions:
    pass


def fake_sotopia(monkeypatch, *, newer: bool = True, scores=SCORES) -> list:
    """Install a fake ``sotopia.envs.evaluators``; returns the list its evaluators record calls in."""
    calls: list = []

    class Evaluator:
        def __init__(self, model_name, response_format_class):
            calls.append(("init", model_name, response_format_class))

        async def __acall__(self, turn_number, messages, history="", temperature=None):
            calls.append(("call", turn_number, messages, history, temperature))
            return [
                (agent, ((d, v if agent == "agent_1" else v - 1), f"{agent} {d}"))
                for agent in ("agent_1", "agent_2")
                for d, v in scores.items()
            ]

    evaluators = types.ModuleType("sotopia.envs.evaluators")
    evaluators.SotopiaDimensions = SotopiaDimensions
    if newer:
        evaluators.EpisodeLLMEvaluator = Evaluator
        evaluators.EvaluationForAgents = type("EvaluationForAgents", (_Form,), {})
    else:
        evaluators.ReachGoalLLMEvaluator = Evaluator
        evaluators.EvaluationForTwoAgents = type("EvaluationForTwoAgents", (_Form,), {})
    envs = types.ModuleType("sotopia.envs")
    envs.evaluators = evaluators
    root = types.ModuleType("sotopia")
    root.envs = envs
    for name, module in (("sotopia", root), ("sotopia.envs", envs), ("sotopia.envs.evaluators", evaluators)):
        monkeypatch.setitem(sys.modules, name, module)
    return calls


def speak(prompt):
    return json.dumps({"action_type": "speak", "argument": "hello " + prompt_text(prompt)[-3:]})


@pytest.mark.parametrize("newer", [True, False])
def test_the_official_evaluator_scores_and_each_record_names_its_scorer(monkeypatch, newer):
    calls = fake_sotopia(monkeypatch, newer=newer)
    bench = Sotopia()
    settings = EvalSettings(max_turns=2, sotopia_scorer="sotopia", sotopia_model="custom/m@http://h:1/v1")
    cases = bench.load_cases(None, settings)[:2]
    records: list[dict] = []
    judge = ScriptedEngine()  # not used by the official scorer
    bench.run_batch(
        cases, Roles(ScriptedEngine(fn=speak), ScriptedEngine(fn=speak), judge), settings, records.append
    )
    init = calls[0]
    form = "EvaluationForAgents" if newer else "EvaluationForTwoAgents"
    assert init == ("init", "custom/m@http://h:1/v1", (form, SotopiaDimensions))
    episode_calls = [c for c in calls if c[0] == "call"]
    assert len(episode_calls) == 2 and all(c[1] == 2 and c[2] is None and c[4] == 0.0 for c in episode_calls)
    assert "Scenario:" in episode_calls[0][3] and "Turn #0:" in episode_calls[0][3]
    first, second = records
    assert first["valid"] and first["info"]["scorer"] == "sotopia" and judge.calls == []
    assert {d: first["metrics"][d] for d in SCORES} == {d: float(v) for d, v in SCORES.items()}  # agent_1
    assert second["metrics"]["goal"] == 5.0  # the policy plays agent_2 in the second case
    assert "goal: agent_1 goal" in first["info"]["evaluator_raw"]
    summary = bench.summarize(records)
    assert summary["scorer/sotopia"] == 2 and summary["scorer/ours"] == 0


def test_official_scores_out_of_range_or_missing_are_invalid(monkeypatch):
    assert agent_scores([("agent_1", (("goal", 11), "r"))], 0)[0] is None
    answer = [("agent_1", ((d, v), "r")) for d, v in SCORES.items()]
    assert agent_scores(answer, 0)[0] == {d: float(v) for d, v in SCORES.items()}
    assert agent_scores(answer[:-1], 0)[0] is None  # goal missing
    assert agent_scores(answer, 1)[0] is None  # nothing for agent_2
    bad = [("agent_1", ((d, 1 if d == "secret" else v), "r")) for d, v in SCORES.items()]
    assert agent_scores(bad, 0)[0] is None  # secret is -10..0
    assert agent_scores(None, 0)[0] is None and agent_scores([("x",)], 0)[0] is None


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "sotopia", None)  # an import of sotopia now fails
    monkeypatch.setitem(sys.modules, "sotopia.envs", None)
    monkeypatch.setitem(sys.modules, "sotopia.envs.evaluators", None)
    with pytest.raises(ConfigError, match=r"rapo-echo\[sotopia\]"):
        load_evaluator("gpt-4o")
    # the command line: --scorer sotopia reaches the guard, which names the install line
    import rapo_echo.engines

    speaker = json.dumps({"action_type": "speak", "argument": "Hi."})
    monkeypatch.setattr(
        rapo_echo.engines, "engine_from_spec", lambda spec, **kw: ScriptedEngine(default=speaker)
    )
    argv = ["eval", "--benchmark", "sotopia", "--policy", "p", "--limit", "1", "--max-turns", "2"]
    code = main([*argv, "--scorer", "sotopia", "--output", str(tmp_path / "o")])
    assert code != 0 and "rapo-echo[sotopia]" in capsys.readouterr().err
