"""RLVER's simulated user does not end a dialogue at emotion 100 by default (issue 31, item 21).

RLVER's released rollout ends a dialogue only on the user's goodbye, emotion <= 0 or the turn limit
(research/rlver.md 1.4; at 100 the tier-S instruction makes the user say goodbye instead); SAGE's
evaluation loop also ends at >= 100. ``rlver.simulator.end_at_max_emotion`` switches between the two.
"""

from __future__ import annotations

import pytest

from rapo_echo.simulators.sage import SageSettings, end_reason, preset
from tests.unit.algorithms.test_rlver import (  # noqa: F401 (policy: the fixture)
    TokenScript,
    echo_policy,
    make_algo,
    policy,
    scenario,
    simulator,
)


def test_the_presets_end_at_100_as_their_sources_do():
    sage, rlver = preset("sage"), preset("rlver")
    assert sage.end_at_max and not rlver.end_at_max
    assert end_reason(100, 1, sage) == "emotion_high"
    assert end_reason(100, 1, rlver) is None  # RLVER's release: goodbye, <= 0 or the turn limit only
    assert end_reason(100, 8, rlver) == "max_turns" and end_reason(0, 1, rlver) == "emotion_low"
    assert end_reason(100, 1, SageSettings.from_mapping({"preset": "rlver", "end_at_max": True})) == (
        "emotion_high"
    )


@pytest.mark.parametrize(("switch", "reason", "turns"), [(None, "max_turns", 4), ("true", "emotion_high", 2)])
def test_rlver_rollout_goes_on_at_100_unless_switched(policy, switch, reason, turns):  # noqa: F811
    policy.rollout_engine = TokenScript(policy.tokenizer, echo_policy)
    sets = ["rlver.simulator.max_turns=4", "rlver.simulator.initial_emotion=80", "rollout.group_size=1"]
    if switch is not None:
        sets.append(f"rlver.simulator.end_at_max_emotion={switch}")
    # the change is an integer in -10..10 (the answer's schema): 80 -> 90 -> 100 -> 100 (capped) -> 100
    algo = make_algo(policy, simulator({"Up": "+10"}), *sets)
    episode = algo.rollout([scenario("Up")], step=0).extra["episodes"][0]
    assert (episode.dialogue.reason, len(episode.turns)) == (reason, turns)
    assert episode.dialogue.emotion == 100.0


def test_the_switch_is_a_config_field_with_a_description():
    from rapo_echo.algorithms.rlver_config import RlverSimulatorConfig

    field = RlverSimulatorConfig.model_fields["end_at_max_emotion"]
    assert field.default is None and "100" in field.description
