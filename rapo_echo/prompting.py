"""The policy's prompt rules, shared by the trainer's policy and the OpenRLHF dataset export."""

from __future__ import annotations

from collections.abc import Callable

from rapo_echo.types import Conversation, Scenario, msg


def policy_conversation(scenario: Scenario, system_prompt: str | None) -> Conversation:
    """``system_prompt`` (unless the scenario starts with its own system message) + the dialogue."""
    messages = list(scenario.messages)
    if system_prompt and not (messages and messages[0]["role"] == "system"):
        messages = [msg("system", system_prompt), *messages]
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
