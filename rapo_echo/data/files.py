"""Read JSON / JSONL data files, keeping each record's line so errors can point at it.

A data file is either a JSON list of objects, a single JSON object, or JSONL (one object a line);
which one is decided from the content, not the name. ``bundled:NAME`` names a file shipped in
``rapo_echo/examples`` (found through :mod:`importlib.resources`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rapo_echo.errors import DataError

if TYPE_CHECKING:
    from importlib.abc import Traversable

BUNDLED_PREFIX = "bundled:"
BUNDLED_SCENARIOS = "scenarios_en.jsonl"
BUNDLED_ESCONV = "esconv_style_en.json"

_WS = re.compile(r"\s*")


@dataclass(frozen=True)
class Source:
    """The text of one data file. ``name`` is what messages show; ``path`` a real file, if any."""

    name: str
    text: str
    stem: str
    path: str | None


@dataclass(frozen=True)
class Record:
    """One top-level JSON value and where it starts (``file:line`` or ``file:line (list index i)``)."""

    where: str
    data: Any


def bundled_file(name: str) -> Traversable:
    """The :mod:`importlib.resources` handle of a file shipped in ``rapo_echo/examples``."""
    res = resources.files("rapo_echo") / "examples" / name
    if not res.is_file():
        known = ", ".join(bundled_names())
        raise DataError(f"{BUNDLED_PREFIX}{name}: no such bundled data file; bundled: {known}")
    return res


def bundled_names() -> list[str]:
    """Names of the JSON / JSONL files shipped in ``rapo_echo/examples``."""
    folder = resources.files("rapo_echo") / "examples"
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".json", ".jsonl")))


class LongInteger(float):
    """An integer literal too long for Python to read (over 4300 digits), kept as +-infinity so that the
    field's own check reports it (naming the file, record and field) instead of the JSON reader failing
    on the whole file."""

    digits: int

    def __new__(cls, text: str) -> LongInteger:
        value = super().__new__(cls, float("-inf") if text.startswith("-") else float("inf"))
        value.digits = len(text.lstrip("-"))
        return value

    def __repr__(self) -> str:
        return f"<a {self.digits}-digit integer>"


def parse_int(text: str) -> int | float:
    """A JSON integer literal: an ``int``, or a :class:`LongInteger` when Python refuses that many digits."""
    try:
        return int(text)
    except ValueError:
        return LongInteger(text)


def loads_json(text: str) -> Any:
    """``json.loads`` that reads over-long integers as :class:`LongInteger` (and ``Infinity`` / ``1e400``
    as infinities, as ``json`` does): a number no field accepts is that field's error, with its place."""
    return json.loads(text, parse_int=parse_int)


def open_source(path: str | os.PathLike[str] | None) -> Source:
    """Read a data file (``None`` = the bundled English scenarios, ``bundled:NAME`` = a bundled file)."""
    spec = BUNDLED_PREFIX + BUNDLED_SCENARIOS if path is None else os.fspath(path)
    if spec.startswith(BUNDLED_PREFIX):
        name = spec[len(BUNDLED_PREFIX) :]
        res = bundled_file(name)
        real = str(res) if Path(str(res)).is_file() else None
        return Source(str(res), res.read_text(encoding="utf-8"), Path(name).stem, real)
    p = Path(spec)
    if not p.exists():
        raise DataError(f"{p}: data file not found")
    if p.is_dir():
        raise DataError(f"{p}: is a folder; expected a .json or .jsonl data file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text (byte {exc.start}); expected a JSON or JSONL file") from exc
    return Source(str(p), text, p.stem, str(p))


def read_records(src: Source, limit: int | None = None) -> list[Record]:
    """Every top-level record of ``src`` (at most ``limit``), each with its location."""
    try:
        return _read_records(src, limit)
    except RecursionError:
        raise DataError(f"{src.name}: JSON nested too deeply to read; is the file corrupted?") from None


def _read_records(src: Source, limit: int | None) -> list[Record]:
    start = _WS.match(src.text).end()
    if start == len(src.text):
        raise DataError(f"{src.name}: the file is empty; expected JSON or JSONL records")
    first = src.text[start]
    if first == "[":
        return _json_list(src, start, limit)
    if first != "{":
        line = src.text.count("\n", 0, start) + 1
        raise DataError(
            f"{src.name}:{line}: expected a JSON list ('[') or JSON objects ('{{'), got {first!r}"
        )
    try:
        return [Record(f"{src.name}:{src.text.count(chr(10), 0, start) + 1}", loads_json(src.text))]
    except json.JSONDecodeError as exc:
        # one pretty-printed object opens with a lone '{' line; anything else is read as JSONL,
        # which names the first line that does not parse
        if src.text[start:].split("\n", 1)[0].strip() == "{":
            raise _syntax_error(src, exc) from None
    return _jsonl(src, limit)


def _jsonl(src: Source, limit: int | None) -> list[Record]:
    out: list[Record] = []
    for lineno, line in enumerate(src.text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            out.append(Record(f"{src.name}:{lineno}", loads_json(line)))
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{src.name}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno}); "
                "expected one JSON object per line (JSONL)"
            ) from None
        if limit is not None and len(out) >= limit:
            break
    return out


def _json_list(src: Source, start: int, limit: int | None) -> list[Record]:
    """Decode a top-level JSON list element by element to know the line each element starts on."""
    text, decoder = src.text, json.JSONDecoder(parse_int=parse_int)
    out: list[Record] = []
    line, counted = 1, 0

    def line_at(pos: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, pos)
        counted = pos
        return line

    i = _WS.match(text, start + 1).end()
    if text.startswith("]", i):
        return out
    while True:
        try:
            value, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise _syntax_error(src, exc) from None
        out.append(Record(f"{src.name}:{line_at(i)} (list index {len(out)})", value))
        if limit is not None and len(out) >= limit:
            return out
        j = _WS.match(text, end).end()
        if text.startswith(",", j):
            i = _WS.match(text, j + 1).end()
        elif text.startswith("]", j):
            k = _WS.match(text, j + 1).end()
            if k != len(text):
                raise DataError(f"{src.name}:{line_at(k)}: invalid JSON: extra data after the closing ']'")
            return out
        else:
            where = f"{src.name}:{line_at(j)}"
            raise DataError(f"{where}: invalid JSON: expected ',' or ']' after list index {len(out) - 1}")


def expect_object(record: Record) -> dict[str, Any]:
    """The record's value, which must be a JSON object."""
    if not isinstance(record.data, dict):
        raise DataError(f"{record.where}: expected a JSON object, got {type(record.data).__name__}")
    return record.data


def get_str(obj: dict[str, Any], key: str, where: str, path: str = "", required: bool = True) -> str | None:
    """``obj[key]`` as a string; a missing (when required) or non-string value is a :class:`DataError`."""
    value = obj.get(key)
    if value is None:
        if required:
            raise DataError(f"{where}: {path}{key}: missing; expected a string")
        return None
    if not isinstance(value, str):
        got = f"{type(value).__name__} {_short(value)}"
        raise DataError(f"{where}: {path}{key}: got {got}; expected a string")
    return value


def _syntax_error(src: Source, exc: json.JSONDecodeError) -> DataError:
    return DataError(f"{src.name}:{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
