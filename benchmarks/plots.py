"""Report figures as base64 PNG strings (matplotlib, Agg backend): training curves, metric bars; the
benchmarks' own figures (EPM trajectories, SOTOPIA dimensions) live in their report modules."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import Any

from rapo_echo.errors import RapoEchoError
from rapo_echo.monitor import PREFIX as MONITOR_PREFIX
from rapo_echo.monitor import flagged_steps

# Plotted first, in this order, when a run logged them; the rest follow sorted, up to MAX_CURVES. What a
# run is for leads: for RAPO the hidden-rule score (where the simulated user has one), the simulated
# emotion change and how the rewrites rank against their originals; then the reward.
FIRST_CURVES = (
    "sim/hidden_rule_score",
    "sim/emotion_delta",
    "sd/rank_vs_original",
    "sd/beat_original",
    "reward/mean",
    "heldout/agreement",  # the held-out judge against the training reward (monitor.heldout)
    "heldout/train_score",
    "heldout/score",
    "loss/total",
    "loss/grpo",
    "loss/sd",
    "kl",
    "entropy",
    "reply_len/mean",
    "reply/distinct_2",
    "sd/pg_ratio",
    "critique/len",
    "clip_frac",
    "grad_norm",
    "invalid",
    "judge/invalid_groups",
    "judge/position_bias/first_share",
    "tokens_per_s",
    "time/step",
)
# Bookkeeping that is not worth a plot.
NOT_PLOTTED = frozenset({"lr", "world", "updates", "items", "nonfinite_skipped", "adv/mean"})
# Left out when they never change: RAPO's linear rank rewards make ``reward/mean`` exactly 0.5 every step.
HIDDEN_WHEN_FLAT = ("reward/mean",)
MAX_CURVES = 18
# A curve with at most this many points is drawn with a marker on each (a one-step run is one point).
MARKERS_UP_TO = 30


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (a clear error when matplotlib is missing)."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RapoEchoError("the report's plots need matplotlib: pip install 'rapo-echo[bench]'") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def png_base64(fig: Any) -> str:
    """The figure as a base64 PNG string; the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def flat_keys(rows: Sequence[dict[str, Any]], keys: Sequence[str] = HIDDEN_WHEN_FLAT) -> set[str]:
    """Those of ``keys`` with at least two finite values in ``rows``, all equal (a flat line says nothing)."""
    out = set()
    for k in keys:
        vals = [r[k] for r in rows if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])]
        if len(vals) > 1 and max(vals) - min(vals) < 1e-9:
            out.add(k)
    return out


def curve_keys(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Numeric keys of metrics rows to plot: :data:`FIRST_CURVES` first, then the rest sorted (``step`` is
    the x axis, not a curve; a ``reward/mean`` that never changes is left out)."""
    numeric = {
        k
        for row in rows
        for k, v in row.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    numeric -= NOT_PLOTTED | flat_keys(rows)
    numeric = {k for k in numeric if not k.startswith(MONITOR_PREFIX)}  # flags: drawn as marks instead
    return [k for k in FIRST_CURVES if k in numeric] + sorted(numeric - set(FIRST_CURVES))


def training_figure(runs: dict[str, list[dict[str, Any]]]) -> tuple[Any, list[str]]:
    """One subplot per metric key, one line per run (a marker on each point of a short curve, so a run of
    one or a few steps shows), a legend on every subplot when several runs share it; steps the
    reward-hacking monitor flagged are marked by red vertical lines on every subplot. Returns (the
    matplotlib figure, or None when there is nothing to plot, and the keys left out)."""
    all_rows = [row for rows in runs.values() for row in rows]
    keys = curve_keys(all_rows)
    if not keys:
        return None, []
    shown, left_out = keys[:MAX_CURVES], keys[MAX_CURVES:]
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    cols = min(3, len(shown))
    nrows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.8 * nrows), squeeze=False)
    flagged = sorted({step for rows in runs.values() for step in flagged_steps(rows)})
    for ax, key in zip(axes.flat, shown):
        for step in flagged:
            ax.axvline(step, color="red", alpha=0.25, linewidth=2)
        for label, rows in runs.items():
            pts = [
                (row.get("step", i), row[key])
                for i, row in enumerate(rows)
                if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])
            ]
            if pts:
                marker = "o" if len(pts) <= MARKERS_UP_TO else None
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, linewidth=1.2, marker=marker,
                        markersize=3.5)  # fmt: skip
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.grid(alpha=0.3)
        if len(runs) > 1 and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(shown) :]:
        ax.axis("off")
    fig.tight_layout()
    return fig, left_out


def training_curves(runs: dict[str, list[dict[str, Any]]]) -> tuple[str | None, list[str]]:
    """:func:`training_figure` as a base64 PNG (None when there is nothing to plot), and the keys left out."""
    fig, left_out = training_figure(runs)
    return (None if fig is None else png_base64(fig)), left_out


RATE = "rate (0-1)"


# A long run's curves (studies/long_run.py), one figure per metric with every run on it, when a run is
# longer than LONG_RUN_STEPS: what the task measures, then what shows a run going bad.
LONG_RUN_CURVES = (
    "sim/hidden_rule_score",
    "emotion/final",
    "entropy",
    "kl",
    "reply_len/mean",
    "reply/distinct_2",
    "sd/pg_ratio",
)
LONG_RUN_STEPS = 50


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """The trailing mean of the last ``window`` values at each point (fewer at the start)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def metric_figures(
    runs: dict[str, list[dict[str, Any]]],
    keys: Sequence[str] = LONG_RUN_CURVES,
    smooth: int | None = None,
    alarms: dict[str, dict[str, int]] | None = None,
) -> list[tuple[str, str]]:
    """One figure per key any run logged, every run on it: the raw values faint, their moving average
    over ``smooth`` steps (default: a 30th of the longest run) solid, and an ``x`` on a run's line at each
    step the reward-hacking monitor first flagged something in it (or, with ``alarms``, at the steps given
    per run: signature -> first step, e.g. from :func:`rapo_echo.monitor.replay`). Returns (key, base64
    PNG) pairs."""
    longest = max((len(rows) for rows in runs.values()), default=0)
    window = smooth or max(1, longest // 30)
    plt = pyplot()
    out = []
    for key in keys:
        series = {
            label: [
                (row["step"], float(row[key]))
                for row in rows
                if isinstance(row.get("step"), int)
                and isinstance(row.get(key), (int, float))
                and math.isfinite(row[key])
            ]
            for label, rows in runs.items()
        }
        series = {k: v for k, v in series.items() if v}
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(7.5, 3.4))
        for label, pts in series.items():
            xs, ys = [p[0] for p in pts], moving_average([p[1] for p in pts], window)
            (line,) = ax.plot(xs, ys, label=label, linewidth=1.4)
            ax.plot(xs, [p[1] for p in pts], color=line.get_color(), alpha=0.2, linewidth=0.8)
            first: dict[str, int] = {}
            for step, names in sorted(flagged_steps(runs[label]).items()):
                for name in names:
                    first.setdefault(name, step)
            if alarms is not None:
                first = alarms.get(label, {})
            at = dict(zip(xs, ys))
            marks = sorted({s for s in first.values() if s in at})
            ax.plot(marks, [at[s] for s in marks], "x", color=line.get_color(), markersize=7)
        ax.set_title(
            f"{key} (moving average over {window} steps; x: a monitor alarm's first step)", fontsize=9
        )
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        out.append((key, png_base64(fig)))
    return out


def metric_unit(key: str) -> str:
    """The unit of a benchmark's summary metric, from its key (one chart holds one unit)."""
    k = key.lower()
    if "turn" in k:
        return "turns"
    if k.endswith("rate") or k.endswith("/rate"):
        return RATE
    if k in ("successes", "failures") or k.endswith("_count"):
        return "dialogues"
    if k.startswith(("bleu", "rouge", "distinct")):
        return "percent"
    return "score"


def bars_figure(
    title: str,
    groups: Sequence[str],
    series: dict[str, Sequence[float | None]],
    *,
    ylabel: str = "",
    intervals: dict[str, Sequence[tuple[float, float] | None]] | None = None,
) -> Any:
    """Bars for each group (x axis), one colour per series (e.g. per policy), each with its value written
    on it; None values are left out. A rate's axis is 0-1, and bars that are all 0 get a 0-1 axis too, so
    a zero reads as zero, not as an empty panel on a -0.04..0.04 axis. ``intervals`` (per series, per
    group ``(lo, hi)`` or None) draws each bar's interval as a black line with caps."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(groups) * max(1, len(series)) ** 0.5), 3.2))
    width = 0.8 / max(1, len(series))
    shown: list[float] = []
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        bounds = list((intervals or {}).get(name) or [None] * len(groups))
        pts = [(x, v, b) for x, v, b in zip(xs, values, bounds) if v is not None]
        bars = ax.bar([p[0] for p in pts], [p[1] for p in pts], width=width, label=name)
        ax.bar_label(bars, fmt="%.3g", fontsize=6)
        shown += [p[1] for p in pts]
        lines = [(x, v, b) for x, v, b in pts if b is not None]
        if lines:
            low = [max(0.0, v - b[0]) for _, v, b in lines]
            high = [max(0.0, b[1] - v) for _, v, b in lines]
            ax.errorbar([p[0] for p in lines], [p[1] for p in lines], yerr=[low, high], fmt="none",
                        ecolor="black", elinewidth=1.0, capsize=3)  # fmt: skip
    if ylabel == RATE or (shown and all(v == 0 for v in shown)):
        ax.set_ylim(min(0.0, *shown), max(1.0, *shown))
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=8)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_title(title, fontsize=10)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    fig.tight_layout()
    return fig
