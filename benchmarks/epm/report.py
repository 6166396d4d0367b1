"""The EPM part of ``rapo-echo report``: the EPM-Q table (one row per evaluated policy) and each
evaluation's trajectories drawn in C/A/P space (three 2-D projections)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from rapo_echo.benchmarks.plots import png_base64, pyplot

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
            if value is None or not math.isfinite(value):  # never nan or inf as a score
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


OUTCOME_COLOURS = {"success": "#2a9d4b", "failure": "#c0392b", "other": "#7f7f7f"}


def trajectory_projections(
    title: str, paths: Sequence[tuple[str, Sequence[Sequence[float]], str]], *, max_paths: int = 40
) -> str:
    """EPM trajectories in C/A/P space as three 2-D projections (C-A, C-P, A-P). Each path is
    ``(label, points, outcome)`` with points ``(C, A, P)`` from P0 to the end and outcome ``success`` /
    ``failure`` / anything else (grey); a circle marks the start, a cross the end, and the dashed lines
    the origin (every need met)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13.0, 4.2))
    shown = list(paths)[:max_paths]
    for ax, (i, j, name) in zip(axes, ((0, 1, "C - A"), (0, 2, "C - P"), (1, 2, "A - P"))):
        for _, points, outcome in shown:
            colour = OUTCOME_COLOURS.get(outcome, OUTCOME_COLOURS["other"])
            xs, ys = [p[i] for p in points], [p[j] for p in points]
            ax.plot(xs, ys, color=colour, linewidth=1.0, alpha=0.7)
            ax.plot(xs[:1], ys[:1], "o", color=colour, markersize=3)
            ax.plot(xs[-1:], ys[-1:], "x", color=colour, markersize=5)
        ax.axhline(0, color="black", linewidth=0.6, linestyle="--")
        ax.axvline(0, color="black", linewidth=0.6, linestyle="--")
        ax.set_xlabel(name.split(" - ")[0], fontsize=8)
        ax.set_ylabel(name.split(" - ")[1], fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=c, label=k) for k, c in OUTCOME_COLOURS.items()]
    axes[2].legend(handles=handles, fontsize=7, loc="best")
    fig.suptitle(
        title + (f" (first {max_paths} of {len(paths)})" if len(paths) > max_paths else ""), fontsize=10
    )
    fig.tight_layout()
    return png_base64(fig)
