"""Which answer format each engine call declared: wrap an engine's ``generate`` to record them."""

from __future__ import annotations

from typing import Any

from rapo_echo.structured import AnswerFormat


def record_formats(engine: Any) -> list[AnswerFormat | None]:
    """Wrap ``engine.generate`` in place; the returned list gets each call's declared answer format."""
    seen: list[AnswerFormat | None] = []
    inner = engine.generate

    def generate(prompts, params):
        seen.append(params.answer_format)
        return inner(prompts, params)

    engine.generate = generate
    return seen
