"""One dialogue of rapo-echo's SAGE-style user with a policy, run by the real verifiers (0.4's
``verifiers.v1``): the policy is the environment's ``assistant`` agent behind verifiers' client and its
tool-less chat harness, here a scripted policy behind rapo-echo's OpenAI-compatible server; the user is
our simulator (scripted); the task's rubric scores the trace with RLVER's reward."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from tests.verifiers.conftest import need_verifiers

pytestmark = pytest.mark.verifiers

POLICY = ["That sounds so hard. What happened?", "I am here for you. Tell me more."]
ANSWER = "Thanks, that helps a bit."


def sage_user(prompt: Any) -> str:
    """+10 to the emotion per reply; answers ANSWER."""
    if "emotion right now" in prompt_text(prompt):
        return json.dumps({"content": "c", "fit": "f", "mind": "m", "reaction": "r", "shift": 10})
    return ANSWER


def one_episode(served: Any, user: ScriptedEngine, **config: Any) -> tuple[Any, Any, Any]:
    """(the environment, its first task, the episode verifiers runs of it) with the user on ``user`` and
    the scripted policy behind rapo-echo's server."""
    vf = need_verifiers()
    from rapo_echo.integrations.verifiers_sage import load_sage_env

    url = served(ScriptedEngine(replies=POLICY), "scripted-policy")
    env = load_sage_env(user, max_turns=2, **config)
    (task,) = list(env.taskset.take(1))
    ctx = vf.ModelContext(
        model="scripted-policy", client=vf.EvalClientConfig(base_url=url, api_key_var="RAPO_ECHO_NO_KEY")
    )

    async def one() -> Any:
        async with env.serving():
            return await env.run_episode(task, ctx)

    return env, task, asyncio.run(one())


def test_one_dialogue_is_scored_by_the_emotion_reward(served: Any) -> None:
    from rapo_echo.integrations.verifiers_sage import TASKSET_ID

    env, task, episode = one_episode(served, ScriptedEngine(fn=sage_user, structured=False))
    assert episode.ok, [e.message for e in episode.errors]
    (trace,) = episode.traces
    assert trace.agent.name == "assistant" and env.config.env_id == TASKSET_ID
    said = [(type(m).__name__, m.content) for m in trace.messages]
    profile = task.data.profile
    assert said == [
        ("SystemMessage", task.data.system_prompt),
        ("UserMessage", profile["first_talk"]),
        ("AssistantMessage", POLICY[0]),
        ("UserMessage", ANSWER),
        ("AssistantMessage", POLICY[1]),
    ]
    # RLVER's preset starts at 30; +10 per reply over two replies: 50 / 100
    assert trace.rewards["sage_emotion"].score == pytest.approx(0.5)
    assert trace.metrics["sage_turns"] == 2.0
    assert trace.info["sage"]["end"] == "max_turns" and trace.info["sage"]["emotions"] == [30.0, 40.0, 50.0]


def test_a_user_whose_output_never_parses_fails_the_rollout(served: Any) -> None:
    """No guessed score: the rubric raises, verifiers fails the trace (retried and counted as its own)."""
    garbled = ScriptedEngine(fn=lambda prompt: "no json here", structured=False)
    _, _, episode = one_episode(served, garbled, settings={"max_retries": 0})
    (trace,) = episode.traces
    assert not episode.ok and not trace.ok
    assert trace.rewards.get("sage_emotion") is None
    assert trace.info["sage"]["invalid"] and trace.info["sage"]["end"] == "invalid"
    assert "the simulated user's output never parsed" in " ".join(e.message for e in trace.errors)


def test_the_vf_eval_command_runs_the_environment(served: Any, tmp_path: Path) -> None:
    """``python -m rapo_echo.integrations.verifiers_sage`` is verifiers' ``vf-eval`` on the environment; the
    simulated user is named by a URL here (a served engine, as `vllm serve` would be)."""
    need_verifiers()
    policy = served(ScriptedEngine(replies=POLICY), "scripted-policy")
    user = served(ScriptedEngine(fn=sage_user, structured=False), "sage-user")
    args = [
        "--model", "scripted-policy", "--client.base-url", policy, "--client.api-key-var", "RAPO_ECHO_NO_KEY",
        "-n", "1", "-r", "1", "--env.simulator", user, "--env.max-turns", "2",
        # the change is read from the analysis's own number: a scripted user behind a server has no log-probs
        "--env.settings", json.dumps({"emotion_readout": "text"}),
        "--no-push", "--no-rich", "-o", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "rapo_echo.integrations.verifiers_sage", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (traces,) = list(tmp_path.rglob("traces.jsonl"))
    (line,) = traces.read_text().splitlines()  # one episode of one trace
    (trace,) = json.loads(line)["traces"]
    assert trace["rewards"]["sage_emotion"]["score"] == pytest.approx(0.5)
    assert trace["info"]["sage"]["end"] == "max_turns"
