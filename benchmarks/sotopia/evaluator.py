"""SOTOPIA-Eval: the seven dimensions, the evaluator prompt, and its declared answer.

Dimensions and ranges as in sotopia's ``SotopiaDimensions`` (descriptions in our words); overall is the
unweighted mean of the seven. The evaluator sees both backgrounds, both goals and the whole episode and
scores one agent, one dimension per prompt, as ``{"reasoning": "...", "score": N}`` under a schema
(:func:`dimension_format`). One prompt per dimension rather than one object for all seven: each answer
stays short (at most :data:`REASONING_CHARS` of reasoning), the engine enforces each dimension's own
range, a small evaluator faces one rubric at a time, and a failed dimension is asked again alone; the
cost is seven prefills of the episode instead of one.

Scores are read from text under the schema, not from label log-probs: a score is a signed multi-token
number (``-10``), which a first-token log-prob cannot tell apart from ``-1``."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rapo_echo.benchmarks.sotopia.agent import (
    AgentProfile,
    AgentTurn,
    EnvironmentProfile,
    background,
    episode_blocks,
    inline,
)
from rapo_echo.llm.fencing import Fence
from rapo_echo.structured import AnswerFormat
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
REASONING_CHARS = 300  # the longest reasoning an answer may hold
SYSTEM = "You are an impartial evaluator of social interactions between two characters."


def dimension_format(dimension: str) -> AnswerFormat:
    """The answer to one dimension's prompt: ``{"reasoning": str, "score": int in the range}``, written in
    that order (reasoning first)."""
    lo, hi = DIMENSIONS[dimension]
    props = {
        "reasoning": {"type": "string", "minLength": 1, "maxLength": REASONING_CHARS},
        "score": {"type": "integer", "minimum": lo, "maximum": hi},
    }
    return AnswerFormat.json_object(props, name=f"sotopia_{dimension}")


def overall(scores: dict[str, float]) -> float:
    """Unweighted mean of the seven dimension scores."""
    return sum(scores[d] for d in DIMENSIONS) / len(DIMENSIONS)


def evaluator_prompt(
    env: EnvironmentProfile,
    agents: Sequence[AgentProfile],
    history: Sequence[AgentTurn],
    evaluated: int,
    dimension: str,
    fence: Fence | None = None,
) -> Conversation:
    """The evaluator's prompt for ``dimension`` of agent ``evaluated`` (0 or 1) of a finished episode:
    the scenario, backgrounds, goals and episode in fenced blocks, the instructions outside. Read its
    answer with ``read_score(dimension, fence.own_words(reply))``."""
    fence = fence or Fence.derived([env.scenario, env.codename], salt="sotopia")
    names = [inline(a.name, fence) for a in agents]
    bgs = [background(a, own=True, relationship=env.relationship) for a in agents]
    lo, hi = DIMENSIONS[dimension]
    label = dimension.replace("_", " ")
    text = (
        f"{fence.rules()}\n\n"
        + episode_blocks(env, names, bgs, env.agent_goals, history, fence, "(nothing happened)")
        + f"\nRelationship: {inline(env.relationship.replace('_', ' '), fence)}\n\n"
        f"Evaluate {names[evaluated]} on one dimension, {label}: {DESCRIPTIONS[dimension]}.\n"
        f"First reason briefly (at most {REASONING_CHARS} characters) about what in the episode bears on "
        f"it, then give the score, an integer from {lo} to {hi}.\n"
        'Answer with one JSON object and nothing else: {"reasoning": "...", "score": N}'
    )
    return [msg("system", SYSTEM), msg("user", text)]


def read_score(dimension: str, text: str) -> float | None:
    """The score of one dimension's answer (``{"reasoning": ..., "score": N}`` with N in range), or None."""
    value = dimension_format(dimension).parse(text)
    return None if value is None else float(value["score"])


def complete(scores: dict[str, float]) -> bool:
    """Whether ``scores`` holds every dimension, finite and in its range."""
    return all(
        d in scores and math.isfinite(scores[d]) and lo <= scores[d] <= hi
        for d, (lo, hi) in DIMENSIONS.items()
    )
