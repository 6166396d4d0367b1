"""``rapo-echo compare RUN_A RUN_B``: two evaluations of one benchmark, figure by figure, on the cases
both ran: each run's mean, the difference (B - A), its 95% interval and p (:mod:`.paired`), then how far
each run's judge agreed with itself. Runs whose cards differ (:mod:`.card`) are refused, the difference
named, unless ``--show-incomparable`` (then marked)."""

from __future__ import annotations

import argparse
from typing import Annotated, Any

from pydantic import Field

from rapo_echo.benchmarks.card import card_differences
from rapo_echo.benchmarks.cli import add_command
from rapo_echo.benchmarks.eval_folder import EvalResult, read_eval
from rapo_echo.benchmarks.figures import figures_of
from rapo_echo.benchmarks.paired import PairedFigure, paired_figures
from rapo_echo.benchmarks.runner import get_benchmark
from rapo_echo.config import Flag, Strict, section_from_args
from rapo_echo.errors import ConfigError

HEADER = ["figure", "cases", "A", "B", "B - A", "95% interval", "p", "test"]
NOTE = (
    "B - A over the cases both runs have a value for (a case's value: its mean over its repeats); the "
    "interval is a paired percentile bootstrap over those cases, p the two-sided Wilcoxon signed-rank test "
    "of the per-case differences (for a 0/1 figure with one repeat a case: the Wald interval and the exact "
    "McNemar test). A large p says the difference is within what chance gives on this many cases."
)


def number(x: float | None, signed: bool = False) -> str:
    """A figure's cell: 3 decimals under 10, else 2; an en dash for none."""
    if x is None:
        return "–"
    digits = 3 if abs(x) < 10 else 2
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def figure_row(c: PairedFigure, labels: dict[str, str]) -> list[str]:
    """One row of the comparison table."""
    interval = (
        "–" if c.interval is None else f"[{number(c.interval[0], True)}, {number(c.interval[1], True)}]"
    )
    return [
        labels.get(c.figure, c.figure.replace("_", " ")),
        str(c.n),
        number(c.baseline),
        number(c.other),
        number(c.difference, True),
        interval,
        f"{c.p:.3f}",
        c.test,
    ]


def judge_line(a: EvalResult, b: EvalResult) -> str | None:
    """How far each run's judge agreed with itself on its rechecks, or None when neither rechecked."""
    parts = []
    for name, e in (("A", a), ("B", b)):
        figures = e.summary.get("figures") or {}
        f = figures.get("judge/self_agreement")
        if f is not None:
            interval = "" if f["lo"] is None else f" [{number(f['lo'])}, {number(f['hi'])}]"
            diff = (figures.get("judge/abs_diff") or {}).get("mean")
            n = int((figures.get("judge/rechecks") or {}).get("mean") or 0)
            parts.append(
                f"{name} {number(f['mean'])}{interval}, mean |difference| {number(diff)} ({n} rechecks)"
            )
    if not parts:
        return None
    return (
        "judge self-agreement (its last question asked again, fresh seed and prompt marker): "
        + "; ".join(parts)
        + ". A difference between the runs within the judge's own wobble is not one it can tell."
    )


def compare(a: EvalResult, b: EvalResult, *, show_incomparable: bool = False) -> str:
    """The comparison as text: a heading, a Markdown table of every figure and the notes. Raises
    :class:`ConfigError` for two benchmarks, or for cards that differ without ``show_incomparable``."""
    if a.benchmark != b.benchmark:
        raise ConfigError(f"compare: {a.path} is {a.benchmark}, {b.path} is {b.benchmark}: not comparable")
    differs = card_differences(a.card, b.card)
    if differs and not show_incomparable:
        raise ConfigError(
            "compare: the runs were measured differently (their benchmark cards differ): "
            f"{'; '.join(differs)}. Compare runs measured alike, or pass --show-incomparable to see them "
            "anyway (marked)"
        )
    from rapo_echo.benchmarks.report import markdown_table

    benchmark = get_benchmark(a.benchmark)
    labels = {key: label for key, label in a.summary.get("headline", [])}
    rows = [figure_row(c, labels) for c in paired_figures(figures_of(benchmark, []), a.records, b.records)]
    lines = [f"compare {a.benchmark}: A = {a.path} ({a.label}), B = {b.path} ({b.label})"]
    if differs:
        lines.append(
            "NOT COMPARABLE, shown as asked (--show-incomparable): the cards differ: " + "; ".join(differs)
        )
    if not rows:
        lines.append("no figure has a value in both runs on a shared case")
        return "\n".join(lines) + "\n"
    lines += ["", markdown_table(HEADER, rows).rstrip("\n"), "", NOTE]
    judge = judge_line(a, b)
    if judge:
        lines.append(judge)
    return "\n".join(lines) + "\n"


class CompareCommand(Strict):
    """`rapo-echo compare`: two evaluations of one benchmark, figure by figure."""

    runs: Annotated[list[str], Flag(positional=True)] = Field(
        min_length=2, max_length=2, description="Eval output folders: A (the baseline), then B."
    )
    show_incomparable: bool = Field(
        False,
        description="Compare runs whose benchmark cards differ (another simulator, judge, sampling, prompt "
        "or data) anyway, marked as not comparable.",
    )


def register(subparsers: Any) -> None:
    """Add the ``compare`` sub-command."""
    help = "compare two evaluations of one benchmark figure by figure (difference, interval, p)"
    add_command(subparsers, "compare", help, CompareCommand, run_compare_command, doc=__doc__)


def run_compare_command(args: argparse.Namespace) -> int:
    cmd = section_from_args(CompareCommand, args)
    a, b = (read_eval(p) for p in cmd.runs)
    print(compare(a, b, show_incomparable=cmd.show_incomparable), end="")
    return 0
