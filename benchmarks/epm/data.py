"""EPM cases: our English persona cards (``epm_en.json`` beside this module, or a file in the same
format) and the EMPA benchmark's own case files, which users download themselves (CC BY-NC 4.0; never
shipped here; its layout: docs/benchmarks.md, EPM).

Our format is a JSON list (or JSONL) of objects::

    {"id": "epm-en-01", "name": "Maya", "topic": "...", "situation": "...", "threshold": "high",
     "needs": {"cognitive": "high", "affective": "medium", "proactive": "low"},
     "stages": [{"title": "...", "content": "..."}, ...],            # released by the director
     "memories": ["...", ...], "iedr": {"C.1": 2, ..., "P.3": 1},    # optional
     "profile": "...", "persona": {"outer": "...", "inner": "..."}, "wants_to_share": "...",
     "hopes_for": "...", "background": "...", "category": "..."}    # optional

With EMPA's ``official_cases.txt`` only those cases run, as in the published benchmark. Every error
names the file and line or field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rapo_echo.benchmarks.epm.user import PersonaCard, Stage
from rapo_echo.benchmarks.epm.vectors import IEDR_KEYS
from rapo_echo.data.files import Record, expect_object, get_str, open_source, read_records
from rapo_echo.errors import DataError

BUNDLED = Path(__file__).parent / "epm_en.json"
LEVELS = ("low", "medium", "high")
NEEDS = ("cognitive", "affective", "proactive")
_EMPA_LEVELS = {"低": "low", "中": "medium", "高": "high"}


def load_epm_cases(path: str | Path | None = None) -> list[PersonaCard]:
    """The cases in ``path``: our JSON/JSONL file (default: the bundled English set) or an EMPA folder."""
    if path is not None and Path(path).is_dir():
        return load_empa_cases(Path(path))
    src = open_source(BUNDLED if path is None else path)
    cards = [card_from_record(r) for r in read_records(src)]
    if not cards:
        raise DataError(f"{src.name}: no EPM cases")
    return cards


def _level(value: Any, where: str, field: str) -> str:
    if value not in LEVELS:
        raise DataError(f"{where}: {field}: got {value!r}; expected one of {', '.join(LEVELS)}")
    return str(value)


def _iedr(value: Any, where: str) -> dict[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise DataError(f"{where}: iedr: expected an object of nine levels (C.1 ... P.3)")
    for key in IEDR_KEYS:
        level = value.get(key)
        if isinstance(level, bool) or level not in (0, 1, 2, 3):
            raise DataError(f"{where}: iedr.{key}: got {level!r}; expected a level 0, 1, 2 or 3")
    extra = sorted(set(value) - set(IEDR_KEYS))
    if extra:
        raise DataError(f"{where}: iedr: unknown indicators {extra}; expected {', '.join(IEDR_KEYS)}")
    return {k: value[k] for k in IEDR_KEYS}


def card_from_record(record: Record) -> PersonaCard:
    """One persona card of our format (see the module docstring)."""
    obj, where = expect_object(record), record.where
    name = get_str(obj, "name", where) or ""
    case_id = get_str(obj, "id", where) or ""
    threshold = _level(obj.get("threshold"), where, "threshold")
    needs = obj.get("needs")
    if not isinstance(needs, dict):
        raise DataError(f"{where}: needs: expected an object with cognitive, affective and proactive")
    for n in NEEDS:
        _level(needs.get(n), where, f"needs.{n}")
    stages_raw = obj.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise DataError(f"{where}: stages: expected a non-empty list of {{title, content}} objects")
    stages = []
    for i, s in enumerate(stages_raw):
        if not isinstance(s, dict):
            raise DataError(f"{where}: stages[{i}]: expected an object with title and content")
        stages.append(
            Stage(
                get_str(s, "title", where, f"stages[{i}].") or "",
                get_str(s, "content", where, f"stages[{i}].") or "",
            )
        )
    memories = obj.get("memories", [])
    if not isinstance(memories, list) or not all(isinstance(m, str) for m in memories):
        raise DataError(f"{where}: memories: expected a list of strings")
    persona = obj.get("persona") or {}
    if not isinstance(persona, dict):
        raise DataError(f"{where}: persona: expected an object with outer and inner")
    lines = [f"Name: {name}"]
    for label, key in (("About", "profile"), ("Topic on your mind", "topic")):
        value = get_str(obj, key, where, required=key == "topic")
        if value:
            lines.append(f"{label}: {value}")
    if persona:
        lines.append(f"How you come across: {get_str(persona, 'outer', where, 'persona.')}")
        lines.append(f"Who you are inside: {get_str(persona, 'inner', where, 'persona.')}")
    lines.append(f"Empathy threshold: {threshold}")
    for label, key in (
        ("What you want to get off your chest", "wants_to_share"),
        ("What would make you feel understood", "hopes_for"),
        ("Background", "background"),
        ("Your situation now", "situation"),
    ):
        value = get_str(obj, key, where, required=key == "situation")
        if value:
            lines.append(f"{label}: {value}")
    lines.append(
        "Your needs right now: "
        + ", ".join(f"{n} empathy {needs[n]} priority" for n in NEEDS)
        + " (cognitive: being understood; affective: having your feelings shared; proactive: being "
        "affirmed and helped to act)"
    )
    meta = {"threshold": threshold, "needs": dict(needs), "source": where}
    if "category" in obj:
        meta["category"] = get_str(obj, "category", where)
    return PersonaCard(
        id=case_id,
        name=name,
        card="\n".join(lines),
        stages=tuple(stages),
        memories=tuple(memories),
        opening=get_str(obj, "topic", where),
        iedr=_iedr(obj.get("iedr"), where),
        meta=meta,
    )


# ---------------------------------------------------------------------------- EMPA's files


def _empa_root(path: Path) -> Path:
    for candidate in (path, path / "empa" / "data", path / "data"):
        if (candidate / "cases").is_dir():
            return candidate
    raise DataError(
        f"{path}: not an EMPA data folder: expected cases/script_NNN.md and "
        "scenarios/character_stories.json (the EMPA repository root, or its empa/data folder)"
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def _section(text: str, tag: str) -> str | None:
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.S)
    return m.group(1).strip() if m else None


def load_empa_cases(path: Path) -> list[PersonaCard]:
    """EMPA's persona cards and story stages (see the module docstring)."""
    root = _empa_root(path)
    stories_path = root / "scenarios" / "character_stories.json"
    if not stories_path.is_file():
        raise DataError(f"{stories_path}: not found (EMPA's story stages)")
    stories = _read_json(stories_path)
    if not isinstance(stories, list):
        raise DataError(f"{stories_path}: expected a JSON list of scenarios")
    by_id: dict[str, dict[str, Any]] = {}
    for i, s in enumerate(stories):
        if isinstance(s, dict) and isinstance(s.get("剧本编号"), str):
            by_id[s["剧本编号"]] = s
        else:
            raise DataError(f"{stories_path}: item {i}: expected an object with a '剧本编号' (script id)")
    official = root / "official_cases.txt"
    if official.is_file():
        ids = [line.strip() for line in official.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        ids = sorted(p.stem for p in (root / "cases").glob("script_*.md"))
    meta = _empa_metadata(root)
    iedr = _empa_iedr(root)
    cards = []
    for lineno, case_id in enumerate(ids, 1):
        md = root / "cases" / f"{case_id}.md"
        if not md.is_file():
            where = f"{official}:{lineno}" if official.is_file() else str(root / "cases")
            raise DataError(f"{where}: case {case_id!r} has no card file {md}")
        if case_id not in by_id:
            raise DataError(f"{stories_path}: no scenario with 剧本编号 {case_id!r} (needed by {md})")
        cards.append(_empa_card(case_id, md, by_id[case_id], meta.get(case_id, {}), iedr.get(case_id)))
    if not cards:
        raise DataError(f"{root / 'cases'}: no script_*.md case files")
    return cards


def _empa_card(
    case_id: str, md: Path, story: dict[str, Any], meta: dict[str, Any], iedr: dict[str, int] | None
) -> PersonaCard:
    text = md.read_text(encoding="utf-8")
    progression = story.get("故事的经过")
    if not isinstance(progression, dict) or not progression:
        raise DataError(f"scenario {case_id}: field 故事的经过 (story stages) missing or empty")
    stages = []
    for key in sorted(progression, key=lambda k: int(re.sub(r"\D", "", k) or 0)):
        value = progression[key]
        if isinstance(value, dict):
            stages.append(Stage(str(value.get("标题", "")), str(value.get("内容", ""))))
        else:
            stages.append(Stage("", str(value)))
    experience = _section(text, "experience") or ""
    memories = tuple(line.strip() for line in experience.splitlines() if re.match(r"\s*\S+经历[：:]", line))
    name = re.search(r"姓名[：:]\s*([^\s，,。]+)", text)
    threshold = re.search(r"共情阈值【(.)", text)
    out_meta: dict[str, Any] = {"source": str(md), "language": "zh"}
    if threshold:
        out_meta["threshold"] = _EMPA_LEVELS.get(threshold.group(1), threshold.group(1))
    if meta.get("category"):
        out_meta["category"] = meta["category"]
    return PersonaCard(
        id=case_id,
        name=name.group(1) if name else case_id,
        card=text,
        stages=tuple(stages),
        memories=memories or ((experience,) if experience else ()),
        opening=None,
        iedr=iedr,
        meta=out_meta,
    )


def _empa_metadata(root: Path) -> dict[str, dict[str, Any]]:
    path = root / "case_metadata.json"
    if not path.is_file():
        return {}
    data = _read_json(path)
    rows = data.get("sampled_cases", []) if isinstance(data, dict) else []
    return {r["script_id"]: r for r in rows if isinstance(r, dict) and "script_id" in r}


def _empa_iedr(root: Path) -> dict[str, dict[str, int]]:
    path = root / "precomputed" / "iedr_batch_results.json"
    if not path.is_file():
        return {}
    data = _read_json(path)
    items = data.items() if isinstance(data, dict) else ((i.get("script_id"), i) for i in data)
    out = {}
    for case_id, item in items:
        if not isinstance(item, dict) or item.get("status", "success") != "success":
            continue
        levels = item.get("iedr") or {}
        if all(isinstance(levels.get(k), int) and levels[k] in (0, 1, 2, 3) for k in IEDR_KEYS):
            out[str(case_id)] = {k: levels[k] for k in IEDR_KEYS}
    return out
