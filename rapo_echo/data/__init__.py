"""Scenario data: one loader for every source and format, hindsight selection, a resumable stream.

:func:`load_scenarios` is how every command reads dialogue contexts. Its ``path`` is any data source
:func:`read_rows` reads (JSON / JSONL, parquet, arrow, csv, a ``save_to_disk`` folder, a Hub dataset
id, ``bundled:NAME``; ``None``: the bundled English scenarios). Formats: ``scenarios`` (ours, and TRL's
``prompt`` / prompt-completion / ``messages`` rows), ``esconv`` (raw ESConv / FailedESConv),
``ppdpp`` (PPDPP JSONL), ``hf_esconv`` (rows of the HF ``thu-coai/esconv`` dataset: a ``text`` column
holding one conversation as JSON), ``sage`` (RLVER / SAGE simulated-user profiles: one scenario per
profile, the profile row kept whole, the dialogue its ``first_talk`` or empty), or ``auto`` (decided
from the first row's keys).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rapo_echo.config import DataConfig, SelectionConfig
from rapo_echo.data.esconv import (
    NEUTRAL_FEEDBACK,
    Dialogue,
    dialogue_scenarios,
    esconv_dialogue,
    feedback_pivot_scores,
    reformatted_dialogue,
    select_turns,
)
from rapo_echo.data.files import (
    BUNDLED_ESCONV,
    BUNDLED_SCENARIOS,
    Source,
    bundled_file,
    bundled_names,
    expect_object,
    loads_json,
    open_source,
    read_records,
    read_rows,
)
from rapo_echo.data.sage_profiles import SageProfile
from rapo_echo.data.scenario_file import SUPPORT_NEEDS, parse_scenarios
from rapo_echo.data.stream import ScenarioStream
from rapo_echo.errors import DataError
from rapo_echo.types import Scenario

FORMATS = ("auto", "scenarios", "esconv", "ppdpp", "hf_esconv", "sage")
PathLike = str | os.PathLike[str]

__all__ = [
    "BUNDLED_ESCONV",
    "BUNDLED_SCENARIOS",
    "FORMATS",
    "NEUTRAL_FEEDBACK",
    "SUPPORT_NEEDS",
    "Dialogue",
    "ScenarioStream",
    "bundled_file",
    "bundled_names",
    "detect_format",
    "dialogue_scenarios",
    "feedback_pivot_scores",
    "load_dialogues",
    "load_scenarios",
    "read_rows",
    "scenarios_from_config",
    "select_turns",
]


def load_scenarios(
    path: PathLike | None = None,
    fmt: str = "auto",
    selection: SelectionConfig | None = None,
    limit: int | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    split: str = "train",
    subset: str | None = None,
) -> list[Scenario]:
    """Load and validate dialogue contexts (``path=None``: the bundled English set); the first ``limit``
    are kept. ``path`` is any source :func:`read_rows` reads; ``columns`` renames the source's columns
    to the names the format reads; ``split`` / ``subset`` pick a Hub dataset's rows.

    ESConv-family files give one scenario per supporter turn chosen by ``selection`` (see
    :func:`select_turns`). Every problem is a :class:`DataError` naming the file, line (or row) and field.
    """
    if limit is not None and limit < 1:
        raise DataError(f"limit: got {limit}; expected an integer >= 1 (or None for all)")
    selection = selection or SelectionConfig()
    src = open_source(path, split=split, subset=subset)
    fmt = _resolve_format(src, fmt, columns)
    if fmt == "scenarios":
        records = read_records(src, columns=columns)
        if not records:
            raise DataError(f"{src.name}: {_nothing(src)}; expected at least one scenario")
        scenarios = parse_scenarios(records, src.stem, src.name)
    elif fmt == "sage":
        scenarios = _profile_scenarios(src, columns)
    else:
        scenarios = [s for d in _dialogues(src, fmt, columns) for s in dialogue_scenarios(d, selection)]
    if not scenarios:
        raise DataError(
            f"{src.name}: no scenarios were selected (format {fmt}); lower data.selection.threshold or "
            "min_history_turns, or use data.selection.signal: none"
        )
    return scenarios[:limit]


def load_dialogues(path: PathLike, fmt: str = "auto") -> list[Dialogue]:
    """Whole ESConv-family conversations (for benchmarks that replay or simulate full dialogues)."""
    src = open_source(path)
    fmt = _resolve_format(src, fmt)
    if fmt in ("scenarios", "sage"):
        raise DataError(f"{src.name}: holds {fmt} records, not ESConv-family conversations")
    return _dialogues(src, fmt)


def scenarios_from_config(cfg: DataConfig) -> list[Scenario]:
    """:func:`load_scenarios` with a run config's ``data`` section."""
    return load_scenarios(
        cfg.path,
        fmt=cfg.format,
        selection=cfg.selection,
        limit=cfg.limit,
        columns=cfg.columns,
        split=cfg.split,
        subset=cfg.subset,
    )


FORMAT_KEYS = (
    "'messages', 'prompt' or 'opening' (scenarios: ours and TRL's rows), 'dialog' (esconv / ppdpp), "
    "'text' holding a JSON conversation (hf_esconv) or 'player' / 'scene' (sage profiles)"
)


def detect_format(data: Any, where: str) -> str:
    """The format a record belongs to, from its keys."""
    if not isinstance(data, dict):
        raise DataError(f"{where}: expected a JSON object per record, got {type(data).__name__}")
    if "messages" in data or "opening" in data or "prompt" in data:
        return "scenarios"
    if "player" in data or "scene" in data:
        return "sage"
    dialog = data.get("dialog")
    if isinstance(dialog, list):
        first = next((u for u in dialog if isinstance(u, dict)), {})
        if "content" in first or first.get("speaker") in ("seeker", "supporter", "speaker", "listener"):
            return "esconv"
        if "text" in first or first.get("speaker") in ("usr", "sys"):
            return "ppdpp"
    text = data.get("text")
    if isinstance(text, dict) or (isinstance(text, str) and text.lstrip().startswith("{")):
        return "hf_esconv"
    raise DataError(
        f"{where}: cannot tell the data format from the keys {sorted(data)}; expected {FORMAT_KEYS}. "
        f"Rename columns with data.columns (e.g. data.columns: {{question: prompt}}), or set data.format "
        f"to one of {', '.join(FORMATS[1:])}"
    )


def _resolve_format(src: Source, fmt: str, columns: Mapping[str, str] | None = None) -> str:
    if fmt not in FORMATS:
        raise DataError(f"{src.name}: unknown data format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if fmt != "auto":
        return fmt
    first = read_records(src, limit=1, columns=columns)
    if not first:
        raise DataError(f"{src.name}: {_nothing(src)}; expected at least one record")
    return detect_format(first[0].data, first[0].where)


def _nothing(src: Source) -> str:
    return "holds no rows" if src.table is not None else "holds an empty list"


def _profile_scenarios(src: Source, columns: Mapping[str, str] | None) -> list[Scenario]:
    """One scenario per simulated-user profile (validated by the simulator's profile reader)."""
    out = []
    for i, record in enumerate(read_records(src, columns=columns)):
        row = expect_object(record)
        profile = SageProfile.from_mapping(row, record.where)
        ident = profile.id or f"{src.stem}-{i + 1}"
        messages = [{"role": "user", "content": profile.first_talk}] if profile.first_talk else []
        meta = {"file": src.name, "format": "sage", "where": record.where}
        out.append(Scenario(ident, messages, profile=dict(row), meta=meta))  # type: ignore[arg-type]  # plain dicts of role and content
    if len({s.id for s in out}) != len(out):
        raise DataError(f"{src.name}: profile ids are not unique")
    return out


def _dialogues(src: Source, fmt: str, columns: Mapping[str, str] | None = None) -> list[Dialogue]:
    records = read_records(src, columns=columns)
    if not records:
        raise DataError(f"{src.name}: {_nothing(src)}; expected at least one conversation")
    out = []
    for i, record in enumerate(records):
        obj = expect_object(record)
        if fmt == "esconv":
            out.append(esconv_dialogue(obj, where=record.where, index=i, stem=src.stem, file=src.name))
        else:
            conv, path = (_hf_conversation(obj, record.where), "text.") if fmt == "hf_esconv" else (obj, "")
            out.append(
                reformatted_dialogue(
                    conv, where=record.where, index=i, stem=src.stem, file=src.name, source=fmt, path=path
                )
            )
    return out


def _hf_conversation(row: dict[str, Any], where: str) -> dict[str, Any]:
    """The conversation of a HF ``thu-coai/esconv`` row: its ``text`` column, one JSON object."""
    if "text" not in row:
        raise DataError(
            f"{where}: text: column missing (columns: {', '.join(row)}); hf_esconv rows hold one "
            "conversation as a JSON string in 'text'"
        )
    text = row["text"]
    try:
        conv = loads_json(text) if isinstance(text, str) else text
        if not isinstance(conv, dict):
            raise ValueError(f"it holds {type(conv).__name__}, not an object")
    except (TypeError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        raise DataError(f"{where}: text: {exc}; expected one conversation as a JSON object string") from None
    return conv
