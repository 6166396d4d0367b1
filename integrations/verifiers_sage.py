"""rapo-echo's SAGE-style simulated user and its emotion reward as a verifiers environment (verifiers 0.4's
``verifiers.v1``: a :class:`~verifiers.v1.Taskset` of SAGE profiles and an :class:`~verifiers.v1.Env`
whose ``run`` is the dialogue loop); the command and what it does: docs/integrations.md, "verifiers: the
SAGE-style user as an environment".

The user is not a verifiers agent but the caller of the assistant's interaction, so its turns are user
messages of the assistant's trace: never trained on. verifiers loads a taskset by importing its id as a
top-level module; ``rapo_echo.integrations`` is not one, so this module registers itself as
:data:`TASKSET_ID` when imported.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

import verifiers.v1 as vf
from pydantic import Field

from rapo_echo.algorithms.rlver_config import RLVER_SYSTEM_PROMPT
from rapo_echo.data.sage_profiles import SageProfile, load_profiles
from rapo_echo.engines import ChatEngine
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.integrations.trl_rewards import role_engine
from rapo_echo.simulators.sage import SageDialogue, SageSettings, SageSimulator

TASKSET_ID = "rapo_echo_sage"
STATE = "sage"  # the trace's info key holding the dialogue's state


class SageTaskData(vf.TaskData):
    """One simulated user: its SAGE profile."""

    profile: dict[str, Any] = Field(default_factory=dict)


class SageTask(vf.Task[SageTaskData]):
    """A dialogue with one simulated user; the rubric reads the state the environment leaves on the
    trace (``trace.info["sage"]``)."""

    @vf.reward
    async def sage_emotion(self, trace: vf.Trace) -> float:
        """RLVER's reward: the dialogue's final emotion / 100, floored at 0."""
        state = trace.info.get(STATE)
        if not state or state.get("invalid"):
            why = "the simulated user's output never parsed" if state else "no dialogue ran"
            raise RuntimeError(f"sage_emotion: {why}; the rollout has no score")
        return float(state["reward"])

    @vf.metric
    async def sage_turns(self, trace: vf.Trace) -> float:
        """The assistant's replies the user reacted to."""
        return float((trace.info.get(STATE) or {}).get("turns", 0))


class SageTasksetConfig(vf.TasksetConfig):
    profiles: str | None = None
    """A profile file (RLVER / SAGE rows or rapo-echo's); unset: rapo-echo's bundled English profiles."""
    system_prompt_text: str | None = RLVER_SYSTEM_PROMPT
    """The assistant's system prompt (RLVER's by default); empty: none."""


class SageTaskset(vf.Taskset[SageTask, SageTasksetConfig]):
    """The SAGE profiles, one task each (the user opens, so a task has no prompt)."""

    def load(self) -> Iterable[SageTask]:
        for p in load_profiles(self.config.profiles):
            data = SageTaskData(
                id=p.id, name=p.id, system_prompt=self.config.system_prompt_text or None, profile=asdict(p)
            )
            yield SageTask(data, self.config.task)


class SageUserEnvConfig(vf.EnvConfig):
    assistant: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, runtime={"type": "subprocess"})
    """The policy under evaluation or training: the tool-less chat harness, run on this machine (it
    executes no code); ``--env.assistant.runtime.type docker`` (or ``prime``) runs it elsewhere."""
    simulator: str = "default"
    """The simulated user's engine: default, a folder, a .gguf file, a hub id or an http(s):// endpoint."""
    preset: str = "rlver"
    """The user's preset: rlver (RLVER's training simulator) or sage (SAGE's evaluation simulator)."""
    max_turns: int | None = None
    """The assistant's replies a dialogue allows (unset: the preset's)."""
    settings: dict[str, Any] = Field(default_factory=dict)
    """Other SageSettings fields (max_new_tokens, temperature, plain_reply, emotion_readout, ...)."""
    seed: int = 0


class SageUserEnv(vf.Env[SageUserEnvConfig]):
    """The dialogue loop (module doc)."""

    def __init__(self, config: SageUserEnvConfig) -> None:
        super().__init__(config)
        values = {"emotion_readout": "auto", "plain_reply": True, **config.settings}
        if config.max_turns is not None:
            values["max_turns"] = config.max_turns
        try:
            self.settings = SageSettings.from_mapping({"preset": config.preset, **values}, "env settings")
        except DataError as exc:
            raise ConfigError(str(exc)) from None
        self.engine: Any = None  # the simulated user's engine, loaded when the first dialogue starts
        self.lock = asyncio.Lock()  # our engines are not safe to call from two threads at once

    async def _simulate(self, fn: Any, *args: Any) -> Any:
        async with self.lock:
            return await asyncio.to_thread(fn, *args)

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        if self.engine is None:
            self.engine = await self._simulate(role_engine, self.config.simulator)
        sim = SageSimulator(self.engine, self.settings, seed=self.config.seed)
        profile = SageProfile(**task.data.profile)
        (user,) = await self._simulate(sim.start, [profile], [task.data.id or "dialogue"])
        async with agents.assistant.interaction(task) as assistant:
            record(assistant.trace, user)
            while not user.done:
                segment = await assistant.turn(user.history[-1]["content"])
                if segment.terminated:
                    break
                await self._simulate(sim.step, [user], [segment.last_reply])
                record(assistant.trace, user)


def record(trace: vf.Trace, user: SageDialogue) -> None:
    """The dialogue's state where the rubric reads it."""
    trace.info[STATE] = {
        "reward": user.reward,
        "emotion": user.emotion,
        "emotions": list(user.emotions),
        "turns": user.turns,
        "end": user.reason,
        "invalid": user.invalid,
    }


def register() -> None:
    """Make this module importable as :data:`TASKSET_ID`, the name verifiers imports a taskset by."""
    sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])


def load_sage_env(simulator: str | ChatEngine = "default", **config: Any) -> SageUserEnv:
    """The environment, configured as ``--env.*`` would (``preset``, ``max_turns``, ``taskset`` fields
    such as ``{"profiles": FILE}``, ...); ``simulator`` is a model spec or an engine object."""
    register()
    taskset = {"id": TASKSET_ID, **config.pop("taskset", {})}
    spec = simulator if isinstance(simulator, str) else getattr(simulator, "name", "engine")
    env = SageUserEnv(SageUserEnvConfig(taskset=taskset, simulator=spec, **config))
    if not isinstance(simulator, str):
        env.engine = simulator
    return env


__all__ = ["SageTaskset", "SageUserEnv"]

register()

if __name__ == "__main__":
    from verifiers.v1.cli.eval.main import main

    main([TASKSET_ID, *sys.argv[1:]])
