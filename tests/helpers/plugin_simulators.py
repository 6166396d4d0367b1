"""Simulator plugins used by the tests, loaded by dotted path like a user's own module would be."""

from __future__ import annotations

from rapo_echo.llm.reaction import Reaction
from rapo_echo.simulators.base import UserSimulator

CONSTRUCTED: list[str] = []


class EveryOtherInvalid(UserSimulator):
    """Reacts warmly to even items, returns None (invalid) for odd ones; records what it was given."""

    def __init__(self, engine=None, scale: float = 10.0, warmth: float = 3.0) -> None:
        self.engine, self.scale, self.warmth = engine, scale, warmth

    def react(self, pairs):
        return [
            Reaction(f"thanks about {s.id}", self.warmth, "nice") if i % 2 == 0 else None
            for i, (s, _reply) in enumerate(pairs)
        ]


class Declared:
    """Duck-typed plugin: declares itself with the marker attribute instead of subclassing."""

    rapo_echo_simulator = True

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def react(self, pairs):
        return [Reaction("ok", 0.0) for _ in pairs]


class Undeclared:
    """Has a react method but does not declare itself a simulator: must never be constructed."""

    def __init__(self) -> None:
        CONSTRUCTED.append("Undeclared")

    def react(self, pairs):
        return []


class OutOfRange(UserSimulator):
    def react(self, pairs):
        return [Reaction("wow", 50.0), Reaction("meh", float("nan")), Reaction("fine", -10.0)][: len(pairs)]
