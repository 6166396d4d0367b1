"""The answer formats the vLLM tier asks for (one of each kind), and prompts that an unconstrained model
answers in free text (so an answer in the format shows enforcement, not luck)."""

from __future__ import annotations

from rapo_echo.structured import AnswerFormat

FORMATS = [
    AnswerFormat.json_object(
        {
            "score": {"type": "integer", "minimum": 1, "maximum": 5},
            "reason": {"type": "string", "maxLength": 30},
        },
        name="score",
    ),
    AnswerFormat.choice(["better", "worse", "tie"], name="verdict"),
    AnswerFormat.integer(1, 10, name="rating"),
    AnswerFormat.regex(r"[A-D]\) [a-z]{2,12}", name="option"),
]

PROMPTS = [
    [{"role": "user", "content": "Tell me about your weekend in a few sentences."}],
    [{"role": "user", "content": "I feel a bit lonely since I moved to a new city."}],
]
