"""Bad judge and simulator output is masked and counted, never a crash (issue 14 item 6): content that is
not a string, NaN log-probs, no label among a server's top log-probs. Each sample or group becomes invalid,
is counted, and the warning names the role and the engine with its endpoint."""

from __future__ import annotations

import json
import logging
import math
import random
import re

import httpx
import pytest

from rapo_echo.engines.openai_engine import OpenAIEngine, content_text
from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.judges.group import Candidate, GroupJudge
from rapo_echo.llm.labels import read_label_probabilities, usable_probabilities
from rapo_echo.llm.reaction import Reaction
from rapo_echo.rewards import RewardContext
from rapo_echo.rewards.judge import JudgeReward
from rapo_echo.simulators.reaction import ReactionSimulator
from rapo_echo.types import Sample, Scenario, msg

URL = "http://judge.test:8000/v1"


def fake_server(content, top=(("Hello", -0.1),)) -> OpenAIEngine:
    """An ``openai`` engine whose server answers every chat request with ``content`` (any JSON value)
    and, per position, the ``top`` log-probs."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the engine asks which server it talks to before its first format
            return httpx.Response(200, json={"data": [{"id": "judge-model", "owned_by": "someone"}]})
        body = json.loads(request.content)
        logprobs = {
            "content": [
                {
                    "token": "x",
                    "logprob": -0.1,
                    "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top],
                }
            ]
        }
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        if body.get("logprobs"):
            choice["logprobs"] = logprobs
        return httpx.Response(200, json={"choices": [choice]})

    client = httpx.Client(transport=httpx.MockTransport(handle))
    return OpenAIEngine(
        URL, "judge-model", api_key_env=None, name="judge-x", http_client=client, max_retries=0
    )


def sample(text: str = "That sounds hard.") -> Sample:
    return Sample(Scenario("s", [msg("user", "I lost my job.")]), 0, [1], [2], None, text, "stop")


def group(*replies: str) -> list[Candidate]:
    return [Candidate(r, Reaction(f"reaction to {r}", 1.0, "", True)) for r in replies]


# ---------------------------------------------------------------------------- content that is not a string
@pytest.mark.parametrize(
    "content", [5, {"text": "Score: 4"}, [{"type": "image_url", "image_url": "x"}], True]
)
def test_judge_reward_counts_non_string_content_as_invalid(content, caplog):
    judge = JudgeReward(RewardContext(judge=fake_server(content)), use_logprobs="never", max_retries=1)
    with caplog.at_level(logging.WARNING):
        (out,) = judge([sample()])
    assert out.score is None and out.info["attempts"] == 2
    assert f"is {type(content).__name__}, not text" in caplog.text
    assert "judge engine 'judge-x' at http://judge.test:8000/v1" in caplog.text


def test_text_parts_are_joined_and_null_is_empty():
    assert content_text([{"type": "text", "text": "Score: "}, {"type": "text", "text": "4"}]) == "Score: 4"
    assert content_text(None) == "" and content_text("x") == "x" and content_text(3) is None
    parts = [{"type": "text", "text": '{"score": '}, {"type": "text", "text": "4}"}]
    judge = JudgeReward(RewardContext(judge=fake_server(parts)), use_logprobs="never")
    assert judge([sample()])[0].score == pytest.approx(0.75)


def test_group_judge_text_mode_masks_non_string_content(caplog):
    judge = GroupJudge(fake_server({"ranking": "A > B"}), use_logprobs="never", max_retries=0)
    with caplog.at_level(logging.WARNING):
        (out,) = judge.rank([Scenario("s", [msg("user", "hi")])], [group("a", "b")], with_critiques=False)
    assert not out.valid and out.ranks is None and judge.stats["invalid_groups"] == 1
    assert "judge engine 'judge-x' at http://judge.test:8000/v1" in caplog.text


# ---------------------------------------------------------------------------- NaN log-probs
def nan_for(word: str):
    """Label log-probs that are NaN for prompts mentioning ``word``, uniform otherwise."""
    return lambda prompt, options: {o: (math.nan if word in prompt_text(prompt) else 0.0) for o in options}


@pytest.mark.parametrize("ties", ["chained", "sequential", "pairwise"])
def test_nan_logprobs_make_only_their_group_invalid(ties, caplog):
    judge = GroupJudge(ScriptedEngine(choice_fn=nan_for("exam")), ties=ties, rng=random.Random(0))
    scenarios = [
        Scenario("a", [msg("user", "I failed my exam.")]),
        Scenario("b", [msg("user", "My dog died.")]),
    ]
    with caplog.at_level(logging.WARNING):
        bad, good = judge.rank(scenarios, [group("x", "y", "z"), group("x", "y", "z")], with_critiques=False)
    assert (bad.valid, bad.ranks) == (False, None) and good.valid and sum(good.ranks) == 6.0
    assert judge.stats["invalid_groups"] == 1
    assert "judge engine 'scripted': 1 of 2 groups got no usable label probabilities" in caplog.text


def test_nan_in_rapo_rollout_is_masked_and_counted(tiny_folder):
    from tests.unit.algorithms.test_rapo import QUALITY, SCENARIOS, make_rapo

    def best(prompt, options):
        if "dog" in prompt_text(prompt):
            return dict.fromkeys(options, math.nan)
        shown = dict(re.findall(r"<<<REPLY ([A-Z]) \w+>>>\n(\w+):", prompt_text(prompt)))
        return {o: QUALITY[shown[o.strip()]] for o in options}

    algo, *_ = make_rapo(tiny_folder, "rapo.sd.enabled=false", judge_engine=ScriptedEngine(choice_fn=best))
    out = algo.rollout(SCENARIOS, 0)
    assert [s.reward is None for s in out.samples] == [False] * 4 + [True] * 4
    assert out.metrics["judge/invalid_groups"] == 1.0 and out.metrics["invalid"] == 4.0


# ---------------------------------------------------------------------------- no label in the top log-probs
def test_judge_reward_without_label_logprobs_is_invalid_and_names_the_endpoint(caplog):
    judge = JudgeReward(RewardContext(judge=fake_server("Hello")), use_logprobs="always")
    with caplog.at_level(logging.WARNING):
        outs = judge([sample(), sample("Cheer up.")])
    assert [o.score for o in outs] == [None, None]
    assert (
        "judge engine 'judge-x' at http://judge.test:8000/v1: 2 of 2 prompts gave no usable label"
        in caplog.text
    )


def test_simulator_without_emotion_logprobs_marks_reactions_invalid(caplog):
    sim = ReactionSimulator(fake_server("I feel a bit better."), use_logprobs="always", with_thought=False)
    with caplog.at_level(logging.WARNING):
        (r,) = sim.react([(Scenario("s", [msg("user", "hi")]), "That sounds hard.")])
    assert not r.valid and r.emotion_delta is None
    assert "simulator engine 'judge-x' at http://judge.test:8000/v1" in caplog.text


@pytest.mark.parametrize(
    ("row", "usable"),
    [
        ({"1": -1.0, "2": -2.0}, True),
        ({"1": -math.inf, "2": -1.0}, True),
        ({"1": -math.inf, "2": -math.inf}, False),  # "every option has probability 0"
        ({"1": math.nan, "2": -1.0}, False),
        ({"1": math.inf, "2": -1.0}, False),
        ({"1": -1.0}, False),  # a label missing
        ({"1": "x", "2": -1.0}, False),
    ],
)
def test_usable_probabilities(row, usable):
    assert (usable_probabilities(row, ["1", "2"]) is not None) == usable


def test_read_label_probabilities_never_raises():
    engine = ScriptedEngine(choice_fn=lambda p, o: dict.fromkeys(o, -math.inf))
    assert read_label_probabilities(engine, [[msg("user", "x")]], ["1", "2"], role="judge") == [None]
