"""Our own ``scenarios`` format: one object per scenario, in a JSON list or JSONL.

``{"id"?: str, "messages"?: [{"role", "content"}, ...], "opening"?: str, "profile"?: {...},
"reference"?: str, "meta"?: {...}}`` with exactly one of ``messages`` / ``opening`` (shorthand for a
single user message). Roles are system / user / assistant, a system message may only come first,
and the last message must be from the user. Ids default to ``<file stem>-<n>`` (n counts records
from 0) and must be unique in the file.
"""

from __future__ import annotations

from typing import Any

from rapo_echo.data.files import Record, expect_object, get_str
from rapo_echo.errors import DataError
from rapo_echo.text import is_blank
from rapo_echo.types import Message, Scenario

SCENARIO_KEYS = ("id", "messages", "opening", "profile", "reference", "meta")
ROLES = ("system", "user", "assistant")

# What a user in a scenario mostly wants from the supporter (the ``need`` of a hidden profile).
SUPPORT_NEEDS = (
    "be heard / venting",
    "validation",
    "practical advice",
    "perspective",
    "encouragement",
    "understanding others' motives",
    "reassurance that they are not at fault",
    "gentle challenge to self-reflect",
)


def parse_scenarios(records: list[Record], stem: str, file: str) -> list[Scenario]:
    """Validate every record and build the scenarios; ids must be unique."""
    out: list[Scenario] = []
    seen: dict[str, str] = {}
    for n, record in enumerate(records):
        scenario = parse_scenario(record, default_id=f"{stem}-{n}", file=file)
        if scenario.id in seen:
            raise DataError(f"{record.where}: id: {scenario.id!r} is already used at {seen[scenario.id]}")
        seen[scenario.id] = record.where
        out.append(scenario)
    return out


def parse_scenario(record: Record, default_id: str, file: str) -> Scenario:
    """One scenario record -> :class:`Scenario`; errors name the record's line and the field."""
    obj, where = expect_object(record), record.where
    unknown = [k for k in obj if k not in SCENARIO_KEYS]
    if unknown:
        raise DataError(f"{where}: {unknown[0]}: unknown key; allowed keys: {', '.join(SCENARIO_KEYS)}")
    sid = get_str(obj, "id", where, required=False)
    if sid is not None and is_blank(sid):
        raise DataError(f"{where}: id: empty; expected a non-empty string (or leave id out)")
    has_messages, has_opening = obj.get("messages") is not None, obj.get("opening") is not None
    if has_messages == has_opening:
        got = "both" if has_messages else "neither"
        raise DataError(f"{where}: messages / opening: got {got}; expected exactly one of them")
    if has_opening:
        opening = get_str(obj, "opening", where)
        if is_blank(opening):
            raise DataError(f"{where}: opening: empty; expected the user's first message")
        messages: list[Message] = [{"role": "user", "content": opening}]
    else:
        messages = _messages(obj["messages"], where)
    profile = _mapping(obj, "profile", where)
    meta = _mapping(obj, "meta", where)
    meta.setdefault("source", "scenarios")
    meta.setdefault("file", file)
    reference = get_str(obj, "reference", where, required=False)
    return Scenario(id=sid or default_id, messages=messages, profile=profile, reference=reference, meta=meta)


def _messages(value: Any, where: str) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: messages: expected a non-empty list of {{role, content}} objects")
    out: list[Message] = []
    for i, m in enumerate(value):
        field = f"messages[{i}]"
        if not isinstance(m, dict):
            raise DataError(f"{where}: {field}: got {type(m).__name__}; expected a {{role, content}} object")
        extra = [k for k in m if k not in ("role", "content")]
        if extra:
            raise DataError(f"{where}: {field}.{extra[0]}: unknown key; a message has only role and content")
        role = get_str(m, "role", where, path=f"{field}.")
        if role not in ROLES:
            raise DataError(f"{where}: {field}.role: got {role!r}; expected one of {', '.join(ROLES)}")
        if role == "system" and i > 0:
            raise DataError(f"{where}: {field}.role: a system message may only come first")
        content = get_str(m, "content", where, path=f"{field}.")
        if is_blank(content):
            raise DataError(f"{where}: {field}.content: empty; expected the message text")
        out.append({"role": role, "content": content})
    if out[-1]["role"] != "user":
        raise DataError(
            f"{where}: messages[{len(out) - 1}].role: got {out[-1]['role']!r}; the last message must be "
            "from the user (the policy writes the next assistant turn)"
        )
    return out


def _mapping(obj: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DataError(f"{where}: {key}: got {type(value).__name__}; expected a JSON object")
    return dict(value)
