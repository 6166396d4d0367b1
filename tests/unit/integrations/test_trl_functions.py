"""Our rewards behind TRL's reward-function convention, and the SAGE rollout's pieces that need no TRL
(the TRL tier runs them inside the real ``GRPOTrainer``): TRL's text and conversational batches become
our samples, a reward's None stays None, its step metrics reach ``log_metric``, and a rollout finds each
prompt's profile by the prompt."""

from __future__ import annotations

import json

import pytest

from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.integrations.trl_rewards import TRLReward, to_samples, trl_reward
from rapo_echo.integrations.trl_sage import SageRollout, prompt_key, sage_emotion
from rapo_echo.rewards import RewardOutput


def test_text_and_conversational_batches_become_samples() -> None:
    prompts = ["I failed.", [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi."}]]
    completions = [
        "That is hard.",
        [
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "I am sad."},
            {"role": "assistant", "content": [{"type": "text", "text": "I hear you."}]},
        ],
    ]
    profiles = [json.dumps({"persona": "a"}), None]
    columns = {"profile": profiles, "reference": ["Ouch.", None], "id": ["x", None]}
    a, b = to_samples(prompts, completions, [[1, 2], [3]], columns)
    assert (a.scenario.messages, a.text, a.scenario.reference, a.scenario.id) == (
        [{"role": "user", "content": "I failed."}],
        "That is hard.",
        "Ouch.",
        "x",
    )
    assert a.scenario.profile == {"persona": "a"} and a.completion_ids == [1, 2]
    assert b.text == "I hear you."  # the last assistant message; what came before is context
    assert [m["content"] for m in b.scenario.messages] == ["Be kind.", "Hi.", "Hello.", "I am sad."]
    assert len(b.scenario.id) == 16 and b.scenario.profile == {}  # no id column value: a hash of it
    with pytest.raises(ValueError, match="column 'reference': expected one value per completion"):
        to_samples(prompts, completions, None, {"reference": ["only one"]})
    with pytest.raises(ConfigError, match="column 'profile', row 0: not a JSON object"):
        to_samples(["x"], ["y"], None, {"profile": ["{not json"]})


class Scored:
    """A reward that scores the reply's length, refuses empty replies and reports a metric."""

    name = "scored"

    def __call__(self, samples):
        return [RewardOutput(float(len(s.text))) if s.text else None for s in samples]

    def step_metrics(self):
        return {"calls": 1.0}


def test_the_function_keeps_trls_convention() -> None:
    logged: list[tuple[str, float]] = []
    fn = TRLReward(Scored(), "scored")
    out = fn(
        prompts=["a", "b"],
        completions=["four", ""],
        completion_ids=[[1], [2]],
        trainer_state=object(),
        log_extra=lambda *a: None,
        log_metric=lambda k, v: logged.append((k, v)),
        topic=["x", "y"],  # any other dataset column passes through
    )
    assert out == [4.0, None] and fn.__name__ == "scored" and logged == [("scored/calls", 1.0)]


def test_a_named_reward_is_built_on_the_roles_engines() -> None:
    judge = ScriptedEngine(replies=['{"score": 5}'])
    fn = trl_reward("judge", judge=judge, args={"use_logprobs": "never"})
    assert fn(prompts=["I failed."], completions=["That sounds hard."]) == [1.0]
    with pytest.raises(ConfigError, match="needs a judge engine"):
        trl_reward("empathy")
    length = trl_reward("length", args={"target": 2})
    assert length(prompts=["x"], completions=["two words"]) == [1.0]


def test_sage_emotion_returns_the_rollouts_reward_and_logs_its_dialogues() -> None:
    logged: dict[str, float] = {}
    out = sage_emotion(
        completions=["a", "b"],
        sage_reward=[0.4, None],
        sage_turns=[2, 3],
        sage_end=["max_turns", "invalid"],
        log_metric=logged.__setitem__,
    )
    assert out == [0.4, None]
    assert logged["sage/turns"] == 2.5
    assert logged["sage/end_max_turns"] == 0.5 and logged["sage/end_goodbye"] == 0
    with pytest.raises(ConfigError, match="pass rollout_func=SageRollout"):
        sage_emotion(completions=["a"])


def test_the_rollout_finds_each_prompts_profile_by_the_prompt() -> None:
    from rapo_echo.data.sage_profiles import load_profiles

    sage = SageRollout(ScriptedEngine(), system_prompt="Be kind.")
    profiles = load_profiles()[:2]
    data = sage.dataset(profiles)
    assert data.column_names == ["prompt", "profile"] and len(data) == 2
    first = data[0]["prompt"]
    opening = {"role": "user", "content": profiles[0].first_talk}
    assert first == [{"role": "system", "content": "Be kind."}, opening]
    assert sage.profile(first, 0) == profiles[0]
    assert json.loads(data[0]["profile"])["persona"] == profiles[0].persona
    assert prompt_key(first) == prompt_key(json.loads(json.dumps(first)))
    with pytest.raises(DataError, match="prompt 3 is not one of SageRollout.dataset"):
        sage.profile([{"role": "user", "content": "Hi."}], 3)
    with pytest.raises(ConfigError, match="turn_tokens must be >= 1"):
        SageRollout(ScriptedEngine(), turn_tokens=0)
