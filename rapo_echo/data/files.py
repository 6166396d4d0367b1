"""The one reader of data rows: every file, folder or Hub dataset a data key names, each row with its
location so errors can point at it (docs/data.md has the sources and what each error names).

JSON and JSONL (a list, one object, or one object a line, decided from the content) stay with our reader
rather than ``datasets``' JSON builder because it keeps line numbers; tables, ``save_to_disk`` folders
and Hub ids go through ``datasets``; ``bundled:NAME`` is a file in ``rapo_echo/examples``. ``columns``
renames a source's columns to the names the formats read before anything else.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rapo_echo.errors import DataError
from rapo_echo.rundir import SUMMARY_FILE

if TYPE_CHECKING:
    from importlib.abc import Traversable

BUNDLED_PREFIX = "bundled:"
BUNDLED_SCENARIOS = "scenarios_en.jsonl"
BUNDLED_ESCONV = "esconv_style_en.json"
# File extensions ``datasets`` reads for us, and the builder that reads each.
TABLE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".csv": "csv", ".tsv": "csv"}
JSON_SUFFIXES = (".json", ".jsonl")
SOURCES_HELP = (
    "a JSON or JSONL file, a .parquet / .arrow / .csv file, a folder saved with datasets' save_to_disk, "
    "a Hugging Face Hub dataset id (owner/name) or bundled:NAME"
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_WS = re.compile(r"\s*")


@dataclass(frozen=True)
class Source:
    """One data source, opened. ``name`` is what messages show; ``path`` a real file, if any; ``text``
    the content of a JSON / JSONL source; ``table`` the ``datasets.Dataset`` of any other."""

    name: str
    text: str | None
    stem: str
    path: str | None
    table: Any = None


@dataclass(frozen=True)
class Record:
    """One row and where it is (``file:line``, ``file:line (list index i)`` or ``source row i``)."""

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
    """Names of the JSON / JSONL data files shipped in ``rapo_echo/examples`` (not the model configs,
    ``*.config.json``, a plan reads)."""
    folder = resources.files("rapo_echo") / "examples"
    names = [p.name for p in folder.iterdir() if p.name.endswith(JSON_SUFFIXES)]
    return sorted(n for n in names if not n.endswith(".config.json"))


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


def read_rows(
    path: str | os.PathLike[str] | None,
    *,
    split: str = "train",
    subset: str | None = None,
    columns: Mapping[str, str] | None = None,
    limit: int | None = None,
) -> list[Record]:
    """Every row of a data source (see the module doc; ``None`` = the bundled English scenarios), at
    most ``limit``, with ``columns`` renamed. The loader every command reads data through."""
    return read_records(open_source(path, split=split, subset=subset), limit=limit, columns=columns)


def open_source(
    path: str | os.PathLike[str] | None, *, split: str = "train", subset: str | None = None
) -> Source:
    """Open a data source (``None`` = the bundled English scenarios, ``bundled:NAME`` = a bundled file).
    ``split`` and ``subset`` apply to Hub datasets and saved ``DatasetDict`` folders."""
    kind, spec = locate(path)
    if kind == "bundled":
        name = spec[len(BUNDLED_PREFIX) :]
        res = bundled_file(name)
        real = str(res) if Path(str(res)).is_file() else None
        return Source(str(res), res.read_text(encoding="utf-8"), Path(name).stem, real)
    p = Path(spec)
    if kind == "folder":
        return _saved_dataset(p, split)
    if kind == "file":
        builder = TABLE_BUILDERS.get(p.suffix.lower())
        if builder is not None:
            return _table_file(p, builder)
        return _text_file(p)
    return _hub_dataset(spec, split, subset)


def locate(path: str | os.PathLike[str] | None) -> tuple[str, str]:
    """What a data source is, without reading it: ``(kind, spec)``, kind ``bundled``, ``folder``, ``file``
    or ``hub``; a :class:`DataError` for a local file that is not there (a plan checks it this way)."""
    spec = BUNDLED_PREFIX + BUNDLED_SCENARIOS if path is None else os.fspath(path)
    if spec.startswith(BUNDLED_PREFIX):
        bundled_file(spec[len(BUNDLED_PREFIX) :])  # an unknown bundled name is refused here too
        return "bundled", spec
    p = Path(spec)
    if p.is_dir():
        return "folder", spec
    if p.is_file():
        return "file", spec
    if p.suffix.lower() in (*JSON_SUFFIXES, *TABLE_BUILDERS) or not _HUB_ID.match(spec):
        raise DataError(f"{p}: data file not found; a data source is {SOURCES_HELP}")
    if spec.lower() in _loader_names():
        raise DataError(
            f"{spec}: no such file here, and {spec!r} is the name of a datasets loader, not a dataset (it "
            "would read every matching file under the working folder); give a file (e.g. "
            f"data.{spec.lower()}) or a Hub id (owner/name); a data source is {SOURCES_HELP}"
        )
    return "hub", spec


def _loader_names() -> frozenset[str]:
    """The names of ``datasets``' packaged loaders (``csv``, ``json``, ``parquet``, ``text`` ...), which
    ``load_dataset`` takes for a dataset name."""
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    except ImportError:  # a datasets without that table: the loaders every version has
        return frozenset({"arrow", "csv", "json", "pandas", "parquet", "text", "imagefolder", "audiofolder"})
    return frozenset(_PACKAGED_DATASETS_MODULES)


def _text_file(p: Path) -> Source:
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        kind = " (a parquet file: name it .parquet)" if data.startswith(b"PAR1") else ""
        raise DataError(
            f"{p}: not UTF-8 text (byte {exc.start}){kind}; a file of this name is read as JSON or JSONL. "
            f"A data source is {SOURCES_HELP}"
        ) from exc
    return Source(str(p), text, p.stem, str(p))


def _table_file(p: Path, builder: str) -> Source:
    import datasets

    kwargs = {"delimiter": "\t"} if p.suffix.lower() == ".tsv" else {}
    try:
        table = datasets.load_dataset(builder, data_files=str(p), split="train", **kwargs)
    except Exception as exc:  # datasets raises many kinds (ArrowInvalid, DatasetGenerationError, ...)
        raise DataError(f"{p}: datasets could not read it as {builder}: {_first_line(exc)}") from exc
    return Source(str(p), None, p.stem, str(p), table)


def _saved_dataset(p: Path, split: str) -> Source:
    if not ((p / "dataset_dict.json").is_file() or (p / "state.json").is_file()):
        raise DataError(
            f"{p}: is a folder without a dataset saved by datasets' save_to_disk (no state.json or "
            f"dataset_dict.json); a data source is {SOURCES_HELP}"
        )
    import datasets

    try:
        saved = datasets.load_from_disk(str(p))
    except Exception as exc:
        raise DataError(f"{p}: datasets could not load the saved dataset: {_first_line(exc)}") from exc
    return Source(str(p), None, p.name, None, _pick_split(saved, split, str(p), "data.split"))


def _hub_dataset(spec: str, split: str, subset: str | None) -> Source:
    import datasets

    try:
        loaded = datasets.load_dataset(spec, name=subset, split=split)
    except ValueError as exc:
        if "split" in str(exc).lower():  # an unknown split: say which exist
            raise DataError(f"{spec}: no split {split!r} ({_first_line(exc)}); set data.split") from exc
        raise DataError(f"{spec}: could not load it from the Hugging Face Hub: {_first_line(exc)}") from exc
    except Exception as exc:  # offline, no such dataset, gated, ...
        raise DataError(
            f"{spec}: not a local file or folder, and the Hugging Face Hub could not give a dataset of that "
            f"name ({type(exc).__name__}: {_first_line(exc)}); a data source is {SOURCES_HELP}"
        ) from exc
    name = f"{spec}[{split}]" if subset is None else f"{spec}/{subset}[{split}]"
    return Source(name, None, spec.rsplit("/", 1)[-1], None, _pick_split(loaded, split, spec, "data.split"))


def _pick_split(loaded: Any, split: str, name: str, key: str) -> Any:
    """The ``split`` of a ``DatasetDict`` (a ``Dataset`` is returned as it is)."""
    if not hasattr(loaded, "keys"):
        return loaded
    if split not in loaded:
        raise DataError(f"{name}: no split {split!r}; it has {', '.join(loaded.keys())} (set {key})")
    return loaded[split]


def read_records(
    src: Source, limit: int | None = None, columns: Mapping[str, str] | None = None
) -> list[Record]:
    """Every top-level record of ``src`` (at most ``limit``), each with its location; ``columns``
    renames each row's keys (a row without a mapped column is an error naming it)."""
    if src.table is not None:
        records = _table_rows(src, limit)
    else:
        try:
            records = _read_records(src, limit)
        except RecursionError:
            raise DataError(f"{src.name}: JSON nested too deeply to read; is the file corrupted?") from None
    return [_renamed(r, columns) for r in records] if columns else records


def _table_rows(src: Source, limit: int | None) -> list[Record]:
    out = []
    for i, row in enumerate(src.table):
        if limit is not None and i >= limit:
            break
        out.append(Record(f"{src.name} row {i}", _without_nulls(row)))
    return out


def _without_nulls(value: Any) -> Any:
    """A table row without the ``None`` values Arrow fills in for keys a row does not have (a struct
    column holds the union of every row's keys)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _renamed(record: Record, columns: Mapping[str, str]) -> Record:
    if not isinstance(record.data, dict):
        return record
    missing = [c for c in columns if c not in record.data]
    if missing:
        raise DataError(
            f"{record.where}: data.columns: column {missing[0]!r} is not in this row (its columns: "
            f"{', '.join(map(str, record.data)) or 'none'})"
        )
    renamed = {columns.get(k, k): v for k, v in record.data.items()}
    return Record(record.where, renamed)


def made_by(path: str | None) -> str:
    """Which data command wrote ``path`` and what it reported, where its folder's summary says so (``data``
    commands write ``summary.json`` beside their dataset), for the message of an empty file; else ''."""
    if path is None:
        return ""
    summary = Path(path).parent / SUMMARY_FILE
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    dataset = data.get("dataset") if isinstance(data, dict) else None
    if not isinstance(dataset, dict) or dataset.get("file") != Path(path).name or not data.get("command"):
        return ""
    if data.get("complete") is False:  # stopped (a signal, a breaker) or with contexts left to run
        why = f"{data['stopped']}; " if data.get("stopped") else ""
        return (
            f". The stage that wrote it, `rapo-echo data {data['command']}` did not finish ({why}"
            f"{data.get('n_done', 0)} of {data.get('n_contexts', '?')} contexts done; {summary}): "
            "run the same command again to finish it"
        )
    figures = data.get("figures") if isinstance(data.get("figures"), dict) else {}
    counts = ", ".join(f"{k} {v}" for k, v in figures.items() if isinstance(v, (int, float)))
    return (
        f". The stage that wrote it, `rapo-echo data {data['command']}`, made {dataset.get('rows', 0)} rows"
        + (f" ({counts})" if counts else "")
        + f"; {summary} has its figures, and its last message the switches that would give it rows"
    )


def _read_records(src: Source, limit: int | None) -> list[Record]:
    text = src.text or ""
    start = _WS.match(text).end()
    if start == len(text):
        raise DataError(f"{src.name}: the file is empty; expected JSON or JSONL records{made_by(src.path)}")
    first = text[start]
    if first == "[":
        return _json_list(src, text, start, limit)
    if first != "{":
        line = text.count("\n", 0, start) + 1
        raise DataError(
            f"{src.name}:{line}: expected a JSON list ('[') or JSON objects ('{{'), got {first!r}; a file of "
            f"this name is read as JSON or JSONL. A data source is {SOURCES_HELP}"
        )
    try:
        return [Record(f"{src.name}:{text.count(chr(10), 0, start) + 1}", loads_json(text))]
    except json.JSONDecodeError as exc:
        # one pretty-printed object opens with a lone '{' line; anything else is read as JSONL,
        # which names the first line that does not parse
        if text[start:].split("\n", 1)[0].strip() == "{":
            raise _syntax_error(src, exc) from None
    return _jsonl(src, text, limit)


def _jsonl(src: Source, text: str, limit: int | None) -> list[Record]:
    out: list[Record] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
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


def _json_list(src: Source, text: str, start: int, limit: int | None) -> list[Record]:
    """Decode a top-level JSON list element by element to know the line each element starts on."""
    decoder = json.JSONDecoder(parse_int=parse_int)
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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
