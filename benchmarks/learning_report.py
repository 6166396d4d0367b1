"""The learning benchmark in the report: the arms' curves side by side, seeds as bands.

``studies/bench_learning.py --algo rapo --runs DIR`` writes ``DIR/learning.json``; the report
finds it in any folder it is given and draws, per measure (the hidden-rule score first, then the
simulated emotion change and how often a rewrite beat its original), one line per arm (the mean over
seeds) inside a band from the lowest to the highest seed.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rapo_echo.benchmarks.plots import png_base64, pyplot

LEARNING_FILE = "learning.json"
# (key in an arm's result, panel title), drawn in this order when some arm has it.
PANELS = (
    ("score_per_step", "hidden-rule score (0..1)"),
    ("emotion_delta_per_step", "simulated emotion change"),
    ("rewrite_beat_original_per_step", "rewrites that beat their original"),
)
ARM_LABELS = {
    "rapo": "RAPO (ranks + self-distillation)",
    "ranks": "GRPO on ranks (sd off)",
    "emotion": "GRPO on emotion change",
}


def find_learning(dirs: Sequence[str | Path]) -> list[tuple[Path, dict[str, Any]]]:
    """``learning.json`` results in ``dirs`` (each folder or its direct subfolders)."""
    out = []
    for d in dirs:
        root = Path(d)
        if not root.is_dir():
            continue
        for p in [root, *sorted(c for c in root.iterdir() if c.is_dir())]:
            f = p / LEARNING_FILE
            if f.is_file():
                try:
                    out.append((p, json.loads(f.read_text(encoding="utf-8"))))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    continue
    return out


def bands(
    per_seed: dict[str, Sequence[float | None]],
) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps (1-based), the mean over seeds and the lowest / highest seed at each step (missing or
    non-finite values are left out of that step; steps with none are dropped)."""
    n = max((len(v) for v in per_seed.values()), default=0)
    steps, mean, lo, hi = [], [], [], []
    for i in range(n):
        vals = [
            float(v[i])
            for v in per_seed.values()
            if i < len(v) and isinstance(v[i], (int, float)) and math.isfinite(v[i])
        ]
        if vals:
            steps.append(i + 1)
            mean.append(sum(vals) / len(vals))
            lo.append(min(vals))
            hi.append(max(vals))
    return steps, mean, lo, hi


def learning_figure(result: dict[str, Any]) -> bytes:
    """The arms' curves as a PNG: one panel per measure, a line per arm, seeds as a min-max band."""
    arms = result.get("arms", {})
    panels = [(k, t) for k, t in PANELS if any(k in a for a in arms.values())]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.3), squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels):
        for arm, data in arms.items():
            if key not in data:
                continue
            steps, mean, lo, hi = bands(data[key])
            (line,) = ax.plot(steps, mean, label=ARM_LABELS.get(arm, arm), linewidth=1.6)
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.18, linewidth=0)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    seeds = ", ".join(str(s) for s in result.get("seeds", []))
    fig.suptitle(f"{result.get('bench', 'learning')}: mean over seeds {seeds}, band = min..max", fontsize=9)
    fig.tight_layout()
    return base64.b64decode(png_base64(fig))


def learning_html(found: Sequence[tuple[Path, dict[str, Any]]]) -> str:
    """The report section: per result its figure and a table of each arm's first and last steps."""
    parts = []
    for path, result in found:
        png = base64.b64encode(learning_figure(result)).decode("ascii")
        rows = []
        for arm, data in result.get("arms", {}).items():
            gains = ", ".join(f"{s}: {g:+.3f}" for s, g in data.get("gain_per_seed", {}).items())
            rows.append(
                f"<tr><td>{html.escape(ARM_LABELS.get(arm, arm))}</td>"
                f"<td>{data.get('first_window', float('nan')):.3f}</td>"
                f"<td>{data.get('last_window', float('nan')):.3f}</td>"
                f"<td>{data.get('gain', float('nan')):+.3f}</td><td>{html.escape(gains)}</td></tr>"
            )
        w = next(iter(result.get("arms", {}).values()), {}).get("window", 3)
        parts.append(
            f"<h3>{html.escape(path.name)}: hidden-rule score by arm</h3>"
            f'<img alt="learning curves" src="data:image/png;base64,{png}">'
            f"<table><thead><tr><th>arm</th><th>first {w} steps</th><th>last {w} steps</th>"
            f"<th>gain</th><th>gain per seed</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )
    return "<h2>Learning curves</h2>" + "".join(parts) if parts else ""
