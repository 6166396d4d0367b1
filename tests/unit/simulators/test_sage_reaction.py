"""The SAGE-style user reacting to one reply (``simulator: sage``): each pair's user is its scenario's
profile with the dialogue so far, the change is SAGE's analysis clamped to the preset and the scale, and the
``emotion_change`` reward reads it as ``delta / scale``. Hand-worked: scripted analyses of +5, -10, +10."""

from __future__ import annotations

import re

import pytest

from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.errors import ConfigError
from rapo_echo.rewards import RewardContext, build_reward
from rapo_echo.simulators.base import build_simulator
from rapo_echo.types import Sample, Scenario, msg
from tests.helpers.answers import sage_analysis, sage_reply


def by_reply(text: str) -> str:
    """The analysis reads the newest reply's last word as the change; the user answers 'ok'."""
    if "emotion right now" in text:
        shift = re.findall(r"REPLY(-?\+?\d+)", text)[-1]
        return sage_analysis(int(shift)) if shift != "999" else "no json here"
    return sage_reply("ok")


def engine() -> ScriptedEngine:
    return ScriptedEngine(fn=lambda prompt: by_reply(prompt_text(prompt)), structured=False)


def scenario(i: int, **profile) -> Scenario:
    messages = [msg("system", "be kind"), msg("user", f"I lost my job {i}.")]
    return Scenario(f"s{i}", messages, profile={"persona": f"person {i}", "situation": "job loss", **profile})


def test_reacts_from_the_profile_and_the_dialogue() -> None:
    sim = build_simulator("sage", {"preset": "sage", "max_retries": 0}, engine=engine(), scale=10.0)
    pairs = [(scenario(1), "REPLY+5"), (scenario(2), "REPLY-10"), (scenario(3), "REPLY999")]
    out = sim.react(pairs)
    assert [r.emotion_delta if r else None for r in out] == [5.0, -10.0, None]  # the last never parses
    assert out[0].message == "ok" and out[0].scale == 10.0
    first = prompt_text(sim.sim.engine.calls[0]["prompts"][0])
    assert "person 1" in first and "I lost my job 1." in first and "be kind" not in first


def test_change_clamped_to_the_scale_and_read_by_emotion_change() -> None:
    # the rlver preset does not clamp (+10 stays +10); a scale of 4 does: 10 -> 4, read as 4 / 4
    ctx = RewardContext(simulator=engine())
    reward = build_reward(
        "emotion_change", {"simulator": "sage", "simulator_args": {"preset": "rlver"}, "scale": 4.0}, ctx
    )
    texts = ["REPLY+10", "REPLY-1", "REPLY999"]
    samples = [Sample(scenario(i), 0, [], [], None, text) for i, text in enumerate(texts)]
    outs = reward(samples)
    assert outs[0].score == 1.0 and outs[1].score == pytest.approx(-0.25) and outs[2] is None


def test_needs_an_engine_and_known_settings() -> None:
    with pytest.raises(ConfigError, match="needs a simulator engine"):
        build_simulator("sage", {}, engine=None)
    with pytest.raises(ConfigError, match="unknown keys"):
        build_simulator("sage", {"max_turnz": 3}, engine=engine())
