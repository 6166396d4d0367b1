"""What a simulator or judge call wants back, declared once and enforced by the engine.

An :class:`AnswerFormat` is one of: a JSON schema (``json``), one label out of a few (``choice``), a bounded
integer (``integer``) or a regular expression (``regex``). A role passes it in
:attr:`rapo_echo.types.SamplingParams.answer_format`; an engine that can constrain decoding (``hf`` through
llguidance, ``vllm`` through its structured-output parameters, an ``openai`` server through
``response_format`` or guided choice / regex) produces only text of that shape; the ``scripted`` engine
checks its scripted replies against it; every engine's text is then read by :meth:`AnswerFormat.parse`,
the one parser. JSON schemas are limited to the keywords :func:`validate_json` checks, so that what a
server or grammar enforces is exactly what we validate.

That subset check stays ours, because it is what the grammar enforces: an ``integer`` is written without a
fraction (``jsonschema`` takes ``1.0`` as an integer) and keywords outside the subset are refused rather
than ignored. ``jsonschema`` (Draft 2020-12) checks on top of it: a schema must be well formed (a
``minimum`` that is a number, ``required`` a list), and a value must pass both (``jsonschema`` tells
``true`` from ``1`` in an ``enum``, which Python's ``==`` does not).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FORMAT_KINDS = ("json", "choice", "integer", "regex")
MAX_INTEGER_VALUES = 1000  # an integer format's regex lists its values: exact on every engine
SCHEMA_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "enum",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "items",
        "minItems",
        "maxItems",
        "description",
        "title",
    }
)
_TYPES = ("object", "string", "integer", "number", "boolean", "array")


def check_schema(schema: Any, where: str = "schema") -> None:
    """Raise ``ValueError`` naming the place when ``schema`` uses a keyword or type outside our subset, or
    is not a well-formed JSON schema (``jsonschema``'s metaschema check)."""
    _check_subset(schema, where)
    from jsonschema import Draft202012Validator, SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        path = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in exc.path)
        raise ValueError(f"{where}{path}: not a valid JSON schema: {exc.message}") from None


def _check_subset(schema: Any, where: str) -> None:
    if not isinstance(schema, Mapping):
        raise ValueError(f"{where}: a JSON schema must be an object, got {type(schema).__name__}")
    unknown = sorted(set(schema) - SCHEMA_KEYWORDS)
    if unknown:
        raise ValueError(
            f"{where}: unsupported JSON-schema keyword(s) {unknown}; allowed {sorted(SCHEMA_KEYWORDS)}"
        )
    kind = schema.get("type")
    if kind is None and "enum" not in schema:
        raise ValueError(f"{where}: needs a 'type' (one of {_TYPES}) or an 'enum'")
    if kind is not None and kind not in _TYPES:
        raise ValueError(f"{where}: type {kind!r} is not one of {_TYPES}")
    for name, sub in (schema.get("properties") or {}).items():
        _check_subset(sub, f"{where}.properties.{name}")
    missing = sorted(set(schema.get("required") or ()) - set(schema.get("properties") or {}))
    if missing:
        raise ValueError(f"{where}: required field(s) {missing} have no property")
    if "items" in schema:
        _check_subset(schema["items"], f"{where}.items")


def object_schema(properties: Mapping[str, Any]) -> dict[str, Any]:
    """A closed JSON object of exactly ``properties``, all required, in their given order (the order a
    constrained engine writes them; the shape strict servers accept)."""
    props = dict(properties)
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def validate_json(value: Any, schema: Mapping[str, Any], where: str = "$") -> str | None:
    """Why ``value`` does not conform to ``schema`` (our keyword subset, then ``jsonschema``), or None
    when it does."""
    problem = _subset_problem(value, schema, where)
    if problem is not None:
        return problem
    from jsonschema import Draft202012Validator

    error = next(iter(Draft202012Validator(schema).iter_errors(value)), None)
    if error is None:
        return None
    path = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in error.absolute_path)
    return f"{where}{path}: {error.message}"


def _subset_problem(value: Any, schema: Mapping[str, Any], where: str) -> str | None:
    if "enum" in schema and value not in schema["enum"]:
        return f"{where}: {value!r} is not one of {schema['enum']}"
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return f"{where}: expected an object"
        props = schema.get("properties") or {}
        for name in schema.get("required") or ():
            if name not in value:
                return f"{where}: missing field {name!r}"
        if schema.get("additionalProperties") is False:
            extra = sorted(set(value) - set(props))
            if extra:
                return f"{where}: unexpected field(s) {extra}"
        for name, sub in props.items():
            if name in value:
                problem = _subset_problem(value[name], sub, f"{where}.{name}")
                if problem:
                    return problem
        return None
    if kind == "array":
        if not isinstance(value, list):
            return f"{where}: expected an array"
        lo, hi = schema.get("minItems", 0), schema.get("maxItems", len(value))
        if not lo <= len(value) <= hi:
            return f"{where}: {len(value)} items, outside [{lo}, {hi}]"
        for i, item in enumerate(value):
            items = schema.get("items")
            problem = _subset_problem(item, items, f"{where}[{i}]") if items is not None else None
            if problem:
                return problem
        return None
    if kind == "string":
        if not isinstance(value, str):
            return f"{where}: expected a string"
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", len(value))
        if not lo <= len(value) <= hi:
            return f"{where}: length {len(value)} outside [{lo}, {hi}]"
        return None
    if kind in ("integer", "number"):
        ok = isinstance(value, int) if kind == "integer" else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok:
            return f"{where}: expected {'an integer' if kind == 'integer' else 'a number'}"
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where}: {value} below the minimum {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where}: {value} above the maximum {schema['maximum']}"
        return None
    if kind == "boolean" and not isinstance(value, bool):
        return f"{where}: expected true or false"
    return None


_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*\n?(.*?)\n?```\s*$", re.S)


def json_object_text(text: str) -> str | None:
    """The JSON object in a reply: the whole reply, a reply in a code fence, or the first balanced
    ``{...}`` block (a model without constrained decoding may write a sentence around it); None if none."""
    text = str(text).strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    if text.startswith("{") and text.endswith("}"):
        return text
    start = text.find("{")
    while start >= 0:
        depth, in_string, escaped = 0, False, False
        for end in range(start, len(text)):
            ch = text[end]
            if in_string:
                escaped = not escaped and ch == "\\"
                if ch == '"' and not escaped:
                    in_string = False
                continue
            if ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[start : end + 1]
        start = text.find("{", start + 1)
    return None


@dataclass(frozen=True)
class AnswerFormat:
    """The shape of an answer: build with :meth:`json_schema`, :meth:`choice`, :meth:`integer` or
    :meth:`regex`. Frozen and hashable (engines cache compiled grammars by it)."""

    kind: str
    name: str = "answer"
    schema_text: str = ""  # canonical JSON of the schema (kind json)
    choices: tuple[str, ...] = ()
    lo: int = 0
    hi: int = 0
    pattern: str = ""

    def __post_init__(self) -> None:
        if self.kind not in FORMAT_KINDS:
            raise ValueError(f"answer format kind must be one of {FORMAT_KINDS}, got {self.kind!r}")
        if self.kind == "choice" and (not self.choices or any(not c for c in self.choices)):
            raise ValueError(
                f"answer format {self.name!r}: a choice needs non-empty labels, got {self.choices}"
            )
        if self.kind == "integer" and not 0 <= self.hi - self.lo <= MAX_INTEGER_VALUES:
            raise ValueError(
                f"answer format {self.name!r}: integer range [{self.lo}, {self.hi}] is empty or holds more "
                f"than {MAX_INTEGER_VALUES} values (use a json schema with minimum / maximum)"
            )
        if self.kind == "regex":
            re.compile(self.pattern)

    # ---------------------------------------------------------------- constructors
    @classmethod
    def json_schema(cls, schema: Mapping[str, Any], name: str = "answer") -> AnswerFormat:
        """A JSON value conforming to ``schema`` (checked against our keyword subset now). Properties keep
        their given order: constrained engines write them in that order (reasoning before a score)."""
        check_schema(schema, f"answer format {name!r}")
        return cls("json", name=name, schema_text=json.dumps(schema))

    @classmethod
    def json_object(cls, properties: Mapping[str, Any], name: str = "answer") -> AnswerFormat:
        """A closed JSON object of ``properties``, all required, in their order (:func:`object_schema`)."""
        return cls.json_schema(object_schema(properties), name=name)

    @classmethod
    def choice(cls, labels: Sequence[str], name: str = "answer") -> AnswerFormat:
        """Exactly one of ``labels``."""
        return cls("choice", name=name, choices=tuple(labels))

    @classmethod
    def integer(cls, lo: int, hi: int, name: str = "answer") -> AnswerFormat:
        """A bare integer in ``[lo, hi]``."""
        return cls("integer", name=name, lo=int(lo), hi=int(hi))

    @classmethod
    def regex(cls, pattern: str, name: str = "answer") -> AnswerFormat:
        """Text that fully matches ``pattern`` (Python ``re`` syntax in the common subset that llguidance,
        vLLM and servers' guided regex read alike: no look-around, no back-references)."""
        return cls("regex", name=name, pattern=pattern)

    # ---------------------------------------------------------------- views
    @property
    def schema(self) -> dict[str, Any]:
        """The JSON schema (kind json)."""
        return json.loads(self.schema_text) if self.schema_text else {}

    def as_regex(self) -> str:
        """The regular expression of a choice, integer or regex format (``ValueError`` for json)."""
        if self.kind == "choice":
            return "(" + "|".join(re.escape(c) for c in self.choices) + ")"
        if self.kind == "integer":
            return "(" + "|".join(str(v) for v in range(self.lo, self.hi + 1)) + ")"
        if self.kind == "regex":
            return self.pattern
        raise ValueError("a json answer format has no regular expression; use its schema")

    # ---------------------------------------------------------------- reading
    def problem(self, text: str) -> str | None:
        """Why ``text`` is not an answer of this format, or None when it is (exactly what an engine that
        enforces the format could produce, surrounding whitespace aside)."""
        text = str(text).strip()
        if self.kind == "json":
            try:
                value = json.loads(text)
            except ValueError as err:
                return f"not JSON ({err})"
            return validate_json(value, self.schema)
        if self.kind == "integer":
            if not re.fullmatch(r"-?[0-9]+", text):
                return f"{text[:40]!r} is not an integer"
            value = int(text)
            return None if self.lo <= value <= self.hi else f"{value} outside [{self.lo}, {self.hi}]"
        if re.fullmatch(self.as_regex(), text, re.S):
            return None
        return f"{text[:40]!r} does not match {self.as_regex()[:80]!r}"

    def parse(self, text: str) -> Any | None:
        """The answer in a reply, or None when it has none: json -> the validated value (also found in a
        code fence or inside a sentence, for engines that do not enforce the format); choice -> the label
        (a reply that starts with exactly one label also counts); integer -> the int; regex -> the matched
        text. Never raises on model output."""
        raw = str(text).strip()
        if self.kind == "json":
            body = json_object_text(raw)
            if body is None:
                return None
            try:
                value = json.loads(body)
            except ValueError:
                return None
            return value if validate_json(value, self.schema) is None else None
        if self.kind == "choice":
            if raw in self.choices:
                return raw
            starts = [c for c in self.choices if raw.startswith(c) and not raw[len(c) : len(c) + 1].isalnum()]
            return starts[0] if len(starts) == 1 else None
        if self.problem(raw) is not None:
            return None
        return int(raw) if self.kind == "integer" else raw
