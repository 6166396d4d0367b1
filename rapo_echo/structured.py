"""What a simulator or judge call wants back, declared once and enforced by the engine
(docs/structured-output.md).

An :class:`AnswerFormat` is a JSON schema, one label out of a few, a bounded integer or a regular
expression. An engine that can constrain decoding produces only text of that shape, the ``scripted``
engine checks its replies against it, and every engine's text is then read by
:meth:`AnswerFormat.parse`, the one parser. JSON schemas are limited to the keywords :func:`validate_json`
checks, so that what a server or grammar enforces is exactly what we validate: that subset check stays
ours (an ``integer`` has no fraction, unknown keywords are refused), and ``jsonschema`` (Draft 2020-12)
checks on top of it (a well-formed schema; ``true`` is not ``1`` in an ``enum``).
"""

from __future__ import annotations

import json
import math
import re

try:  # the parser of the re module (its name since Python 3.11)
    import re._parser as _sre_parser
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parser
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


MAX_ENUM = 1000  # values of one enum (a longer list is a grammar no engine compiles in reasonable time)
MAX_DEPTH = 32  # nesting of a schema
MAX_BOUND = 2**53  # |minimum|, |maximum|: beyond it bounds are not exact as JSON numbers
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")


def check_schema(schema: Any, where: str = "schema") -> None:
    """Raise ``ValueError`` naming the place when ``schema`` uses a keyword or type outside our subset
    (:func:`_check_subset`), or is not a well-formed JSON schema (``jsonschema``'s metaschema check)."""
    _check_subset(schema, where)
    from jsonschema import Draft202012Validator, SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        path = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in exc.path)
        raise ValueError(f"{where}{path}: not a valid JSON schema: {exc.message}") from None


def _check_subset(schema: Any, where: str, depth: int = 0) -> None:
    """Raise ``ValueError`` naming the place when ``schema`` uses a keyword or type outside our subset, or
    holds a value no grammar can take: ``properties`` that is not an object of schemas, ``required`` that
    is not a list of property names, an empty or non-list ``enum`` or one of more than :data:`MAX_ENUM`
    values, bounds that are not numbers, not finite, beyond :data:`MAX_BOUND` or crossed (minimum above
    maximum, minLength above maxLength, ...), negative lengths, or nesting deeper than :data:`MAX_DEPTH`."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{where[:60]}...: the schema is nested more than {MAX_DEPTH} levels deep")
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
    if kind is not None and (not isinstance(kind, str) or kind not in _TYPES):
        raise ValueError(f"{where}: type {kind!r} is not one of {_TYPES}")
    if "enum" in schema:
        enum = schema["enum"]
        if not isinstance(enum, list) or not enum:
            raise ValueError(f"{where}.enum: must be a non-empty list, got {str(enum)[:60]}")
        if len(enum) > MAX_ENUM:
            raise ValueError(f"{where}.enum: {len(enum)} values; at most {MAX_ENUM} are supported")
    _check_bounds(schema, where)
    props = schema.get("properties", {})
    if not isinstance(props, Mapping):
        raise ValueError(f"{where}.properties: must be an object of schemas, got {type(props).__name__}")
    for name, sub in props.items():
        _check_subset(sub, f"{where}.properties.{name}", depth + 1)
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"{where}.required: must be a list of property names, got {str(required)[:60]}")
    missing = sorted(set(required) - set(props))
    if missing:
        raise ValueError(f"{where}: required field(s) {missing} have no property")
    extra = schema.get("additionalProperties", False)
    if not isinstance(extra, bool):
        raise ValueError(f"{where}.additionalProperties: only true or false is supported")
    for key in ("description", "title"):
        if key in schema and not isinstance(schema[key], str):
            raise ValueError(f"{where}.{key}: must be a string")
    if "items" in schema:
        _check_subset(schema["items"], f"{where}.items", depth + 1)


def _check_bounds(schema: Mapping[str, Any], where: str) -> None:
    for key in ("minimum", "maximum"):
        value = schema.get(key)
        if key in schema and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        ):
            raise ValueError(f"{where}.{key}: must be a finite number, got {str(value)[:40]}")
        if key in schema and abs(value) > MAX_BOUND:
            raise ValueError(f"{where}.{key}: {value:g} is beyond +-2**53, the range of exact JSON numbers")
    for key in _COUNTS:
        value = schema.get(key)
        if key in schema and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{where}.{key}: must be a non-negative integer, got {str(value)[:40]}")
    for lo, hi in (("minimum", "maximum"), ("minLength", "maxLength"), ("minItems", "maxItems")):
        if lo in schema and hi in schema and schema[lo] > schema[hi]:
            raise ValueError(f"{where}: {lo} {schema[lo]} is greater than {hi} {schema[hi]}")


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


_SIZED = {  # type: (Python type, its name, the schema's bounds, how a length out of them reads)
    "array": (list, "an array", "minItems", "maxItems", "{} items, outside"),
    "string": (str, "a string", "minLength", "maxLength", "length {} outside"),
}


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
    if kind in _SIZED:
        pytype, noun, lo_key, hi_key, size = _SIZED[kind]
        if not isinstance(value, pytype):
            return f"{where}: expected {noun}"
        lo, hi = schema.get(lo_key, 0), schema.get(hi_key, len(value))
        if not lo <= len(value) <= hi:
            return f"{where}: {size.format(len(value))} [{lo}, {hi}]"
        items = schema.get("items") if kind == "array" else None
        for i, item in enumerate(value if items is not None else ()):
            problem = _subset_problem(item, items, f"{where}[{i}]")
            if problem:
                return problem
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


def json_object_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every top-level balanced ``{...}`` block of ``text``, in order (braces inside
    JSON strings do not count; an opening brace that never closes is skipped)."""
    spans: list[tuple[int, int]] = []
    start = text.find("{")
    while start >= 0:
        depth, in_string, escaped, end = 0, False, False, -1
        for i in range(start, len(text)):
            ch = text[i]
            if in_string:  # a backslash escapes the next character, a quote among them
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
                continue
            if ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    end = i + 1
                    break
        if end < 0:
            start = text.find("{", start + 1)
            continue
        spans.append((start, end))
        start = text.find("{", end)
    return spans


def json_object_texts(text: str) -> list[str]:
    """The JSON objects a reply may hold, in order: the whole reply (or a reply in a code fence) when it
    is one object, else every top-level balanced ``{...}`` block (a model without constrained decoding
    may write sentences around, or before, its answer)."""
    text = str(text).strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    if text.startswith("{") and text.endswith("}") and [(0, len(text))] == json_object_spans(text):
        return [text]
    return [text[a:b] for a, b in json_object_spans(text)]


def json_object_text(text: str) -> str | None:
    """The first JSON object of :func:`json_object_texts`, or None if there is none."""
    found = json_object_texts(text)
    return found[0] if found else None


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` is outside the regular expressions every engine enforces alike (it does not
    compile, or uses look-around or a back-reference, which grammar compilers reject), else None."""
    try:
        parsed = _sre_parser.parse(pattern)
    except re.error as exc:
        return f"the regex does not compile ({exc})"
    banned = {
        "ASSERT": "look-around",
        "ASSERT_NOT": "look-around",
        "GROUPREF": "a back-reference",
        "GROUPREF_EXISTS": "a conditional back-reference",
    }

    def walk(items: Any) -> str | None:
        for op, arg in items:
            name = str(op)
            if name in banned:
                return f"the regex uses {banned[name]}, which grammar-constrained decoding cannot enforce"
            for sub in arg if isinstance(arg, (list, tuple)) else ():
                if isinstance(sub, _sre_parser.SubPattern):
                    found = walk(sub)
                elif isinstance(sub, (list, tuple)):
                    nested = (walk(x) for x in sub if isinstance(x, _sre_parser.SubPattern))
                    found = next((f for f in nested if f), None)
                else:
                    found = None
                if found:
                    return found
        return None

    return walk(parsed)


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
            problem = regex_problem(self.pattern)
            if problem:
                raise ValueError(f"answer format {self.name!r}: {problem}")

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
        code fence or inside a sentence, for engines that do not enforce the format; of several objects,
        the last one that conforms); choice -> the label
        (a reply that starts with exactly one label also counts); integer -> the int; regex -> the matched
        text. Never raises on model output."""
        raw = str(text).strip()
        if self.kind == "json":  # the last well-formed answer: a quote or a draft may come before it
            schema = self.schema
            for body in reversed(json_object_texts(raw)):
                try:
                    value = json.loads(body)
                except (ValueError, RecursionError):
                    continue
                if validate_json(value, schema) is None:
                    return value
            return None
        if self.kind == "choice":
            if raw in self.choices:
                return raw
            starts = [c for c in self.choices if raw.startswith(c) and not raw[len(c) : len(c) + 1].isalnum()]
            return starts[0] if len(starts) == 1 else None
        if self.problem(raw) is not None:
            return None
        return int(raw) if self.kind == "integer" else raw
