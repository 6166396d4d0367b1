"""Read whole ESConv conversations from any of the published schemas.

Accepted files (see shared/data/esconv/PROVENANCE.md):

* raw ``ESConv.json``: a JSON list of conversations with ``dialog`` items ``{speaker: seeker|supporter,
  content, annotation}``;
* ``FailedESConv.json``: the same with speakers ``speaker`` / ``listener``;
* the reformatted schema (PPDPP ``esc-*.txt``, thu-coai ``_reformat``): one JSON object per line with
  ``dialog`` items ``{speaker: usr|sys, text, strategy}``;
* Hugging Face ``thu-coai/esconv`` rows: one JSON object per line whose ``text`` field holds such a
  conversation as a JSON string.

Consecutive utterances of one speaker are merged into one turn (joined by a space), so turns alternate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapo_echo.benchmarks.esconv.seeker import SEEKER, SUPPORTER, SeekerProfile
from rapo_echo.errors import DataError
from rapo_echo.jsonl import loads, read_utf8

SPEAKERS = {
    "seeker": SEEKER,
    "usr": SEEKER,
    "speaker": SEEKER,
    "supporter": SUPPORTER,
    "sys": SUPPORTER,
    "listener": SUPPORTER,
}


@dataclass
class EsconvConversation:
    """One ESConv conversation: the seeker's profile and the alternating turns ``(speaker, text)``."""

    id: str
    profile: SeekerProfile
    turns: list[tuple[str, str]]
    meta: dict[str, Any] = field(default_factory=dict)


def read_esconv(path: str | Path) -> list[EsconvConversation]:
    """Every conversation in an ESConv-format file (JSON list or JSON lines), ids ``<stem>-<index>``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: ESConv file not found")
    text = read_utf8(path, "ESConv file")
    items: list[tuple[str, Any]]
    if text.lstrip().startswith("["):
        data = loads(text, str(path))
        items = [(f"{path}: item {i}", obj) for i, obj in enumerate(data)]
    else:
        items = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                items.append((f"{path}:{lineno}", loads(line, f"{path}:{lineno}")))
    convs = [conversation_from_json(obj, where, f"{path.stem}-{i}") for i, (where, obj) in enumerate(items)]
    if not convs:
        raise DataError(f"{path}: no conversations found")
    return convs


def conversation_from_json(obj: Any, where: str, conv_id: str) -> EsconvConversation:
    """One conversation from its JSON object (any accepted schema); ``where`` names it in errors."""
    if isinstance(obj, dict) and isinstance(obj.get("text"), str) and "dialog" not in obj:
        try:
            obj = json.loads(obj["text"])  # a Hugging Face thu-coai/esconv row
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: field 'text' is not a JSON conversation ({exc})") from exc
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object (one conversation), got {type(obj).__name__}")
    for key in ("emotion_type", "problem_type", "situation"):
        if not isinstance(obj.get(key), str):
            raise DataError(f"{where}: field '{key}' is missing or not a string")
    dialog = obj.get("dialog")
    if not isinstance(dialog, list) or not dialog:
        raise DataError(f"{where}: field 'dialog' must be a non-empty list of utterances")
    turns: list[tuple[str, str]] = []
    for j, utt in enumerate(dialog):
        if not isinstance(utt, dict):
            raise DataError(f"{where}: dialog[{j}] is not an object")
        speaker = SPEAKERS.get(str(utt.get("speaker", "")).lower())
        if speaker is None:
            raise DataError(
                f"{where}: dialog[{j}].speaker is {utt.get('speaker')!r}; "
                f"expected one of {', '.join(SPEAKERS)}"
            )
        content = utt.get("content", utt.get("text"))
        if not isinstance(content, str):
            raise DataError(f"{where}: dialog[{j}] has no 'content' or 'text' string")
        content = " ".join(content.split())
        if not content:
            continue
        if turns and turns[-1][0] == speaker:
            turns[-1] = (speaker, f"{turns[-1][1]} {content}")
        else:
            turns.append((speaker, content))
    profile = SeekerProfile(obj["emotion_type"], obj["problem_type"], " ".join(obj["situation"].split()))
    meta = {"source": where}
    if isinstance(obj.get("experience_type"), str):
        meta["experience_type"] = obj["experience_type"]
    return EsconvConversation(conv_id, profile, turns, meta)
