"""The EPM director: decides, after every turn, what the simulated person does next.

Actions (our reduction of the published director's function calls): ``story`` (reveal the next story
stage), bring back a ``memory``, ``wait`` or ``end`` the conversation; one word each, single tokens in
common vocabularies, so label probabilities need one forward pass. ``end`` counts only from
``min_turns`` on (the published rule); ``story`` or ``memory`` with none left become ``wait``. The
``llm`` director reads the action from its model's label probabilities (or parses it from text, with
retries; an unparseable answer is counted and taken as ``wait``); the ``schedule`` director reveals a
stage every ``stage_every`` turns and never ends."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from rapo_echo.benchmarks.epm.user import USER, PersonaCard, Turn
from rapo_echo.llm.dialogue import render_dialogue, turn_messages
from rapo_echo.llm.fencing import Fence
from rapo_echo.types import Conversation, msg

ACTIONS = ("story", "memory", "wait", "end")
DIRECTOR_SYSTEM = (
    "You direct a role-play in which a simulated person talks with a companion. After each exchange you "
    "decide what the person does next so that their story unfolds like a real conversation: reveal the "
    "next part of their story when the conversation has room for it, bring back a memory when it would "
    "deepen the topic, wait while the current thread is still alive, and end only when the conversation "
    "has come to a natural close."
)
REVEAL_NOTE = (
    "Bring this next part of your story into your message, in your own words and only as much as fits:"
)
MEMORY_NOTE = "If it fits, mention this memory of yours in your message, in your own words:"


def parse_action(text: str) -> str | None:
    """The earliest action word in the director's reply (case-insensitive), or None."""
    lowered = text.lower()
    hits = [(lowered.find(a), a) for a in ACTIONS if a in lowered]
    return min(hits)[1] if hits else None


@dataclass
class DirectorState:
    """What the director has released so far for one case."""

    stages_released: int = 0
    memories_released: int = 0
    actions: list[dict[str, object]] = field(default_factory=list)


def director_prompt(
    card: PersonaCard,
    turns: Sequence[Turn],
    state: DirectorState,
    status: str,
    *,
    rng: random.Random | None = None,
) -> Conversation:
    """The director's prompt: the story plan (titles only), the dialogue, the EPM status line."""
    fence = Fence(rng=rng)
    titles = [
        f"{i + 1}. {s.title}" + (" (already revealed)" if i < state.stages_released else "")
        for i, s in enumerate(card.stages)
    ]
    plan = "\n".join(titles) or "(no stages)"
    left = len(card.memories) - state.memories_released
    dialogue = render_dialogue(turn_messages(turns, USER), card.name, "Companion")
    body = (
        f"The person is {card.name}. Their story, in stages:\n{fence.block('PLAN', plan)}\n"
        f"Memories not yet used: {left}.\n\n"
        f"The conversation so far:\n{fence.block('DIALOGUE', dialogue)}\n\n"
        f"{status}\n\nWhat should the person do next? Answer with one word: story (reveal the next stage), "
        "memory, wait or end."
    )
    return [msg("system", DIRECTOR_SYSTEM + " " + fence.rules()), msg("user", body)]


def apply_action(
    action: str, card: PersonaCard, state: DirectorState, turn: int, min_turns: int
) -> tuple[str, tuple[str, str] | None]:
    """The action that takes effect (``end`` before ``min_turns`` and exhausted stages/memories become
    ``wait``) and the note for the person's next message."""
    if action == "end" and turn < min_turns:
        action = "wait"
    if action == "story" and state.stages_released >= len(card.stages):
        action = "wait"
    if action == "memory" and state.memories_released >= len(card.memories):
        action = "wait"
    note: tuple[str, str] | None = None
    if action == "story":
        stage = card.stages[state.stages_released]
        state.stages_released += 1
        note = (REVEAL_NOTE, f"{stage.title}: {stage.content}" if stage.title else stage.content)
    elif action == "memory":
        note = (MEMORY_NOTE, card.memories[state.memories_released])
        state.memories_released += 1
    return action, note


def scheduled_action(turn: int, every: int) -> str:
    """The schedule director's action after ``turn``: a story stage every ``every`` turns, else wait."""
    return "story" if turn % every == 0 else "wait"
