"""The EPM benchmark's simulated user: a person from a persona card who tells a staged story.

The simulator LLM plays the person: it sees its card (outer persona and inner core, empathy threshold,
need priorities, background and situation), the dialogue so far and the director's note for this turn
(:mod:`.director` releases the story's stages and memories), all inside fenced blocks, and writes the
person's next message."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rapo_echo.llm.dialogue import render_dialogue, turn_messages
from rapo_echo.llm.fencing import Fence
from rapo_echo.types import Conversation, msg

USER = "user"
COMPANION = "companion"
Turn = tuple[str, str]  # (USER or COMPANION, text)

USER_SYSTEM = (
    "You play a real person in a chat with a companion, a friend-like listener. You are not an "
    "assistant and you never help the companion. Speak as the person on your card, in the first person, "
    "in one to three plain spoken sentences. Let your story come out gradually, never all at once. Your "
    "empathy threshold decides how easily you open up: with a high threshold, generic comfort or advice "
    "leaves you cold and you say so. React honestly to what the companion just said, and never repeat a "
    "sentence you already said."
)


@dataclass(frozen=True)
class Stage:
    """One part of the person's story, released by the director."""

    title: str
    content: str


@dataclass(frozen=True)
class PersonaCard:
    """A simulated person: ``card`` is the text the simulator and the judge read; ``stages`` and
    ``memories`` are released over the dialogue; ``iedr`` are the case's own initial-deficit levels
    (None: the judge fills them); ``meta`` carries labels for breakdowns (dominant axis, difficulty,
    threshold, category, source)."""

    id: str
    name: str
    card: str
    stages: tuple[Stage, ...] = ()
    memories: tuple[str, ...] = ()
    opening: str | None = None
    iedr: dict[str, int] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def user_prompt(
    card: PersonaCard,
    turns: Sequence[Turn],
    note: tuple[str, str] | None = None,
    *,
    rng: random.Random | None = None,
) -> Conversation:
    """The simulator's prompt for the person's next message. ``note`` is the director's
    ``(instruction, material)`` for this turn: the instruction is ours, the material (a story stage or
    memory from the case file) goes inside a fence."""
    fence = Fence(rng=rng)
    body = f"Your card:\n{fence.block('CARD', card.card)}\n\n"
    if turns:
        dialogue = render_dialogue(turn_messages(turns, USER), card.name, "Companion")
        body += f"The conversation so far:\n{fence.block('DIALOGUE', dialogue)}\n\n"
    else:
        opening = f" about {card.opening}" if card.opening else ""
        body += f"Nothing has been said yet: you start the conversation{opening}.\n\n"
    if note is not None:
        instruction, material = note
        body += f"{instruction}\n{fence.block('STORY', material)}\n\n"
    body += f"Write {card.name}'s next message only."
    return [msg("system", USER_SYSTEM + " " + fence.rules()), msg("user", body)]


def clean_user_reply(text: str, name: str) -> str:
    """The person's message: a leading ``Name:`` tag dropped, cut where the model starts writing the
    companion's (or a new ``Name:``) line, surrounding quotes and whitespace stripped."""
    text = text.strip()
    own = re.compile(rf"^\s*(?:{re.escape(name)}|user|me)\s*:\s*", re.I)
    text = own.sub("", text, count=1)
    cut = re.search(rf"(?:^|\n|\s)(?:Companion|Assistant|{re.escape(name)})\s*:", text, re.I)
    if cut:
        text = text[: cut.start()]
    return text.strip().strip('"').strip()
