"""An evaluation's files: ``results.jsonl`` (one line per finished case, appended and flushed as cases
finish), ``config.json`` (what was evaluated, how) and ``summary.json`` (computed from the JSONL).

A crash can leave a half-written last line; it is dropped on the next open (the case runs again). A
malformed line elsewhere is an error naming the file and line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rapo_echo.atomic import write_text_atomic
from rapo_echo.errors import DataError
from rapo_echo.jsonl import read_jsonl, write_failure
from rapo_echo.rundir import SUMMARY_FILE
from rapo_echo.scrub import scrub

__all__ = ["CONFIG_FILE", "RESULTS_FILE", "SUMMARY_FILE"]  # SUMMARY_FILE is rapo_echo.rundir's
RESULTS_FILE = "results.jsonl"
CONFIG_FILE = "config.json"


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a results file (empty when it does not exist); a truncated last line is ignored,
    and of two records with the same id the first is kept."""
    path = Path(path)
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    for lineno, record in read_jsonl(path, "results file"):
        if not isinstance(record, dict) or not isinstance(record.get("id"), str):
            raise DataError(f"{path}:{lineno}: a result record must be a JSON object with a string 'id'")
        if record["id"] not in seen:
            seen.add(record["id"])
            records.append(record)
    return records


class ResultWriter:
    """Appends records to a results file, one flushed and fsynced line each."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_tail()
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 -- closed in __exit__

    def _repair_tail(self) -> None:
        """Drop a half-written last line, or end a complete last line that lacks its newline."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
        except ValueError:
            with open(self.path, "r+b") as fh:
                fh.truncate(cut)
            return
        with open(self.path, "ab") as fh:
            fh.write(b"\n")

    def append(self, record: dict[str, Any]) -> None:
        try:
            self._fh.write(scrub(json.dumps(record, ensure_ascii=False)) + "\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as exc:
            fix = "Free space, then run the same eval command again: the finished cases are kept."
            raise write_failure(self.path, exc, fix) from exc

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()
