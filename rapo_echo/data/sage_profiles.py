"""SAGE-style simulated-user profiles: who the user is (persona, background, hidden intention, first
message) and the reader of profile files (RLVER / SAGE rows or ours). The SAGE simulator
(:mod:`rapo_echo.simulators.sage`) plays them; the ``sage`` data format turns them into scenarios."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rapo_echo.data.files import BUNDLED_PREFIX, open_source, read_records
from rapo_echo.errors import DataError
from rapo_echo.text import is_blank
from rapo_echo.types import Scenario

log = logging.getLogger(__name__)

GOAL = (
    "This is a heart-to-heart talk: you confide in the supporter about what happened to you, starting "
    "from the topics in your background and going deeper. You confide in line with your hidden "
    "intention but never reveal it. You answer according to your current emotion, and you talk about "
    "concrete events rather than abstract feelings."
)


@dataclass(frozen=True)
class SageProfile:
    """Who the simulated user is. ``first_talk`` is a preset opening message (SAGE's test set)."""

    persona: str
    background: str
    hidden_intention: str = ""
    first_talk: str | None = None
    goal: str = GOAL
    id: str | None = None
    style: str = ""  # what kind of seeker (the hard-to-help profiles: withdrawn, hostile, ...); "" for none

    def __post_init__(self) -> None:
        # A first talk of only spaces or newlines would open the dialogue with an empty message: fall
        # back to a profile without one (the simulator writes the opening), and say so.
        if self.first_talk is not None and is_blank(self.first_talk):
            log.warning(
                "profile %s: first_talk is only whitespace; the simulator writes the opening instead",
                self.id or self.persona[:40],
            )
            object.__setattr__(self, "first_talk", None)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "profile") -> SageProfile:
        """Accepts RLVER / SAGE profile rows (``player``, ``scene``, ``task``, ``first_talk``), rapo-echo
        scenario profiles (``persona``, ``situation``, ``need``, ...) or a whole scenario mapping
        (``profile`` plus ``messages`` / ``opening``, whose last user message is the first talk)."""
        if not isinstance(data, Mapping):
            raise DataError(f"{where}: expected a JSON object, got {type(data).__name__}")
        ident = data.get("id")
        first = data.get("first_talk") or data.get("opening")
        if isinstance(data.get("profile"), Mapping):
            messages = data.get("messages") or []
            users = [m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
            first = first or (users[-1] if users else None)
            data = {**data["profile"], **({"first_talk": first} if first else {})}
        for key in (
            "player",
            "persona",
            "scene",
            "situation",
            "background",
            "task",
            "need",
            "first_talk",
            "style",
        ):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise DataError(f"{where}: {key}: got {type(data[key]).__name__}; expected a string")
        persona = data.get("player") or data.get("persona")
        background = data.get("scene") or data.get("situation") or data.get("background")
        extra = [f"{k.replace('_', ' ')}: {data[k]}" for k in ("emotion_type", "problem_type") if data.get(k)]
        if extra:
            background = "\n".join([background or "", *extra]).strip()
        if not persona and not background:
            raise DataError(
                f"{where}: needs a persona ('player' or 'persona') or a background ('scene' or 'situation'); "
                f"got keys {sorted(data)}"
            )
        intention = data.get("task") or data.get("need") or data.get("hidden_intention") or ""
        return cls(
            persona=str(persona or "(not given)"),
            background=str(background or "(not given)"),
            hidden_intention=str(intention),
            first_talk=str(first) if first else None,
            goal=str(data.get("goal") or GOAL),
            id=str(ident) if ident is not None else None,
            style=str(data.get("style") or ""),
        )

    @classmethod
    def from_scenario(cls, scenario: Scenario) -> SageProfile:
        """The simulated user of a scenario: a SAGE / RLVER profile row (the ``sage`` data format), or one
        of our scenarios (its profile, the last user message as the first talk)."""
        if scenario.meta.get("format") == "sage":
            return cls.from_mapping({**scenario.profile, "id": scenario.id}, scenario.id)
        data = {"id": scenario.id, "profile": scenario.profile, "messages": scenario.messages}
        return cls.from_mapping(data, scenario.id)

    @classmethod
    def from_label(cls, label: Any, where: str = "label") -> SageProfile:
        """From an OpenRLHF label: a JSON string (or already decoded mapping) of a profile."""
        if isinstance(label, str):
            try:
                label = json.loads(label)
            except ValueError as exc:
                raise DataError(f"{where}: not a JSON profile ({exc}): {label[:120]!r}") from exc
        return cls.from_mapping(label, where)


BUNDLED_PROFILES = "sage_profiles_en.jsonl"
BUNDLED_HARD_PROFILES = "sage_hard_profiles_en.jsonl"  # hard-to-help seekers (docs/reading-results.md)


def load_profiles(path: str | os.PathLike[str] | None = None) -> list[SageProfile]:
    """Profiles from a JSON / JSONL file (RLVER / SAGE rows or ours); ``None`` = our bundled English
    profiles. Every profile gets an id (its own, else ``<file stem>-<line>``); errors name file and line."""
    src = open_source(BUNDLED_PREFIX + BUNDLED_PROFILES if path is None else path)
    out = []
    for i, record in enumerate(read_records(src)):
        profile = SageProfile.from_mapping(record.data, record.where)
        out.append(profile if profile.id else replace(profile, id=f"{src.stem}-{i + 1}"))
    if not out:
        raise DataError(f"{src.name}: holds no profiles")
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        raise DataError(
            f"{src.name}: profile ids are not unique ({next(i for i in ids if ids.count(i) > 1)!r})"
        )
    return out
