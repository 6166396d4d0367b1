"""Persona inference logs how often it failed per step (``persona/invalid``), and Echo-N1's router
shows its share per domain (``reward/echo_n1/route/...``); our bundled chit-chat scenarios reach the
humanlike judge (issue 31 item 23)."""

from __future__ import annotations

import json
import math

import pytest

from rapo_echo.algorithms.grpo import reward_stats
from rapo_echo.data import load_scenarios
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.rewards import RewardContext, RewardSet
from rapo_echo.rewards.echo_n1 import EchoN1Reward, scenario_domain
from rapo_echo.rewards.persona import PersonaInference
from rapo_echo.types import Sample, Scenario, msg
from tests.helpers.runs import SMALL, metrics, run_config
from tests.unit.rewards.test_echo_n1_rewards import NEED_RULES, comparer
from tests.unit.rewards.test_persona import RULES


def test_persona_step_metrics_count_this_steps_failures() -> None:
    persona = PersonaInference(ScriptedEngine(rules=RULES[:2], default=" ..."), max_retries=0)
    persona.annotate([Scenario("a", [msg("user", "My boss took credit again.")])])
    assert persona.step_metrics() == {"persona/inferred": 1.0, "persona/invalid": 1.0}
    assert persona.step_metrics() == {"persona/inferred": 0.0, "persona/invalid": 0.0}  # per step


def test_trainer_logs_persona_invalid_every_step(tmp_path, tiny_folder) -> None:
    from rapo_echo.training.run import Run

    rules = "[" + ", ".join(f"['{p}', '{r}']" for p, r in RULES[:2]) + "]"
    cfg = run_config(
        tiny_folder,
        tmp_path / "run",
        "data.limit=2",
        *SMALL,
        "rollout.max_new_tokens=2",
        "persona.enabled=true",
        "persona.max_retries=0",
        "simulator.engine=scripted",
        f"simulator.script={{rules: {rules}, default: ' ...'}}",
        "train.max_steps=1",
    )
    Run(cfg).train()
    lines = metrics(tmp_path / "run")
    step = next(line for line in lines if "persona/invalid" in json.dumps(line))
    flat = step.get("metrics", step)
    assert flat["persona/invalid"] == 2.0 and flat["persona/inferred"] == 2.0


def test_bundled_chitchat_scenarios_route_to_the_humanlike_judge_and_the_share_is_shown() -> None:
    chat = load_scenarios("bundled:chitchat_en.jsonl")
    assert len(chat) >= 6 and all(scenario_domain(sc, "domain", "empathy") == "chitchat" for sc in chat)
    emp = load_scenarios()[0]
    assert scenario_domain(emp, "domain", "empathy") == "empathy"

    def fn(prompt, options):
        if " human" in options:
            return {" human": math.log(0.8), " AI": math.log(0.2)}
        return comparer({})(prompt, options)

    ctx = RewardContext(judge=ScriptedEngine(rules=NEED_RULES, choice_fn=fn))
    rewards = RewardSet([(EchoN1Reward(ctx), 1.0)])
    emp = Scenario(emp.id, emp.messages, emp.profile, "I'm so sorry.", emp.meta)
    samples = [Sample(sc, i, [1], [2], None, "oh nice!") for i, sc in enumerate([chat[0], chat[1], emp, emp])]
    rewards.score(samples)
    stats = reward_stats(samples, rewards.names)
    assert stats["reward/echo_n1/route/humanlike"] == pytest.approx(0.5)
    assert stats["reward/echo_n1/route/empathy"] == pytest.approx(0.5)
    only_empathy = samples[2:]
    assert reward_stats(only_empathy, rewards.names)["reward/echo_n1/route/humanlike"] == 0.0  # shown as 0
