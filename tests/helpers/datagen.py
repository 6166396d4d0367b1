"""Scripted roles for the data pipelines (datagen): a judge that answers the selection, safety
and grading prompts in text mode (the JSON verdicts a constrained engine could write), from rules on the
fenced texts it is shown."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.types import Conversation


def block(prompt: Conversation, label: str) -> str:
    """The text of the fenced block ``label`` in the prompt's last user message ('' when absent)."""
    text = next(m["content"] for m in reversed(prompt) if m["role"] == "user")
    found = re.search(rf"<<<{label} (\w+)>>>\n(.*?)\n<<<END {label} \1>>>", text, re.S)
    return found.group(2) if found else ""


def judge(
    score: Callable[[str], int],
    *,
    empathy: Callable[[str], str] = lambda dialogue: "yes",
    safety: Callable[[str], str] = lambda dialogue: "none",
    structured: bool = True,
) -> ScriptedEngine:
    """A text-mode judge: ``empathy(dialogue)`` -> yes / no, ``safety(dialogue)`` -> none or a rule,
    ``score(reply)`` -> 1-5 with the critique ``critique of <reply>``."""

    def answer(prompt: Conversation) -> str:
        asked = prompt[-1]["content"]
        if "call for an empathetic reply? Answer yes or no" in asked:
            return json.dumps({"verdict": empathy(block(prompt, "DIALOGUE"))})
        if "Which rule applies" in asked:
            return json.dumps({"verdict": safety(block(prompt, "DIALOGUE"))})
        if "reply, to grade" in asked:
            reply = block(prompt, "REPLY")
            return json.dumps({"reasoning": f"critique of {reply}"[:300], "verdict": str(score(reply))})
        raise AssertionError(f"unexpected judge prompt: {asked[-200:]}")

    return ScriptedEngine(fn=answer, structured=structured)


def rewriter(rewrite: Callable[[str, str], str]) -> ScriptedEngine:
    """A rewriter that answers ``rewrite(reply, critique)`` on the ``Rewritten reply:`` line."""

    def answer(prompt: Conversation) -> str:
        assert prompt[-1] == {"role": "assistant", "content": "Rewritten reply:"}
        return " " + rewrite(block(prompt, "REPLY"), block(prompt, "CRITIQUE"))

    return ScriptedEngine(fn=answer)


def generate_calls(engine: ScriptedEngine) -> list[int]:
    """The number of prompts of each ``generate`` call the engine received, in order."""
    return [len(c["prompts"]) for c in engine.calls if c["method"] == "generate"]
