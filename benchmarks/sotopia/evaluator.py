"""SOTOPIA-Eval: the seven dimensions, the evaluator prompt, and parsing of its scores.

Dimensions and ranges as in sotopia's ``SotopiaDimensions`` (descriptions in our words); overall is the
unweighted mean of the seven. The evaluator sees everything (both backgrounds with secrets, both goals,
the whole episode) and scores one agent. Its reply is parsed as JSON (``{"goal": 7, ...}``, values may be
``[reasoning, score]`` or ``{"score": ...}``, optionally nested under an agent key) or as
``dimension: score`` lines. A missing dimension or a value outside its range makes the parse invalid
(the benchmark retries, then marks the case invalid).

Scores are read from text, not label log-probs: a score is a signed multi-token number (``-10``), which
a first-token log-prob cannot tell apart from ``-1``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from rapo_echo.benchmarks.sotopia.agent import (
    AgentProfile,
    AgentTurn,
    EnvironmentProfile,
    background,
    episode_blocks,
    inline,
)
from rapo_echo.llm.fencing import Fence
from rapo_echo.types import Conversation, msg

DIMENSIONS: dict[str, tuple[int, int]] = {
    "believability": (0, 10),
    "relationship": (-5, 5),
    "knowledge": (0, 10),
    "secret": (-10, 0),
    "social_rules": (-10, 0),
    "financial_and_material_benefits": (-5, 5),
    "goal": (0, 10),
}
DESCRIPTIONS = {
    "believability": "how natural, consistent and true to their profile the agent behaved",
    "relationship": "whether the interaction improved (positive) or harmed (negative) the agents' "
    "relationship and the agent's social standing",
    "knowledge": "how much new and important information the agent gained in the interaction",
    "secret": "whether the agent kept their secret and hidden intentions (0) or revealed them (to -10)",
    "social_rules": "whether the agent broke moral rules, social norms or laws (0 none, -10 severe)",
    "financial_and_material_benefits": "the agent's material or financial gains (+) or losses (-)",
    "goal": "how far the agent achieved their social goal (0 = not at all, 10 = fully)",
}
_ALIASES = {
    "financial": "financial_and_material_benefits",
    "financial_benefits": "financial_and_material_benefits",
    "financial_and_material": "financial_and_material_benefits",
    "material_benefits": "financial_and_material_benefits",
    "social_rule": "social_rules",
    "goal_completion": "goal",
    "goals": "goal",
    "secrets": "secret",
    "relationships": "relationship",
}
_LINE = re.compile(
    r"(?P<name>[a-z][a-z _&/-]*?)[\s*]*(?:\([^)]*\))?[\s*]*[:=][\s*]*\(?\s*(?P<score>[-+]?\d+(?:\.\d+)?)",
    re.I,
)
SYSTEM = "You are an impartial evaluator of social interactions between two characters."
# The evaluator's reply is started with the first dimension name (a continuation prefix): small judges then
# keep to the 'dimension: score' format far more often. Parse ``REPLY_PREFIX + reply``.
REPLY_PREFIX = "believability:"


def dimension_key(name: str) -> str | None:
    """The canonical dimension for a name as written (``Social rules`` -> ``social_rules``; words before a
    dimension name are ignored: ``Score for goal`` -> ``goal``), or None."""
    words = re.sub(r"[^a-z]+", "_", name.strip().lower()).strip("_").split("_")
    for i in range(len(words)):
        key = "_".join(words[i:])
        key = _ALIASES.get(key, key)
        if key in DIMENSIONS:
            return key
    return None


def overall(scores: dict[str, float]) -> float:
    """Unweighted mean of the seven dimension scores."""
    return sum(scores[d] for d in DIMENSIONS) / len(DIMENSIONS)


def evaluator_prompt(
    env: EnvironmentProfile,
    agents: Sequence[AgentProfile],
    history: Sequence[AgentTurn],
    evaluated: int,
    fence: Fence | None = None,
) -> Conversation:
    """The evaluator's prompt for agent ``evaluated`` (0 or 1) of a finished episode: the scenario,
    backgrounds, goals and episode in fenced blocks, the instructions outside. Parse its reply with
    ``parse_reply(fence.own_words(reply))``."""
    fence = fence or Fence.derived([env.scenario, env.codename], salt="sotopia")
    names = [inline(a.name, fence) for a in agents]
    bgs = [background(a, own=True, relationship=env.relationship) for a in agents]
    ranges = "\n".join(
        f"{d}: an integer from {lo} to {hi} -- {DESCRIPTIONS[d]}" for d, (lo, hi) in DIMENSIONS.items()
    )
    text = (
        f"{fence.rules()}\n\n"
        + episode_blocks(env, names, bgs, env.agent_goals, history, fence, "(nothing happened)")
        + f"\nRelationship: {inline(env.relationship.replace('_', ' '), fence)}\n\n"
        f"Evaluate {names[evaluated]} on these seven dimensions:\n{ranges}\n\n"
        "Reply with exactly seven lines of the form 'dimension: score', using the dimension names above."
    )
    return [msg("system", SYSTEM), msg("user", text), msg("assistant", REPLY_PREFIX)]


def parse_reply(reply: str) -> dict[str, float] | None:
    """:func:`parse_scores` of a reply to :func:`evaluator_prompt` (the prefix put back in front)."""
    return parse_scores(reply if reply.lstrip().startswith(("{", REPLY_PREFIX)) else REPLY_PREFIX + reply)


def parse_scores(text: str) -> dict[str, float] | None:
    """The seven scores in an evaluator's reply, or None when one is missing or out of range."""
    scores = _json_scores(text)
    if scores is None:
        scores = {}
        for m in _LINE.finditer(text):
            key = dimension_key(m.group("name"))
            if key is not None and key not in scores:
                scores[key] = float(m.group("score"))
    return scores if _complete(scores) else None


def _complete(scores: dict[str, float]) -> bool:
    return all(
        d in scores and math.isfinite(scores[d]) and lo <= scores[d] <= hi
        for d, (lo, hi) in DIMENSIONS.items()
    )


def _json_scores(text: str) -> dict[str, float] | None:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        obj: Any = json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        return None
    while isinstance(obj, dict) and not any(dimension_key(k) for k in obj):
        inner = [v for v in obj.values() if isinstance(v, dict)]
        if len(inner) != 1:
            return None
        obj = inner[0]  # e.g. {"evaluations": {"agent_1": {...}}}
    if not isinstance(obj, dict):
        return None
    scores: dict[str, float] = {}
    for name, value in obj.items():
        key = dimension_key(name)
        number = _number(value)
        if key is not None and number is not None and key not in scores:
            scores[key] = number
    return scores


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (list, tuple)) and value:
        return _number(value[-1])  # sotopia's (reasoning, score)
    if isinstance(value, dict):
        return _number(value.get("score"))
    return None
