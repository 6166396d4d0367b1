"""An evaluation folder as the report and ``compare`` read it: its summary (recomputed from the
records by :func:`rapo_echo.benchmarks.runner.compute_summary`, so it is never stale), its records and
its card."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapo_echo.benchmarks.results import CONFIG_FILE, RESULTS_FILE, read_records
from rapo_echo.errors import DataError


@dataclass
class EvalResult:
    path: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    label: str = ""
    card_differs: list[str] = field(default_factory=list)  # shown although its card differs: what differs

    @property
    def benchmark(self) -> str:
        return self.summary["benchmark"]

    @property
    def card(self) -> dict[str, Any]:
        return self.summary.get("card") or {}


def is_eval(p: Path) -> bool:
    """Whether ``p`` is an evaluation folder (``config.json`` and ``results.jsonl``)."""
    return (p / CONFIG_FILE).is_file() and (p / RESULTS_FILE).is_file()


def read_eval(path: str | Path) -> EvalResult:
    """One evaluation folder, labelled by its policy (else its folder name)."""
    from rapo_echo.benchmarks.runner import compute_summary

    p = Path(path)
    if not is_eval(p):
        raise DataError(f"{p}: not an evaluation folder (no {CONFIG_FILE} and {RESULTS_FILE})")
    summary = compute_summary(p)
    label = str(summary.get("models", {}).get("policy") or p.name)
    return EvalResult(p, summary, read_records(p / RESULTS_FILE), label)
