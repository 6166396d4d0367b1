"""The up-front warning for a simulator or judge on a model too small to give a meaningful signal."""

from __future__ import annotations

import logging

import torch

from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.llm.strength import WEAK_ROLE_PARAMETERS, parameter_count, warn_if_weak, weak_role_message


class _Engine:
    def __init__(self, numel: int) -> None:
        self.name = "judge:hf"
        self.model = torch.nn.Linear(numel, 1, bias=False)


def test_parameter_count_and_threshold() -> None:
    assert parameter_count(_Engine(10)) == 10
    assert parameter_count(ScriptedEngine()) is None
    message = weak_role_message(_Engine(135), "judge")
    assert message is not None and "0M-parameter" in message and "judge.base_url" in message
    assert "--simulator http" in weak_role_message(_Engine(5), "simulator", "eval")
    assert weak_role_message(ScriptedEngine(), "judge") is None


def test_threshold_is_exclusive() -> None:
    class Big:
        name = "big"

        class model:
            @staticmethod
            def parameters():
                return [torch.empty(0).new_empty((1,)).expand(WEAK_ROLE_PARAMETERS)]

    assert weak_role_message(Big(), "judge") is None


def test_warned_once_per_engine_and_role(caplog) -> None:
    engine = _Engine(3)
    with caplog.at_level(logging.WARNING, logger="rapo_echo.llm.strength"):
        warn_if_weak(engine, "judge")
        warn_if_weak(engine, "judge")
        warn_if_weak(engine, "simulator")
    assert len(caplog.records) == 2


def test_first_answer_of_a_small_role_says_so(caplog) -> None:
    from rapo_echo.llm.answers import generate_parsed
    from rapo_echo.structured import AnswerFormat
    from rapo_echo.types import SamplingParams, msg

    engine = ScriptedEngine(replies=["3"])
    engine.model = torch.nn.Linear(4, 1)  # a local model of 5 parameters behind the scripted replies
    with caplog.at_level(logging.WARNING, logger="rapo_echo.llm.strength"):
        for _ in range(2):
            generate_parsed(
                engine, [[msg("user", "x")]], None, SamplingParams(), role="simulator",
                answer_format=AnswerFormat.integer(0, 9),
            )
    assert [r.getMessage()[:40] for r in caplog.records] == ["the simulator runs on a 0M-parameter mod"]


def test_the_group_judge_says_so_at_its_first_ranking(caplog) -> None:
    from rapo_echo.judges.group import Candidate, GroupJudge
    from rapo_echo.llm.reaction import Reaction
    from rapo_echo.types import Scenario, msg

    engine = ScriptedEngine(choice_fn=lambda p, o: dict.fromkeys(o, 0.0))
    engine.model = torch.nn.Linear(4, 1)
    group = [Candidate(r, Reaction(f"reaction to {r}", 1.0, "", True)) for r in ("a", "b")]
    with caplog.at_level(logging.WARNING, logger="rapo_echo.llm.strength"):
        GroupJudge(engine).rank([Scenario("s", [msg("user", "hi")])], [group], with_critiques=False)
    assert any(r.getMessage().startswith("the judge runs on a 0M-parameter") for r in caplog.records)
