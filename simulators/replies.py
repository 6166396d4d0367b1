"""Cleaning a role-played reply: the simulated person's words, without the other side's lines.

Shared by the reaction simulator and the benchmarks' role players (the ESConv seeker), so every place
that reads a simulated user's reply cuts it the same way.
"""

from __future__ import annotations

import re

_ROLE_TAG = re.compile(r"\b(?:Therapist|Patient|Supporter|Seeker|assistant|user)\s*:", re.I)


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
