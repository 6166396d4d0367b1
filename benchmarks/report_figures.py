"""The report's view of how far a figure can be trusted: figures with their intervals and spread, the
benchmark card check before runs are put side by side, the paired comparison of every figure, and the
judges' self-agreement. The tables are ``(header, rows)`` of strings, as the rest of the report's."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from rapo_echo.benchmarks.card import card_differences
from rapo_echo.benchmarks.eval_folder import EvalResult
from rapo_echo.benchmarks.figures import figures_of
from rapo_echo.benchmarks.paired import paired_figures
from rapo_echo.benchmarks.runner import BENCHMARKS, get_benchmark
from rapo_echo.errors import DataError

MARK = " [card differs]"
Table = tuple[list[str], list[list[str]]]  # (header, rows)
NO_POSITION_BIAS = "n/a (scores one at a time)"  # these judges score one dialogue, never compare
FIGURES_NOTE = (
    "Each figure is the mean over repeats (eval --repeats N) of its value in each repeat; [lo, hi] is a 95% "
    "percentile bootstrap interval over cases (all repeats of a case resampled together); sd, min and max "
    "are its spread across repeats. An interval says how much the figure would move with other cases of "
    "the same kind, the spread how much it moves when the same cases are run again."
)
PAIRED_NOTE = (
    "Each policy against the baseline, case by case on the cases both have a value for (a case's value: "
    "its mean over its repeats). The difference is policy - baseline with a 95% interval: a paired "
    "percentile bootstrap over those cases, p the two-sided Wilcoxon signed-rank test; for a 0/1 figure "
    "with one repeat a case, the Wald interval for paired proportions and the exact McNemar test on the "
    "cases only one of them won. A large p says the difference is within what chance gives on this many "
    "cases."
)
JUDGE_NOTE = (
    "Each judged case asked its judge its last question once more, with a fresh seed and prompt marker "
    "(SAGE: the simulated user's reading of the last reply). Self-agreement: the share answered alike; mean "
    "|difference| on the judge's own scale (ESConv: critic reward -1..1, SOTOPIA: dimension points, EPM: "
    "MDEP levels, SAGE: emotion points). A difference between runs smaller than the judge's own wobble is "
    "not one it can tell. Position bias applies to judges that compare or rank candidates; these judges "
    "score one dialogue at a time (the training judges' position bias is in the training tables)."
)


def fmt(value: Any) -> str:
    """A table cell: numbers with 3 significant decimals, missing as an en dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"  # a score is never shown as nan or inf (the readers count such cases invalid)
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.2f}"
    return str(value)


def figure_cell(summary: dict[str, Any], key: str) -> str:
    """A headline cell: the figure's mean and, where it has one, its interval ``[lo, hi]``."""
    figure = (summary.get("figures") or {}).get(key)
    value = summary.get("metrics", {}).get(key)
    if figure is None or figure.get("lo") is None:
        return fmt(value)
    return f"{fmt(figure['mean'])} [{fmt(figure['lo'])}, {fmt(figure['hi'])}]"


def figures_table(summary: dict[str, Any]) -> Table | None:
    """One evaluation's figures: mean, interval, spread across repeats and cases (None without)."""
    figures = summary.get("figures") or {}
    if not figures:
        return None
    header = ["figure", "mean", "95% interval", "sd across repeats", "min – max", "repeats", "cases"]
    rows = []
    for key, f in figures.items():
        interval = "–" if f["lo"] is None else f"[{fmt(f['lo'])}, {fmt(f['hi'])}]"
        spread = "–" if f["min"] is None else f"{fmt(f['min'])} – {fmt(f['max'])}"
        rows.append(
            [key, fmt(f["mean"]), interval, fmt(f["sd"]), spread, str(len(f["repeats"])), str(f["cases"])]
        )
    return header, rows


def _is_baseline(e: EvalResult, baseline: str) -> bool:
    from pathlib import Path

    return baseline in (e.label, e.path.name, str(e.path)) or e.path.resolve() == Path(baseline).resolve()


def _check_baseline(evals: Sequence[EvalResult], baseline: str | None) -> None:
    if baseline is not None and not any(_is_baseline(e, baseline) for e in evals):
        raise DataError(f"--baseline {baseline}: no evaluation folder or policy of that name in the inputs")


def reference_of(group: Sequence[EvalResult], baseline: str | None) -> EvalResult | None:
    """The evaluation a benchmark's others are compared with: the named baseline, else the first."""
    if baseline is None:
        return group[0] if group else None
    return next((e for e in group if _is_baseline(e, baseline)), None)


def check_cards(
    evals: Sequence[EvalResult], baseline: str | None = None, show_incomparable: bool = False
) -> tuple[list[EvalResult], list[EvalResult], list[str]]:
    """``(side by side, apart, notes)``: per benchmark, each evaluation's card against the reference's
    (:func:`reference_of`); one measured differently is kept apart (its own section, no comparison) and
    named with what differs, or with ``show_incomparable`` put side by side, marked (label suffix, and
    ``card_differs``)."""
    _check_baseline(evals, baseline)
    kept: list[EvalResult] = []
    apart: list[EvalResult] = []
    notes: list[str] = []
    for bench in dict.fromkeys(e.benchmark for e in evals):
        group = [e for e in evals if e.benchmark == bench]
        ref = reference_of(group, baseline) or group[0]
        for e in group:
            differs = [] if e is ref else card_differences(ref.card, e.card)
            if not differs:
                kept.append(e)
                continue
            what = f"{bench}: {e.label} ({e.path}) was measured differently from {ref.label}: "
            what += "; ".join(differs)
            if show_incomparable:
                e.card_differs = differs
                if not e.label.endswith(MARK):
                    e.label += MARK
                kept.append(e)
                notes.append(what + " -- shown as asked (--show-incomparable), marked" + MARK)
            else:
                apart.append(e)
                notes.append(what + " -- left out of the comparison (--show-incomparable shows it, marked)")
    return kept, apart, notes


def paired_table(evals: Sequence[EvalResult], baseline: str | None = None) -> Table | None:
    """Every other evaluation of a benchmark against its baseline (:func:`reference_of`), figure by figure
    (:func:`rapo_echo.benchmarks.paired.paired_figures`); None when nothing is paired."""
    _check_baseline(evals, baseline)
    header = ["benchmark", "policy", "baseline", "figure", "cases", "baseline value", "policy value"]
    header += ["difference [95% CI]", "p", "test"]
    rows = []
    for bench in dict.fromkeys(e.benchmark for e in evals):
        group = [e for e in evals if e.benchmark == bench]
        base = reference_of(group, baseline)
        if base is None or bench not in BENCHMARKS:
            continue
        figures = figures_of(get_benchmark(bench), [])
        labels = {key: label for key, label in base.summary.get("headline", [])}
        for e in group:
            if e is base:
                continue
            for c in paired_figures(figures, base.records, e.records):
                lo, hi = c.interval if c.interval is not None else (None, None)
                interval = "" if lo is None else f" [{lo:+.3f}, {hi:+.3f}]"
                test = c.test
                if c.discordant is not None:
                    test += f": {c.discordant[0]} only policy, {c.discordant[1]} only baseline"
                rows.append(
                    [bench, e.label, base.label, labels.get(c.figure, c.figure.replace("_", " ")), str(c.n)]
                    + [fmt(c.baseline), fmt(c.other), f"{c.difference:+.3f}{interval}", f"{c.p:.3f}", test]
                )
    return (header, rows) if rows else None


def judge_table(evals: Sequence[EvalResult]) -> Table | None:
    """The judges' self-agreement per evaluation that rechecked (None when none did)."""
    header = ["benchmark", "policy", "self-agreement [95% CI]", "mean |difference|", "rechecks"]
    header += ["position bias"]
    rows = []
    for e in evals:
        figures = e.summary.get("figures") or {}
        agree = figures.get("judge/self_agreement")
        if agree is None:
            continue
        interval = "" if agree["lo"] is None else f" [{fmt(agree['lo'])}, {fmt(agree['hi'])}]"
        diff = (figures.get("judge/abs_diff") or {}).get("mean")
        n = (figures.get("judge/rechecks") or {}).get("mean")
        rechecks = str(int(n)) if isinstance(n, (int, float)) and float(n).is_integer() else fmt(n)
        rows.append(
            [e.benchmark, e.label, fmt(agree["mean"]) + interval, fmt(diff), rechecks, NO_POSITION_BIAS]
        )
    return (header, rows) if rows else None


def card_html(e: EvalResult) -> str:
    """An evaluation's benchmark card as a ``<details>`` block of its main fields (HTML-escaped)."""
    card = e.card
    if not card:
        return ""
    inst = card.get("instrument", {})
    lines = []
    for role in ("simulator", "judge"):
        if role in inst:
            ident = {k: v for k, v in inst[role].items() if v is not None}
            lines.append(f"{role}: {ident}")
    for key in ("sampling", "episode", "prompts", "data"):
        if key in inst:
            lines.append(f"{key}: {inst[key]}")
    lines.append(f"policy: {card.get('under_test', {})}")
    lines.append(f"seeds: {card.get('seeds')}")
    lines.append(f"code: {card.get('code')}")
    if card.get("partial"):
        lines.insert(0, "partial card (a folder written before cards): only its config.json is known")
    body = "".join(f'<div class="meta">{html.escape(line)}</div>' for line in lines)
    marked = (
        f'<div class="meta">card differs: {html.escape("; ".join(e.card_differs))}</div>'
        if e.card_differs
        else ""
    )
    return f"<details><summary>benchmark card</summary>{marked}{body}</details>"
