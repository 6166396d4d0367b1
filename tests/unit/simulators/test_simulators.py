"""Simulator plugins: the registry (built-in, entry point, dotted path), the declaration check made
before anything is called, the protocol's invalid reactions, and the ``emotion_change`` reward."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from rapo_echo import plugins
from rapo_echo.errors import ConfigError
from rapo_echo.llm.reaction import Reaction
from rapo_echo.rewards import RewardContext, build_reward
from rapo_echo.simulators import base
from rapo_echo.simulators.base import build_simulator, checked_reactions
from rapo_echo.simulators.hidden_preference import HiddenPreferenceUser
from rapo_echo.simulators.reaction import ReactionSimulator
from rapo_echo.types import Sample, Scenario, msg
from tests.helpers import plugin_simulators

SC = Scenario(
    "s0", [msg("user", "My gran died.")], profile={"emotion_type": "sadness", "problem_type": "grief"}
)


def test_builtins_by_name_with_injected_engine_scale_and_seed() -> None:
    engine = object()
    sim = build_simulator("reaction", {"max_new_tokens": 12}, engine=engine, scale=5.0)
    assert isinstance(sim, ReactionSimulator) and sim.engine is engine and sim.scale == 5.0
    assert sim.max_new_tokens == 12
    user = build_simulator("hidden_preference", {}, scale=4.0)
    assert isinstance(user, HiddenPreferenceUser) and user.scale == 4.0


def test_dotted_path_plugins_subclass_or_marker() -> None:
    name = "tests.helpers.plugin_simulators:EveryOtherInvalid"
    sim = build_simulator(name, {"warmth": 2.0}, engine="E", scale=3.0)
    assert (sim.engine, sim.scale, sim.warmth) == ("E", 3.0, 2.0)
    declared = build_simulator("tests.helpers.plugin_simulators.Declared", None, seed=7)
    assert declared.seed == 7  # the marker attribute is enough; only declared parameters are injected


def test_entry_point_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = SimpleNamespace(name="kind_user", load=lambda: plugin_simulators.Declared)
    monkeypatch.setattr(
        plugins, "entry_points", lambda group: [ep] if group == base.ENTRY_POINT_GROUP else []
    )
    assert isinstance(build_simulator("kind_user"), plugin_simulators.Declared)
    with pytest.raises(
        ConfigError, match=r"unknown simulator 'nobody'; known: .*hidden_preference.*kind_user"
    ):
        build_simulator("nobody")


@pytest.mark.parametrize(
    "name",
    [
        "tests.helpers.plugin_simulators:Undeclared",
        "subprocess:Popen",
        "os:system",
        "tests.helpers.plugin_simulators:CONSTRUCTED",
    ],
)
def test_only_declared_simulator_classes_are_called(name: str) -> None:
    plugin_simulators.CONSTRUCTED.clear()
    with pytest.raises(ConfigError, match=r"rapo.simulator.name: .* is not a simulator plugin"):
        build_simulator(name, {"args": "echo hacked", "shell": True})
    assert plugin_simulators.CONSTRUCTED == []


def test_bad_args_and_imports_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"rapo.simulator.name: simulator 'hidden_preference' rejected"):
        build_simulator("hidden_preference", {"bogus": 1})
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        build_simulator("no_such_module:User")
    with pytest.raises(ConfigError, match=r"hidden_preference: rules\[0\].detect: got 'vibes'"):
        build_simulator("hidden_preference", {"rules": [{"detect": "vibes", "said": "a", "thought": "b"}]})


def test_checked_reactions_mark_none_and_out_of_range_invalid() -> None:
    out = checked_reactions([Reaction("a", 2.0, "t"), None], 2, scale=5.0)
    assert out[0].valid and out[0].scale == 5.0 and out[0].emotion_delta == 2.0
    assert not out[1].valid and out[1].emotion_delta is None
    sim = plugin_simulators.OutOfRange()
    out = checked_reactions(sim.react([(SC, "x")] * 3), 3, scale=10.0)
    assert [r.valid for r in out] == [False, False, True] and out[2].emotion_delta == -10.0
    with pytest.raises(ValueError, match="returned 1 reactions for 2 replies"):
        checked_reactions([None], 2, scale=1.0, name="mine")
    with pytest.raises(TypeError, match="returned str for reply 0; expected Reaction or None"):
        checked_reactions(["happy"], 1, scale=1.0)  # type: ignore[list-item]  # the refusal under test


def sample(text: str) -> Sample:
    return Sample(SC, 0, [1], [2], None, text)


def test_emotion_change_reward_is_delta_over_scale() -> None:
    reward = build_reward(
        "emotion_change",
        {"simulator": "hidden_preference", "scale": 4.0},
        RewardContext(),
        where="rewards.0.name",
    )
    out = reward(
        [sample("That sounds so lonely. What do you miss most?"), sample("I remember that."), sample(" ")]
    )
    # hidden-rule scores 1.0, 0.25 -> deltas 4 * (2s - 1) = 4, -2 -> rewards 1.0, -0.5; empty reply invalid
    assert [o.score if o else None for o in out] == [1.0, -0.5, None]
    assert out[0].info["emotion_delta"] == 4.0 and "sad" in out[0].info["message"]
    with pytest.raises(ConfigError, match="rewards: emotion_change: simulator: .* is not a simulator plugin"):
        build_reward("emotion_change", {"simulator": "os:system"}, RewardContext())


def test_emotion_change_reward_masks_invalid_reactions() -> None:
    reward = build_reward(
        "emotion_change", {"simulator": "tests.helpers.plugin_simulators:EveryOtherInvalid"}, RewardContext()
    )
    out = reward([sample("a"), sample("b"), sample("c")])
    assert [o.score if o else None for o in out] == [0.3, None, 0.3]
    assert all(o is None or math.isfinite(o.score) for o in out)
