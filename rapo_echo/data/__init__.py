"""Scenario data: loaders for our format and the ESConv family, hindsight selection, a resumable stream.

``load_scenarios()`` with no path gives the bundled English scenarios; ``bundled:NAME`` names any
file in ``rapo_echo/examples``. Formats: ``scenarios`` (ours), ``esconv`` (raw ESConv /
FailedESConv), ``ppdpp`` (PPDPP JSONL), ``hf_esconv`` (rows of the HF ``thu-coai/esconv`` dataset,
read through ``datasets``), ``sage`` (RLVER / SAGE simulated-user profiles: one scenario per profile,
the profile row kept whole, the dialogue its ``first_talk`` or empty), or ``auto`` (decided from the
first record's keys).
"""

from __future__ import annotations

import os
from typing import Any

from rapo_echo.config import DataConfig, SelectionConfig
from rapo_echo.data.esconv import (
    NEUTRAL_FEEDBACK,
    Dialogue,
    Turn,
    Utterance,
    dialogue_scenarios,
    esconv_dialogue,
    feedback_pivot_scores,
    reformatted_dialogue,
    select_turns,
)
from rapo_echo.data.files import (
    BUNDLED_ESCONV,
    BUNDLED_PREFIX,
    BUNDLED_SCENARIOS,
    Source,
    bundled_file,
    bundled_names,
    expect_object,
    loads_json,
    open_source,
    read_records,
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
    "BUNDLED_PREFIX",
    "BUNDLED_SCENARIOS",
    "FORMATS",
    "NEUTRAL_FEEDBACK",
    "SUPPORT_NEEDS",
    "Dialogue",
    "ScenarioStream",
    "Turn",
    "Utterance",
    "bundled_file",
    "bundled_names",
    "detect_format",
    "dialogue_scenarios",
    "feedback_pivot_scores",
    "load_dialogues",
    "load_scenarios",
    "scenarios_from_config",
    "select_turns",
]


def load_scenarios(
    path: PathLike | None = None,
    fmt: str = "auto",
    selection: SelectionConfig | None = None,
    limit: int | None = None,
) -> list[Scenario]:
    """Load and validate scenarios (``path=None``: the bundled English set); the first ``limit`` are kept.

    ESConv-family files give one scenario per supporter turn chosen by ``selection`` (see
    :func:`select_turns`). Every problem is a :class:`DataError` naming the file, line and field.
    """
    if limit is not None and limit < 1:
        raise DataError(f"limit: got {limit}; expected an integer >= 1 (or None for all)")
    selection = selection or SelectionConfig()
    src = open_source(path)
    fmt = _resolve_format(src, fmt)
    if fmt == "scenarios":
        records = read_records(src)
        if not records:
            raise DataError(f"{src.name}: holds an empty list; expected at least one scenario")
        scenarios = parse_scenarios(records, src.stem, src.name)
    elif fmt == "sage":
        scenarios = _profile_scenarios(src)
    else:
        scenarios = [s for d in _dialogues(src, fmt) for s in dialogue_scenarios(d, selection)]
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
    return load_scenarios(cfg.path, fmt=cfg.format, selection=cfg.selection, limit=cfg.limit)


def detect_format(data: Any, where: str) -> str:
    """The format a record belongs to, from its keys."""
    if not isinstance(data, dict):
        raise DataError(f"{where}: expected a JSON object per record, got {type(data).__name__}")
    if "messages" in data or "opening" in data:
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
        f"{where}: cannot tell the data format from the keys {sorted(data)}; expected 'messages' or "
        "'opening' (scenarios), 'dialog' (esconv / ppdpp), 'text' holding a JSON conversation "
        "(hf_esconv) or 'player' / 'scene' (sage profiles); or set the format explicitly (fmt= / data.format)"
    )


def _resolve_format(src: Source, fmt: str) -> str:
    if fmt not in FORMATS:
        raise DataError(f"{src.name}: unknown data format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if fmt != "auto":
        return fmt
    first = read_records(src, limit=1)
    if not first:
        raise DataError(f"{src.name}: holds an empty list; expected at least one record")
    return detect_format(first[0].data, first[0].where)


def _profile_scenarios(src: Source) -> list[Scenario]:
    """One scenario per simulated-user profile (validated by the simulator's profile reader)."""
    out = []
    for i, record in enumerate(read_records(src)):
        row = expect_object(record)
        profile = SageProfile.from_mapping(row, record.where)
        ident = profile.id or f"{src.stem}-{i + 1}"
        messages = [{"role": "user", "content": profile.first_talk}] if profile.first_talk else []
        meta = {"file": src.name, "format": "sage", "where": record.where}
        out.append(Scenario(ident, messages, profile=dict(row), meta=meta))  # type: ignore[arg-type]
    if len({s.id for s in out}) != len(out):
        raise DataError(f"{src.name}: profile ids are not unique")
    return out


def _dialogues(src: Source, fmt: str) -> list[Dialogue]:
    if fmt == "hf_esconv":
        return _hf_dialogues(src)
    records = read_records(src)
    if not records:
        raise DataError(f"{src.name}: holds an empty list; expected at least one conversation")
    out = []
    for i, record in enumerate(records):
        obj = expect_object(record)
        if fmt == "esconv":
            out.append(esconv_dialogue(obj, where=record.where, index=i, stem=src.stem, file=src.name))
        else:
            out.append(
                reformatted_dialogue(
                    obj, where=record.where, index=i, stem=src.stem, file=src.name, source="ppdpp"
                )
            )
    return out


def _hf_dialogues(src: Source) -> list[Dialogue]:
    """Rows of HF ``thu-coai/esconv`` (a ``text`` column, one JSON conversation each), via ``datasets``."""
    if src.path is None:
        raise DataError(f"{src.name}: hf_esconv needs a file on disk")
    import datasets

    try:
        rows = datasets.load_dataset("json", data_files=src.path, split="train")
    except Exception as exc:  # datasets wraps parse errors; find the exact line ourselves
        read_records(src)
        raise DataError(f"{src.name}: the datasets library could not read the file: {exc}") from exc
    if "text" not in rows.column_names:
        columns = ", ".join(rows.column_names)
        raise DataError(
            f"{src.name}: text: column missing (columns: {columns}); hf_esconv rows hold one conversation "
            "as a JSON string in 'text'"
        )
    out, locations = [], None
    for i, text in enumerate(rows["text"]):
        try:
            conv = loads_json(text) if isinstance(text, str) else text
            if not isinstance(conv, dict):
                raise ValueError(f"it holds {type(conv).__name__}, not an object")
        except (TypeError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            locations = locations or read_records(src)
            raise DataError(
                f"{locations[i].where}: text: {exc}; expected one conversation as a JSON object string"
            ) from None
        try:
            out.append(
                reformatted_dialogue(
                    conv,
                    where=f"{src.name} row {i}",
                    index=i,
                    stem=src.stem,
                    file=src.name,
                    source="hf_esconv",
                    path="text.",
                )
            )
        except DataError as exc:
            locations = locations or read_records(src)
            raise DataError(str(exc).replace(f"{src.name} row {i}", locations[i].where, 1)) from None
    if not out:
        raise DataError(f"{src.name}: holds no rows; expected at least one conversation")
    return out
