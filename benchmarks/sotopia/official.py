"""SOTOPIA's own evaluator as the scorer (``eval --benchmark sotopia --scorer sotopia``), so that a figure
can be compared with the literature.

Needs the official ``sotopia`` package (``pip install 'rapo-echo[sotopia]'``); it is imported only when
this scorer is chosen. Its episode evaluator calls its own model through litellm: ``--sotopia-model`` names
it in sotopia's way (``gpt-4o``, or ``custom/<model>@<base_url>`` for an OpenAI-compatible server). A
figure comparable with the published ones needs a GPT-4-class evaluator (the SOTOPIA paper's). The code
reads the package's public classes: ``EpisodeLLMEvaluator`` with ``EvaluationForAgents`` (newer releases)
or ``ReachGoalLLMEvaluator`` with ``EvaluationForTwoAgents`` (older ones), both over
``SotopiaDimensions``, called as ``await evaluator.__acall__(turn_number, messages=None, history=text,
temperature=0.0)``, which answers ``[(agent_key, ((dimension, score), reasoning)), ...]`` with agent keys
``agent_1`` / ``agent_2``. Scores outside a dimension's range, or a missing dimension, make the case
invalid, as with our own evaluator.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Sequence
from typing import Any

from rapo_echo.benchmarks.sotopia.agent import AgentProfile, AgentTurn, EnvironmentProfile, background
from rapo_echo.benchmarks.sotopia.evaluator import DIMENSIONS, complete
from rapo_echo.errors import ConfigError

INSTALL_HINT = "the sotopia scorer needs the official package: pip install 'rapo-echo[sotopia]'"
DEFAULT_MODEL = "gpt-4o"


def load_evaluator(model: str) -> Any:
    """An instance of sotopia's episode evaluator over its seven dimensions, for ``model``; a
    :class:`ConfigError` with the install line when the package is missing or has neither API."""
    try:
        evaluators = importlib.import_module("sotopia.envs.evaluators")
    except ImportError as exc:
        raise ConfigError(f"{INSTALL_HINT} ({exc})") from None
    dims = getattr(evaluators, "SotopiaDimensions", None)
    if dims is None:
        try:
            dims = importlib.import_module("sotopia.database").SotopiaDimensions
        except (ImportError, AttributeError):
            dims = None
    pairs = (
        ("EpisodeLLMEvaluator", "EvaluationForAgents"),
        ("ReachGoalLLMEvaluator", "EvaluationForTwoAgents"),
    )
    for evaluator_name, form_name in pairs:
        evaluator, form = getattr(evaluators, evaluator_name, None), getattr(evaluators, form_name, None)
        if evaluator is not None and form is not None and dims is not None:
            return evaluator(model, response_format_class=form[dims])
    raise ConfigError(
        "the installed sotopia package has no EpisodeLLMEvaluator / ReachGoalLLMEvaluator with "
        f"SotopiaDimensions; {INSTALL_HINT}"
    )


def episode_text(
    env: EnvironmentProfile, agents: Sequence[AgentProfile], history: Sequence[AgentTurn]
) -> str:
    """The episode as the plain text sotopia's evaluator reads: scenario, participants, both full
    backgrounds and goals, then one line per turn."""
    names = [a.name for a in agents]
    lines = [f"Scenario: {env.scenario}", f"Participants: {names[0]} and {names[1]}"]
    for k in range(2):
        lines.append(
            f"{names[k]}'s background: {background(agents[k], own=True, relationship=env.relationship)}"
        )
    for k in range(2):
        lines.append(f"{names[k]}'s goal: {env.agent_goals[k]}")
    lines += [f"Turn #{t.number}: {t.action.describe(names[t.agent])}" for t in history]
    return "\n".join(lines)


def agent_scores(responses: Any, evaluated: int) -> tuple[dict[str, float] | None, str]:
    """The seven scores of agent ``evaluated`` (0 or 1) in the evaluator's answer, and its reasoning; the
    scores are None when one is missing, not a number or out of range."""
    key = f"agent_{evaluated + 1}"
    scores: dict[str, float] = {}
    notes = []
    for item in responses or ():
        try:
            who, ((dimension, score), reasoning) = item
        except (TypeError, ValueError):
            continue
        if who != key or dimension not in DIMENSIONS or isinstance(score, bool):
            continue
        if isinstance(score, (int, float)) and dimension not in scores:
            scores[dimension] = float(score)
            notes.append(f"{dimension}: {reasoning}")
    return (scores if complete(scores) else None), "\n".join(notes)


def official_scores(
    evaluator: Any,
    episodes: Sequence[tuple[EnvironmentProfile, Sequence[AgentProfile], Sequence[AgentTurn], int]],
) -> list[tuple[dict[str, float] | None, str]]:
    """Each episode ``(env, agents, history, evaluated)`` scored by sotopia's evaluator (concurrently)."""

    async def one(env: Any, agents: Any, history: Any) -> Any:
        return await evaluator.__acall__(
            len(history), messages=None, history=episode_text(env, agents, history), temperature=0.0
        )

    async def every() -> list[Any]:
        return await asyncio.gather(*(one(env, agents, history) for env, agents, history, _ in episodes))

    answers = asyncio.run(every())
    return [agent_scores(a, e[3]) for a, e in zip(answers, episodes)]
