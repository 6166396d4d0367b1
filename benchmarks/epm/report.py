"""The EPM part of ``rapo-echo report``: the EPM-Q table (one row per evaluated policy) and each
evaluation's trajectories drawn in C/A/P space (three 2-D projections)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from rapo_echo.benchmarks.plots import trajectory_projections

COLUMNS: tuple[tuple[str, str], ...] = (
    ("success_rate", "success"),
    ("epmq", "EPM-Q"),
    ("outcome", "Outcome"),
    ("efficiency", "Efficiency"),
    ("stability", "Stability"),
    ("idx_rdi", "RDI"),
    ("idx_etot", "E_tot"),
    ("idx_snet", "S_net"),
    ("idx_rho", "rho"),
    ("idx_sproj", "S_proj"),
    ("idx_tau", "tau"),
    ("idx_rpos", "R_pos"),
    ("idx_align", "Align"),
    ("idx_pen", "Pen"),
)


def epmq_table(evals: Sequence[Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the EPM-Q table: success rate (percent), EPM-Q, its three groups and nine
    indices, two decimals; ``n`` = valid cases."""
    header = ["policy", *(label for _, label in COLUMNS), "n"]
    rows = []
    for e in evals:
        m = e.summary["metrics"]
        cells = [e.label]
        for key, _ in COLUMNS:
            value = m.get(key)
            if value is None:
                cells.append("–")
            else:
                cells.append(f"{100 * value:.1f} %" if key == "success_rate" else f"{value:.2f}")
        cells.append(str(e.summary["n_valid"]))
        rows.append(cells)
    return header, rows


def outcome(record: dict[str, Any]) -> str:
    end = str(record.get("info", {}).get("end", ""))
    return "success" if end.startswith("success") else "failure" if end.startswith("failure") else "other"


def epm_section(evals: Sequence[Any], table: Any, img: Any) -> list[str]:
    """HTML parts for the EPM evaluations among ``evals`` (none: empty). ``table(header, rows)`` and
    ``img(png, alt)`` are the report's own HTML helpers."""
    epm = [e for e in evals if e.benchmark == "epm" and e.records]
    if not epm:
        return []
    header, rows = epmq_table(epm)
    parts = [
        "<h2>EPM</h2>" + table(header, rows),
        '<p class="note">Success rate over valid cases; EPM-Q = 0.4 Outcome + 0.2 Efficiency + 0.4 '
        "Stability (100 = meets the benchmark). Trajectories: the deficit P_t from P0 (circle) to the "
        "end (cross); the origin is every need met.</p>",
    ]
    for e in epm:
        paths = [
            (r["id"], [p["P_t"] for p in r["info"]["trajectory"]], outcome(r))
            for r in e.records
            if r.get("valid") and r.get("info", {}).get("trajectory")
        ]
        if paths:
            png = trajectory_projections(f"EPM trajectories: {e.label}", paths)
            parts.append(img(png, f"EPM trajectories of {html.escape(e.label)}"))
    return parts
