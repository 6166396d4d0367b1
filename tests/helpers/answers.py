"""Conforming answers for scripted simulators and evaluators: what an engine that enforces the declared
answer format (simulators/sage.py, simulators/reaction.py, benchmarks) could write."""

from __future__ import annotations

import json


def sage_analysis(shift: int | str, reaction: str = "fine") -> str:
    """The SAGE user's analysis (``emotion_readout: text``) with the integer ``shift``."""
    body = {"content": "c", "fit": "t", "mind": "a", "reaction": reaction, "shift": int(shift)}
    return json.dumps(body)


def sage_reply(text: str) -> str:
    """The SAGE user's JSON reply (``plain_reply: false``) saying ``text``."""
    return json.dumps({"decide": "t", "draft": "o", "rewrite": "shorter", "say": text}, ensure_ascii=False)


def reaction(reply: str, change: int, thought: str | None = None) -> str:
    """The reaction simulator's text-mode answer."""
    body: dict = {"reply": reply}
    if thought is not None:
        body["thought"] = thought
    body["valence_change"] = change
    return json.dumps(body, ensure_ascii=False)


def sotopia_dimension(score: int, reasoning: str = "r") -> str:
    """One SOTOPIA dimension's answer."""
    return json.dumps({"reasoning": reasoning, "score": score})


def sotopia_rules(scores: dict[str, int]) -> list[tuple[str, str]]:
    """Scripted-engine rules answering each SOTOPIA dimension's prompt with its score in ``scores``
    (rule replies are format strings: braces doubled)."""
    return [
        (
            f"on one dimension, {d.replace('_', ' ')}:",
            sotopia_dimension(v, f"about {d}").replace("{", "{{").replace("}", "}}"),
        )
        for d, v in scores.items()
    ]


SOTOPIA_SCORES = {
    "believability": 8,
    "relationship": 2,
    "knowledge": 5,
    "secret": -1,
    "social_rules": 0,
    "financial_and_material_benefits": -3,
    "goal": 7,
}
