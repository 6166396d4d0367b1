"""The policy's prompt rules, shared by the trainer's policy and the OpenRLHF dataset export."""

from __future__ import annotations

from collections.abc import Callable

from rapo_echo.types import Conversation, Scenario, msg

# Persona inference (rapo_echo.simulators.persona) writes the inferred persona summary into a
# scenario's ``meta[PERSONA_KEY]``, and sets ``meta[PERSONA_PROMPT_KEY]`` when it goes to the policy.
PERSONA_KEY = "persona"
PERSONA_PROMPT_KEY = "persona_in_prompt"
PERSONA_NOTE = "What you can tell about the person so far (inferred from the conversation; it may be wrong):"


def persona_note(scenario: Scenario) -> str | None:
    """The inferred persona as a note for the policy's system prompt, when it is meant for the policy."""
    persona = scenario.meta.get(PERSONA_KEY)
    if not scenario.meta.get(PERSONA_PROMPT_KEY) or not isinstance(persona, str) or not persona.strip():
        return None
    return f"{PERSONA_NOTE}\n{persona.strip()}"


def policy_conversation(
    scenario: Scenario, system_prompt: str | None, *, with_persona: bool = True
) -> Conversation:
    """``system_prompt`` (unless the scenario starts with its own system message) + the dialogue; the
    inferred persona note, if any (and ``with_persona``), is appended to the system message."""
    messages = list(scenario.messages)
    note = persona_note(scenario) if with_persona else None
    if messages and messages[0]["role"] == "system":
        if note:
            messages[0] = msg("system", f"{messages[0]['content']}\n\n{note}")
    elif system_prompt or note:
        messages = [msg("system", "\n\n".join(x for x in (system_prompt, note) if x)), *messages]
    return messages


def fit_turns(
    conv: Conversation, encode: Callable[[Conversation], list[int]], max_tokens: int
) -> tuple[Conversation, list[int]]:
    """Drop the oldest turns (never a leading system message or the last message) until the encoded
    prompt fits ``max_tokens``; returns the kept turns and their ids (which may still be longer when
    the system prompt and last message alone exceed it)."""
    ids = encode(conv)
    head = 1 if conv and conv[0]["role"] == "system" else 0
    while len(ids) > max_tokens and len(conv) - head > 1:
        conv = conv[:head] + conv[head + 1 :]
        ids = encode(conv)
    return conv, ids
