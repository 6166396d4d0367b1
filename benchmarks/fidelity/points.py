"""The rated points of ESConv-family conversations: what each in-dialogue rating refers to
(docs/fidelity.md, What a predictor sees).

In ESConv the help-seeker rated the supporter's helpfulness (1-5) about every second exchange; the
rating sits on the seeker utterance written right after the rated supporter turns. The seeker turn that
follows each supporter turn is kept as the real "next message". Conversations are read by
:func:`rapo_echo.data.load_dialogues`.

Problems: a file in another schema or without any rating, a rating outside 1-5 or not a number, a
conversation with no utterances: a :class:`DataError` naming the file and the conversation. A point
that cannot be scored (no rating, no supporter turn since the previous one, a repeat of an earlier
conversation: :data:`SKIP_DUPLICATE`) becomes a counted skip with its reason."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapo_echo.data import load_dialogues
from rapo_echo.data.esconv import Dialogue
from rapo_echo.errors import DataError
from rapo_echo.types import Scenario

# profile fields a predictor may see (the survey's intensities are outcomes, so they stay hidden)
VISIBLE_PROFILE = ("emotion_type", "problem_type", "situation", "experience_type")
SKIP_NO_RATINGS = "conversation has no in-dialogue ratings"
SKIP_NO_TURNS = "no supporter turn since the previous rating"
SKIP_DUPLICATE = "duplicate of an earlier conversation (same turns and ratings)"
log = logging.getLogger(__name__)


@dataclass
class Item:
    """One rated supporter turn in its real context: the scenario (context + visible profile), the
    turn, and the real seeker turn that followed it ('' when none did)."""

    scenario: Scenario
    reply: str
    next_message: str


@dataclass
class RatedPoint:
    """One in-dialogue rating and the supporter turns it refers to."""

    id: str
    dialogue: str  # the conversation's id (``<file stem>-<index>``)
    index: int  # position of the conversation in its file
    point: int  # 0-based position of the rating in its conversation
    rating: int | None  # None for a skip
    items: list[Item] = field(default_factory=list)
    survey: dict[str, int] = field(default_factory=dict)  # initial / final emotion intensity, when given
    skip: str | None = None
    duplicate_of: str | None = None  # SKIP_DUPLICATE: the id of the conversation this one repeats


def load_points(path: str | Path) -> list[RatedPoint]:
    """Every rated point of an ESConv-family file, plus one skip per point (or conversation) that cannot
    be scored; errors name the file and the conversation."""
    dialogues = load_dialogues(path, fmt="auto")
    if all(d.source not in ("esconv", "failed_esconv") for d in dialogues):
        raise DataError(
            f"{path}: the conversations hold no in-dialogue feedback ratings (the reformatted usr/sys "
            "schema drops them); use the raw ESConv.json or FailedESConv.json"
        )
    first: dict[str, Dialogue] = {}
    points, repeats = [], []
    for d in dialogues:
        key = dialogue_fingerprint(d)
        if key in first:
            original = first[key]
            repeats.append(f"{d.index} (= {original.index})")
            skip = RatedPoint(f"{d.id}-duplicate", d.id, d.index, 0, None, skip=SKIP_DUPLICATE)
            skip.duplicate_of = original.id
            points.append(skip)
            continue
        first[key] = d
        points.extend(dialogue_points(d))
    if repeats:
        log.warning(
            "%s: %d conversation(s) repeat an earlier one and are skipped, not scored twice: %s",
            path,
            len(repeats),
            ", ".join(repeats[:20]) + (" ..." if len(repeats) > 20 else ""),
        )
    if all(p.skip for p in points):
        raise DataError(f"{path}: no conversation holds an in-dialogue feedback rating to score against")
    return points


def dialogue_fingerprint(d: Dialogue) -> str:
    """A hash of what a conversation holds for this benchmark: its turns (role, text), their ratings and
    its profile; two copies of one conversation have the same fingerprint wherever they sit."""
    body = {
        "turns": [(u.role, u.content, u.feedback) for u in d.utterances],
        "profile": {k: v for k, v in sorted(d.profile.items())},
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def dialogue_points(d: Dialogue) -> list[RatedPoint]:
    """The rated points of one conversation, in order (see the module doc)."""
    where = f"{d.file}: conversation {d.index} ({d.id})"
    if not d.utterances:
        raise DataError(f"{where}: the dialogue is empty (no utterance has text)")
    survey = {
        k: d.profile[k] for k in ("initial_emotion_intensity", "final_emotion_intensity") if k in d.profile
    }
    ratings = d.feedback()
    if not ratings:
        return [RatedPoint(f"{d.id}-none", d.id, d.index, 0, None, survey=survey, skip=SKIP_NO_RATINGS)]
    profile = {k: d.profile[k] for k in VISIBLE_PROFILE if d.profile.get(k)}
    turns = d.turns()
    messages = [{"role": t.role, "content": t.content} for t in turns]
    out, previous = [], -1
    for p, (at, rating) in enumerate(ratings):
        items = []
        for k, turn in enumerate(turns):
            if turn.role != "assistant" or not previous < turn.first or not turn.last < at:
                continue
            following = messages[k + 1]["content"] if k + 1 < len(turns) else ""
            scenario = Scenario(
                id=f"{d.id}-t{turn.first}",
                messages=messages[:k],  # type: ignore[arg-type]  # plain dicts of role and content
                profile=dict(profile),
                meta={"dialogue": d.id, "turn": turn.first, "file": d.file},
            )
            items.append(Item(scenario, turn.content, following))
        point_id = f"{d.id}-r{at}"
        skip = None if items else SKIP_NO_TURNS
        out.append(RatedPoint(point_id, d.id, d.index, p, rating, items, survey, skip))
        previous = at
    return out


def point_data(point: RatedPoint) -> dict[str, Any]:
    """A JSON-able view of a point for records (the rating is kept apart from what predictors see)."""
    return {
        "dialogue": point.dialogue,
        "index": point.index,
        "point": point.point,
        "survey": point.survey,
        "turns": [{"context_messages": len(i.scenario.messages), "reply": i.reply} for i in point.items],
    }
