"""The ``scenarios`` format: one row per dialogue context, ours or TRL's, from any data source
(docs/data.md).

A row holds exactly one of ``messages`` (when the last turn is the assistant's, it is the reference reply
and the rest, ending with the user, the context), ``opening`` (one user message) or ``prompt`` (TRL's
column, plain or conversational; ``completion`` is then the reference), and optionally ``id``,
``profile``, ``reference`` and ``meta``. Other columns are kept in ``meta["columns"]``, except a name so
close to one of ours that it is refused as a misspelling. Ids default to ``<file stem>-<n>`` and must be
unique in the file.
"""

from __future__ import annotations

import difflib
from typing import Any

from rapo_echo.data.files import Record, expect_object, get_str
from rapo_echo.errors import DataError
from rapo_echo.text import is_blank
from rapo_echo.types import Message, Scenario

SCENARIO_KEYS = ("id", "messages", "opening", "prompt", "profile", "reference", "completion", "meta")
CONTEXT_KEYS = ("messages", "opening", "prompt")
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
    """One scenario row -> :class:`Scenario`; errors name the row's location and the field."""
    obj, where = expect_object(record), record.where
    columns = {k: v for k, v in obj.items() if k not in SCENARIO_KEYS}
    for key in columns:
        near = difflib.get_close_matches(key, SCENARIO_KEYS, n=1, cutoff=0.85)
        if near:
            raise DataError(
                f"{where}: {key}: unknown key; did you mean {near[0]!r}? (keys read: "
                f"{', '.join(SCENARIO_KEYS)}; other columns are kept as meta.columns)"
            )
    sid = _identifier(obj.get("id"), where)
    given = [k for k in CONTEXT_KEYS if obj.get(k) is not None]
    if len(given) != 1:
        got = " and ".join(given) if given else "none of them"
        raise DataError(
            f"{where}: messages / opening / prompt: got {got}; expected exactly one of them (rename a "
            "column you do not mean with data.columns, e.g. data.columns: {prompt: prompt_text})"
        )
    reference = get_str(obj, "reference", where, required=False)
    if obj.get("completion") is not None:
        if reference is not None or given != ["prompt"]:
            raise DataError(f"{where}: completion: goes with prompt, and without reference")
        reference = _completion(obj["completion"], where)
    if given == ["opening"]:
        opening = get_str(obj, "opening", where)
        if is_blank(opening):
            raise DataError(f"{where}: opening: empty; expected the user's first message")
        messages: list[Message] = [{"role": "user", "content": opening}]
    elif given == ["prompt"] and isinstance(obj["prompt"], str):
        if is_blank(obj["prompt"]):
            raise DataError(f"{where}: prompt: empty; expected the user's message")
        messages = [{"role": "user", "content": obj["prompt"]}]
    else:
        key = given[0]
        messages = _messages(obj[key], where, key)
        if key == "messages" and messages[-1]["role"] == "assistant":
            if reference is not None:
                raise DataError(
                    f"{where}: messages[{len(messages) - 1}]: an assistant last turn is the reference "
                    "reply, and this row has a reference too; keep one"
                )
            reference = messages.pop()["content"]
        if not messages or messages[-1]["role"] != "user":
            last = len(messages) - 1
            got = repr(messages[-1]["role"]) if messages else "no turn before the reference reply"
            raise DataError(
                f"{where}: {key}[{max(last, 0)}].role: got {got}; the context must end with the user's turn "
                "(the policy writes the next assistant turn; a messages row may add one assistant turn "
                "after it, read as the reference reply)"
            )
    profile = _mapping(obj, "profile", where)
    meta = _mapping(obj, "meta", where)
    meta.setdefault("source", "scenarios")
    meta.setdefault("file", file)
    if columns:
        meta["columns"] = columns
    return Scenario(id=sid or default_id, messages=messages, profile=profile, reference=reference, meta=meta)


def _identifier(value: Any, where: str) -> str | None:
    """A row's ``id``: a non-empty string, or an integer (as tables often number their rows)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise DataError(f"{where}: id: got {type(value).__name__} {value!r}; expected a string or an integer")
    if is_blank(value):
        raise DataError(f"{where}: id: empty; expected a non-empty string (or leave id out)")
    return value


def _completion(value: Any, where: str) -> str:
    """TRL's ``completion``: a string, or one assistant message (conversational)."""
    if isinstance(value, str) and not is_blank(value):
        return value
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
        m = value[0]
        content = get_str(m, "content", where, path="completion[0].")
        if m.get("role") == "assistant" and not is_blank(content):
            return content
    raise DataError(
        f"{where}: completion: expected a non-empty string or one assistant message "
        "[{role: assistant, content: ...}]"
    )


def _messages(value: Any, where: str, key: str = "messages") -> list[Message]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: {key}: expected a non-empty list of {{role, content}} objects")
    out: list[Message] = []
    for i, m in enumerate(value):
        field = f"{key}[{i}]"
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
    return out


def _mapping(obj: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DataError(f"{where}: {key}: got {type(value).__name__}; expected a JSON object")
    return dict(value)
