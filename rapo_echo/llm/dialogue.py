"""A dialogue as plain ``Name: text`` lines for a prompt: the one renderer every judge, simulator and
reward uses; each caller names its speakers (``Person`` / ``Supporter`` for a judge, ``You`` for the
simulated user itself, the persona's name and ``Companion`` in EPM)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


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
