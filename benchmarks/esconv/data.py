"""Whole ESConv conversations for the ESConv benchmarks, read by the one ESConv parser.

Every accepted file (raw ``ESConv.json``, ``FailedESConv.json``, the reformatted PPDPP / thu-coai
schema, Hugging Face ``thu-coai/esconv`` rows; see shared/data/esconv/PROVENANCE.md) is parsed by
:func:`rapo_echo.data.load_dialogues`, the reader training uses too. The benchmark's view of a
conversation: whitespace inside each utterance and the situation squashed to single spaces, and
consecutive utterances of one speaker merged into one turn joined by a space, so turns alternate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapo_echo.benchmarks.esconv.seeker import SEEKER, SUPPORTER, SeekerProfile
from rapo_echo.data import Dialogue, load_dialogues

SPEAKERS = {"user": SEEKER, "assistant": SUPPORTER}  # Dialogue roles -> the benchmark's speakers


@dataclass
class EsconvConversation:
    """One ESConv conversation: the seeker's profile and the alternating turns ``(speaker, text)``."""

    id: str
    profile: SeekerProfile
    turns: list[tuple[str, str]]
    meta: dict[str, Any] = field(default_factory=dict)


def read_esconv(path: str | Path) -> list[EsconvConversation]:
    """Every conversation in an ESConv-format file (JSON list or JSON lines), ids ``<stem>-<index>``."""
    return [conversation(d) for d in load_dialogues(path)]


def conversation(dialogue: Dialogue) -> EsconvConversation:
    """The benchmark's view of one parsed conversation (``meta``: ``source`` = where it was read,
    ``experience_type`` when the file has one)."""
    turns = [(SPEAKERS[t.role], t.content) for t in dialogue.turns(sep=" ", squash_whitespace=True)]
    p = dialogue.profile
    profile = SeekerProfile(p["emotion_type"], p["problem_type"], " ".join(p["situation"].split()))
    meta = {"source": dialogue.where}
    if "experience_type" in p:
        meta["experience_type"] = p["experience_type"]
    return EsconvConversation(dialogue.id, profile, turns, meta)
