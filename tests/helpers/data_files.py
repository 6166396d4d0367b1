"""Small data files for tests: rows as JSON lines, an ESConv file (what ``esconv-ref`` and the Python API
read), and a file that a loader refuses."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rapo_echo.errors import DataError


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """``rows`` as one JSON line each in ``path``; returns ``path``."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def esconv_file(tmp_path: Path, n: int = 3) -> str:
    """``n`` two-turn ESConv dialogues in ``tmp_path/esc.jsonl``; returns its path."""
    rows = [
        {
            "emotion_type": "sadness",
            "problem_type": "job crisis",
            "situation": f"situation number {i}",
            "dialog": [
                {"speaker": "usr", "text": f"I feel low {i}."},
                {"speaker": "sys", "text": "I am sorry."},
            ],
        }
        for i in range(n)
    ]
    return str(write_jsonl(tmp_path / "esc.jsonl", rows))


def refuses(load: Callable[[Path], object], path: Path, text: str, match: str) -> None:
    """``load`` of ``path`` holding ``text`` raises a :class:`DataError` that matches ``match``."""
    path.write_text(text)
    with pytest.raises(DataError, match=match):
        load(path)
