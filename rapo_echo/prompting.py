"""The policy's prompt rules, shared by the trainer's policy and the OpenRLHF dataset export, and the
split of a thinking-mode reply into its thought and what is said."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Thinking:
    """A reply split into its ``<think>...</think>`` part and what is said."""

    thought: str | None
    reply: str
    well_formed: bool


def split_thinking(text: str) -> Thinking:
    """Split ``<think>thought</think> reply``. Well formed: the text opens with one ``<think>``, has one
    ``</think>`` after it, and both the thought and the reply are non-empty. The reply is what follows
    the last ``</think>``; without one (a missing or cut-off thought) it is the text with any ``<think>``
    tag removed, as RLVER shows the simulator the whole output then."""
    opens, closes = text.count(THINK_OPEN), text.count(THINK_CLOSE)
    if closes:
        head, _, reply = text.rpartition(THINK_CLOSE)
        thought = head.replace(THINK_OPEN, "").strip()
    else:
        thought, reply = None, text.replace(THINK_OPEN, "")
    reply = reply.strip()
    well = (
        text.lstrip().startswith(THINK_OPEN) and opens == 1 and closes == 1 and bool(thought) and bool(reply)
    )
    return Thinking(thought or None, reply, well)
