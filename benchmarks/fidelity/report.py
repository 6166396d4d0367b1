"""The fidelity part of ``rapo-echo report``: per evaluation a table (one row per predictor: agreement
figures with their bootstrap intervals) and a figure of each predictor's predictions per real rating
1-5, against the band the random baseline spans."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from rapo_echo.benchmarks.fidelity.bench import RATINGS
from rapo_echo.benchmarks.fidelity.stats import ascending_ranks
from rapo_echo.benchmarks.plots import png_base64, pyplot

COLUMNS: tuple[tuple[str, str], ...] = (
    ("spearman", "Spearman"),
    ("kendall", "Kendall tau-b"),
    ("pairwise", "pairwise agreement"),
    ("survey_spearman", "survey change (Spearman)"),
    ("loglik_gain", "log-lik gain / token"),
)
NOTE = (
    "Agreement of each predictor with the seekers' own 1-5 ratings; [95% bootstrap interval over "
    "conversations]. Pairwise agreement: pairs of points in one conversation with different ratings "
    "ordered the same way (a tie counts 0.5; 0.5 = chance). Survey change: the predicted trajectory "
    "against initial minus final emotion intensity, per conversation. Log-lik gain: per-token "
    "log-likelihood of the real next seeker message with the simulator's role prompt minus without it. "
    "points: scored / missing predictions."
)


def _cell(m: dict[str, Any], key: str) -> str:
    value = m.get(key)
    if value is None:
        return "–"
    lo, hi = m.get(f"{key}_lo"), m.get(f"{key}_hi")
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
    return f"{value:.3f}{ci}"


def predictor_names(metrics: dict[str, Any]) -> list[str]:
    """Predictors of a summary, in the order they ran (users, rewards, then baselines)."""
    return list(dict.fromkeys(k.split("/")[0] for k in metrics if "/" in k and k.endswith("/kind")))


def fidelity_table(evals: Sequence[Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per (evaluation, predictor)."""
    header = ["evaluation", "predictor", "points", *(label for _, label in COLUMNS)]
    rows = []
    for e in evals:
        m = e.summary["metrics"]
        for name in predictor_names(m):
            sub = {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith(f"{name}/")}
            row = [e.label, name, f"{sub.get('points', 0)} / {sub.get('missing', 0)}"]
            rows.append(row + [_cell(sub, key) for key, _ in COLUMNS])
    return header, rows


def _percentile_ranks(values: Sequence[float]) -> list[float]:
    n = len(values)
    return [(r - 0.5) / n for r in ascending_ranks(values)] if n else []


def by_rating(records: Sequence[dict[str, Any]], name: str) -> dict[int, list[float]]:
    """The predictor's predictions as percentile ranks (0-1, within the predictor), grouped by rating."""
    points = [
        (int(r["metrics"]["rating"]), r["metrics"].get(name))
        for r in records
        if not r.get("info", {}).get("skip") and r["metrics"].get(name) is not None
    ]
    ranks = _percentile_ranks([float(v) for _, v in points])
    out: dict[int, list[float]] = {k: [] for k in RATINGS}
    for (rating, _), q in zip(points, ranks):
        out.setdefault(rating, []).append(q)
    return out


def random_band(n: int) -> tuple[float, float]:
    """Where the mean percentile rank of ``n`` points falls 95% of the time for a predictor without
    signal (the random baseline): 0.5 +- 1.96 sqrt(1/12 / n) (ranks uniform on 0-1); NaN for no point."""
    if n < 1:
        return math.nan, math.nan
    half = 1.96 * math.sqrt(1 / 12 / n)
    return max(0.0, 0.5 - half), min(1.0, 0.5 + half)


def distribution_plot(title: str, records: Sequence[dict[str, Any]], names: Sequence[str]) -> str | None:
    """Small multiples, one per predictor but the random one: boxes of the percentile rank of its
    predictions per real rating, its mean per rating (line), and the random baseline's band
    (:func:`random_band`). A predictor with signal climbs out of the band from rating 1 to 5."""
    shown = [n for n in names if n != "random"]
    if not shown:
        return None
    plt = pyplot()
    cols = min(3, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False, sharey=True)
    for ax, name in zip(axes.flat, shown):
        groups = by_rating(records, name)
        data = [groups.get(k, []) for k in RATINGS]
        low, high = zip(*(random_band(len(d)) for d in data))
        ax.fill_between(list(RATINGS), low, high, color="0.85", label="random baseline (95%)")
        ax.boxplot(data, positions=list(RATINGS), widths=0.5, showfliers=False)
        means = [sum(d) / len(d) if d else math.nan for d in data]
        ax.plot(list(RATINGS), means, "o-", color="tab:blue", label="mean")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("real rating (seeker)")
        ax.set_ylim(0, 1)
        ax.set_xticks(list(RATINGS))
    for ax in axes.flat[len(shown) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("prediction (percentile rank)")
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return png_base64(fig)


def fidelity_section(evals: Sequence[Any], table: Any, img: Any) -> list[str]:
    """HTML parts for the fidelity evaluations among ``evals`` (none: empty). ``table(header, rows)``
    and ``img(png, alt)`` are the report's own HTML helpers."""
    mine = [e for e in evals if e.benchmark == "fidelity" and e.summary["metrics"]]
    if not mine:
        return []
    parts = ["<h2>Fidelity to real seekers</h2>" + table(*fidelity_table(mine))]
    parts.append(f'<p class="note">{html.escape(NOTE)}</p>')
    for e in mine:
        png = distribution_plot(
            f"Predictions per real rating: {e.label}", e.records, predictor_names(e.summary["metrics"])
        )
        if png:
            parts.append(img(png, f"fidelity predictions per rating of {e.label}"))
    return parts


def run_checks_table(runs: Sequence[Any]) -> tuple[list[str], list[list[str]]] | None:
    """For training runs that recorded a fidelity check (``fidelity.json``): one row per predictor, so
    the report shows how far the run's simulator and judge agree with real seekers next to its rewards;
    None when no run has one."""
    import json
    from types import SimpleNamespace

    from rapo_echo.benchmarks.fidelity.check import RUN_FILE

    checked = []
    for run in runs:
        path = run.path / RUN_FILE
        if path.is_file():
            record = json.loads(path.read_text(encoding="utf-8"))
            checked.append(SimpleNamespace(label=run.path.name, summary=record["summary"]))
    if not checked:
        return None
    header, rows = fidelity_table(checked)
    return ["run", *header[1:]], rows
