"""Dialogue text in and out of prompts: :func:`render_dialogue`, a dialogue as plain ``Name: text`` lines
(the one renderer every judge, simulator and reward uses; each caller names its speakers: ``Person`` /
``Supporter`` for a judge, ``You`` for the simulated user itself, the persona's name and ``Companion``
in EPM), and :func:`clean_reply`, a role-played reply cut where the model starts the other side."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

# a speaker's tag, as role-play replies write it
_ROLE_TAG = re.compile(r"\b(?:Therapist|Patient|Supporter|Seeker|assistant|user)\s*:", re.I)


def render_dialogue(
    messages: Sequence[Mapping[str, str]],
    user: str = "Person",
    assistant: str = "Supporter",
    empty: str = "",
) -> str:
    """``messages`` (``role`` / ``content`` mappings) as one ``Name: text`` line each, ``user`` and
    ``assistant`` naming the two roles (system messages are left out); ``empty`` when no line is left."""
    names = {"user": user, "assistant": assistant}
    return "\n".join(f"{names[m['role']]}: {m['content']}" for m in messages if m["role"] in names) or empty


def turn_messages(turns: Sequence[tuple[str, str]], user: str = "user") -> list[dict[str, str]]:
    """``(speaker, text)`` turns as chat messages: the ``user`` speaker's turns as role ``user``, every
    other speaker's as role ``assistant`` (EPM keeps its dialogues as such turns)."""
    return [{"role": "user" if who == user else "assistant", "content": text} for who, text in turns]


def clean_reply(text: str) -> str:
    """A role-play reply cut where the model starts writing the other side (``Therapist:`` ...), with a
    leading role tag of its own removed and whitespace stripped."""
    text = text.strip()
    first = _ROLE_TAG.match(text)
    if first:
        text = text[first.end() :].strip()
    later = _ROLE_TAG.search(text)
    if later:
        text = text[: later.start()]
    return text.strip()
