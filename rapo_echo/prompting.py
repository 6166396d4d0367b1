"""The policy's prompt rules, shared by the trainer's policy and the OpenRLHF dataset export, and the
split of a thinking-mode reply into its thought and what is said."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rapo_echo.errors import ConfigError
from rapo_echo.text import is_blank
from rapo_echo.types import Conversation, Scenario, msg

# Persona inference (rapo_echo.rewards.persona) writes the inferred persona summary into a
# scenario's ``meta[PERSONA_KEY]``, and sets ``meta[PERSONA_PROMPT_KEY]`` when it goes to the policy.
PERSONA_KEY = "persona"
PERSONA_PROMPT_KEY = "persona_in_prompt"
PERSONA_NOTE = "What you can tell about the person so far (inferred from the conversation; it may be wrong):"


def persona_note(scenario: Scenario) -> str | None:
    """The inferred persona as a note for the policy's system prompt, when it is meant for the policy."""
    persona = scenario.meta.get(PERSONA_KEY)
    if not scenario.meta.get(PERSONA_PROMPT_KEY) or not isinstance(persona, str) or is_blank(persona):
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


def fit_prompt(
    conv: Conversation, encode: Callable[[Conversation], list[int]], max_tokens: int
) -> tuple[list[int], int]:
    """Prompt ids of at most ``max_tokens`` (:func:`fit_conversation`) and 1 when anything was cut,
    else 0."""
    _, ids, cut = fit_conversation(conv, encode, max_tokens)
    return ids, cut


def fit_conversation(
    conv: Conversation,
    encode: Callable[[Conversation], list[int]],
    max_tokens: int,
    setting: str = "rollout.max_prompt_tokens",
) -> tuple[Conversation, list[int], int]:
    """The prompt budget every caller shares (the trainer's policy, every engine call of a benchmark):
    the oldest turns are dropped first (:func:`fit_turns`); when the system prompt and the last message
    alone are still too long, the last message loses the beginning of its text (its chat header and the
    system prompt stay). Returns the kept conversation, its ids (at most ``max_tokens``) and 1 when
    anything was cut, else 0. A system prompt that leaves no room at all is a :class:`ConfigError`
    naming ``setting``."""
    kept, ids = fit_turns(conv, encode, max_tokens)
    if len(ids) <= max_tokens:
        return kept, ids, int(len(kept) < len(conv))
    head, last = kept[:-1], kept[-1]
    text = last["content"]

    def cut(drop: int) -> Conversation:
        return [*head, {**last, "content": text[drop:]}]

    def fits(drop: int) -> bool:
        return len(encode(cut(drop))) <= max_tokens

    if not fits(len(text)):
        raise ConfigError(
            f"{setting}: {max_tokens} tokens cannot hold the system prompt and chat "
            f"template alone ({len(encode(cut(len(text))))} tokens); raise it or shorten the system prompt"
        )
    # the fewest leading characters to drop so that the prompt fits: first widen a window from the
    # end (so a huge message is never encoded whole again and again), then bisect inside it
    lo, hi, keep = 0, len(text), max(max_tokens, 1)  # fits(hi) holds throughout
    while keep < len(text):
        if not fits(len(text) - keep):
            lo = len(text) - keep + 1
            break
        hi, keep = len(text) - keep, keep * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return cut(lo), encode(cut(lo)), 1


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
