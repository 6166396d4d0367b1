"""``rapo-echo report``: eval and training-run folders -> one self-contained HTML page + a Markdown table.

Inputs: eval output folders (``config.json`` + ``results.jsonl``), training run folders
(``metrics.jsonl``), or folders holding either one level down. The page has the comparison (one table
per benchmark: policies x its headline metrics), training curves, per-benchmark bars (one unit per
chart; SOTOPIA: per dimension), and the transcripts as ``<details>`` blocks. Images are inline PNGs,
CSS is inline, there is no script, and every model-written text is HTML-escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rapo_echo.benchmarks.epm.report import epm_section, epmq_table
from rapo_echo.benchmarks.eval_folder import EvalResult, is_eval, read_eval
from rapo_echo.benchmarks.fidelity.report import NOTE as FIDELITY_NOTE
from rapo_echo.benchmarks.fidelity.report import fidelity_section, fidelity_table, run_checks_table
from rapo_echo.benchmarks.learning_report import find_learning, learning_html
from rapo_echo.benchmarks.plots import (
    LONG_RUN_STEPS,
    bars_figure,
    metric_figures,
    metric_unit,
    png_base64,
    training_curves,
)
from rapo_echo.benchmarks.report_figures import (
    FIGURES_NOTE,
    JUDGE_NOTE,
    PAIRED_NOTE,
    Table,
    card_html,
    check_cards,
    figure_cell,
    figures_table,
    fmt,
    judge_table,
    paired_table,
)
from rapo_echo.benchmarks.results import CONFIG_FILE, RESULTS_FILE, write_text_atomic
from rapo_echo.benchmarks.runner import BENCHMARKS
from rapo_echo.benchmarks.sotopia.report import dimensions_figure
from rapo_echo.benchmarks.training_report import (
    JUDGE_BIAS_NOTE,
    judge_bias_table,
    read_samples,
    samples_html,
    summary_table,
    validation_table,
)
from rapo_echo.errors import DataError
from rapo_echo.jsonl import read_jsonl

METRICS_FILE = "metrics.jsonl"
FIDELITY_CHECKS = "Fidelity of the simulator and judge (real seekers)"


@dataclass
class TrainingRun:
    path: Path
    rows: list[dict[str, Any]]


def discover(dirs: Sequence[str | Path]) -> tuple[list[EvalResult], list[TrainingRun]]:
    """The eval folders and training runs in ``dirs`` (each, or its direct subfolders)."""
    evals: list[EvalResult] = []
    runs: list[TrainingRun] = []
    for d in dirs:
        root = Path(d)
        if not root.is_dir():
            raise DataError(f"{root}: not a folder")
        found = False
        candidates = [root] if is_eval(root) else [root, *sorted(c for c in root.iterdir() if c.is_dir())]
        for p in candidates:
            if is_eval(p):
                evals.append(read_eval(p))
                found = True
            if (p / METRICS_FILE).is_file():
                runs.append(TrainingRun(p, read_metrics(p / METRICS_FILE)))
                found = True
        if not found:
            raise DataError(
                f"{root}: holds no eval results ({CONFIG_FILE} + {RESULTS_FILE}) or {METRICS_FILE}, "
                "nor do its subfolders"
            )
    _label(evals)
    return evals, runs


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a training run's ``metrics.jsonl`` (a truncated last line is skipped)."""
    return [row for _, row in read_jsonl(path, "metrics file") if isinstance(row, dict)]


def _label(evals: list[EvalResult]) -> None:
    """Row label = the policy spec; the folder name is added where one policy has two evals of a benchmark."""
    seen: dict[tuple[str, str], int] = {}
    for e in evals:
        seen[(e.label, e.benchmark)] = seen.get((e.label, e.benchmark), 0) + 1
    for e in evals:
        if seen[(e.label, e.benchmark)] > 1:
            e.label = f"{e.label} [{e.path.name}]"


def benchmarks_of(evals: Sequence[EvalResult]) -> list[str]:
    """The benchmarks present, in the registry's order."""
    order = list(BENCHMARKS)
    return sorted(
        {e.benchmark for e in evals}, key=lambda b: (order.index(b) if b in order else len(order), b)
    )


def comparison_tables(evals: Sequence[EvalResult]) -> list[tuple[str, list[str], list[list[str]]]]:
    """``(benchmark, header, rows)`` per benchmark present: the policies it evaluated, its headline metrics
    and valid/total cases. One table each, so each fits the page."""
    return [(b, *comparison_table([e for e in evals if e.benchmark == b])) for b in benchmarks_of(evals)]


def comparison_table(evals: Sequence[EvalResult]) -> Table:
    """Header and rows: one row per policy; per benchmark present (registry order) its headline metrics and
    valid/total cases."""
    benchmarks = benchmarks_of(evals)
    header = ["policy"]
    columns: list[tuple[str, str | None]] = []
    for b in benchmarks:
        headline = next(e.summary["headline"] for e in evals if e.benchmark == b)
        for key, label in headline:
            header.append(label)
            columns.append((b, key))
        header.append(f"{b} valid/n")
        columns.append((b, None))
    rows = []
    for label in dict.fromkeys(e.label for e in evals):
        by_bench = {e.benchmark: e for e in evals if e.label == label}
        row = [label]
        for b, key in columns:
            e = by_bench.get(b)
            if e is None:
                row.append("–")
            elif key is None:
                row.append(f"{e.summary['n_valid']}/{e.summary['n_cases']}")
            else:
                row.append(figure_cell(e.summary, key))
        rows.append(row)
    return header, rows


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table (pipes in cells escaped)."""

    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table in a box that scrolls sideways when the table is wider than the page (never cut)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _markdown_comparison(evals: Sequence[EvalResult]) -> str:
    """The comparison as one Markdown table per benchmark, each under its name."""
    return "\n".join(f"**{b}**\n\n" + markdown_table(h, rows) for b, h, rows in comparison_tables(evals))


def _img(png: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{png}">'


def _interval(summary: dict[str, Any], key: str) -> tuple[float, float] | None:
    figure = (summary.get("figures") or {}).get(key) or {}
    return None if figure.get("lo") is None else (figure["lo"], figure["hi"])


def _any(errors: dict[str, list[Any]]) -> bool:
    return any(x is not None for values in errors.values() for x in values)


def _figures(evals: Sequence[EvalResult]) -> list[str]:
    sotopia = dimensions_figure(evals, _img)
    out = [sotopia] if sotopia else []
    for bench in dict.fromkeys(e.benchmark for e in evals):
        if bench in ("sotopia", "fidelity"):  # their own figures (fidelity: see fidelity_section)
            continue
        group = [e for e in evals if e.benchmark == bench and e.summary["metrics"]]
        if not group:
            continue
        by_unit: dict[str, list[tuple[str, str]]] = {}
        for key, label in group[0].summary["headline"]:
            by_unit.setdefault(metric_unit(key), []).append((key, label))
        for unit, headline in by_unit.items():  # one unit per chart: rates never share an axis with turns
            labels = [label for _, label in headline]
            series = {e.label: [e.summary["metrics"].get(k) for k, _ in headline] for e in group}
            errors = {e.label: [_interval(e.summary, k) for k, _ in headline] for e in group}
            title = f"{bench}: {unit}" + (" (bars: mean; lines: 95% interval)" if _any(errors) else "")
            png = png_base64(bars_figure(title, labels, series, ylabel=unit, intervals=errors))
            out.append(_img(png, f"{bench} {unit}"))
    return out


def _transcript_html(record: dict[str, Any]) -> str:
    metrics = ", ".join(f"{k}={fmt(v)}" for k, v in record.get("metrics", {}).items())
    status = "valid" if record.get("valid") else "INVALID (judge unparseable)"
    turns = "".join(
        f'<div class="turn"><span class="role">{html.escape(str(t.get("role", "")))}</span> '
        f"{html.escape(str(t.get('content', '')))}</div>"
        for t in record.get("transcript", [])
    )
    info = record.get("info", {})
    extra = ""
    if "reference" in info:
        ref = html.escape(str(info["reference"]))
        extra += f'<div class="turn ref"><span class="role">reference</span> {ref}</div>'
    if info.get("critic"):
        verdicts = "; ".join(
            f"turn {c['turn']}: {fmt(c['reward'])} ({html.escape(str(c.get('label')))})"
            for c in info["critic"]
        )
        extra += f'<div class="meta">critic: {verdicts}</div>'
    if info.get("evaluator_raw"):
        extra += f'<div class="meta">evaluator: {html.escape(str(info["evaluator_raw"]))}</div>'
    if info.get("end"):
        extra += f'<div class="meta">ended: {html.escape(str(info["end"]))}</div>'
    summary = f"{html.escape(record['id'])} — {status}" + (f" — {html.escape(metrics)}" if metrics else "")
    return f"<details><summary>{summary}</summary>{turns}{extra}</details>"


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;
 max-width:1200px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
h3{font-size:15px}table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}
img{max-width:100%;margin:8px 0;border:1px solid #eee}.wide{max-width:100%;overflow-x:auto}
details{margin:4px 0;padding:4px 8px;background:#fafafa;border:1px solid #e5e5e5;border-radius:4px;
 font-size:13px}
summary{cursor:pointer}.turn{margin:4px 0 4px 8px;white-space:pre-wrap}
.role{font-weight:600;color:#2a5599}.ref .role{color:#8a4b00}
.meta{color:#666;margin:4px 0 0 8px;white-space:pre-wrap}.note{color:#666;font-size:13px}
.warn{color:#8a4b00}
"""


def _table_section(heading: str, table: Table | None, note: str = "", tag: str = "h2") -> list[str]:
    """A heading over a table and its note; nothing without a table."""
    if table is None:
        return []
    return [f"<{tag}>{heading}</{tag}>" + _html_table(*table)] + ([_note(note)] if note else [])


def _md_section(title: str, table: Table | None, note: str = "") -> str:
    return (
        "" if table is None else f"\n{title}\n\n" + markdown_table(*table) + (f"\n{note}\n" if note else "")
    )


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _comparison_html(
    evals: Sequence[EvalResult], baseline: str | None, card_notes: Sequence[str]
) -> list[str]:
    parts = ["<h2>Comparison</h2>"]
    for bench, header, rows in comparison_tables(evals):
        parts.append(f"<h3>{html.escape(bench)}</h3>" + _html_table(header, rows))
    parts.append(
        '<p class="note">ESConv SR = success rate, AT = average turns (PPDPP protocol); BLEU, ROUGE-L '
        "and Distinct in percent; SOTOPIA dimensions on their own ranges, overall = mean of seven. "
        f"{html.escape(FIGURES_NOTE)}</p>"
    )
    parts.extend(f'<p class="note warn">{html.escape(n)}</p>' for n in card_notes)
    parts += _table_section("Paired comparison", paired_table(evals, baseline), PAIRED_NOTE)
    parts += _table_section("Judge consistency", judge_table(evals), JUDGE_NOTE)
    parts.extend(_figures(evals))
    parts.extend(epm_section(evals, _html_table, _img))
    parts.extend(fidelity_section(evals, _html_table, _img))
    return parts


def _training_html(runs: Sequence[TrainingRun]) -> list[str]:
    png, left_out = training_curves({r.path.name: r.rows for r in runs})
    parts = ["<h2>Training curves</h2>"]
    parts.append(_img(png, "training curves") if png else _note("no numeric metrics"))
    if left_out:
        parts.append(_note(f"not plotted: {', '.join(left_out)}"))
    if any(k.startswith("monitor/") and v for r in runs for row in r.rows for k, v in row.items()):
        parts.append(
            '<p class="note">red lines: steps the reward-hacking monitor flagged (see the last column '
            "below and docs/monitor.md)</p>"
        )
    if any(len(r.rows) > LONG_RUN_STEPS for r in runs):  # long runs: one legible figure per metric
        parts.append("<h3>Curves per metric</h3>")
        parts.extend(_img(png, key) for key, png in metric_figures({r.path.name: r.rows for r in runs}))
    parts += _table_section("Runs", summary_table(runs), tag="h3")
    parts += _table_section("Held-out validation", validation_table(runs), tag="h3")
    parts += _table_section("Judge bias", judge_bias_table(runs), JUDGE_BIAS_NOTE, tag="h3")
    parts += _table_section(FIDELITY_CHECKS, run_checks_table(runs), FIDELITY_NOTE, tag="h3")
    for run in runs:
        samples = read_samples(run.path)
        if samples:
            parts.append(f"<h3>Samples of {html.escape(run.path.name)} (last logged step)</h3>")
            parts.append(samples_html(samples))
    return parts


def _eval_html(e: EvalResult, max_transcripts: int) -> list[str]:
    s = e.summary
    models = ", ".join(f"{k}: {v}" for k, v in s.get("models", {}).items())
    repeats = f"; {s['repeats']} repeats of each case" if s.get("repeats", 1) > 1 else ""
    parts = [
        f"<h2>{html.escape(e.benchmark)} — {html.escape(e.label)}</h2>",
        f'<p class="note">{html.escape(str(e.path))}; {html.escape(models)}; data: '
        f"{html.escape(str(s.get('data')))}; {s['n_valid']} valid of {s['n_cases']} cases{repeats}</p>",
        card_html(e),
    ]
    figures = figures_table(s)
    if figures is not None:
        parts.append(_html_table(*figures))
    in_figures = set(s.get("figures") or {})  # the rest of the metrics, beside the figures above
    metrics = [[k, fmt(v)] for k, v in s["metrics"].items() if k not in in_figures]
    if metrics and e.benchmark != "fidelity":  # fidelity's figures are in its own section's table
        parts.append(_html_table(["metric", "value"], metrics))
    shown = e.records[:max_transcripts]
    parts.append(f"<h3>Transcripts ({len(shown)} of {len(e.records)})</h3>")
    parts.extend(_transcript_html(r) for r in shown)
    return parts


def render_html(
    evals: Sequence[EvalResult],
    runs: Sequence[TrainingRun],
    *,
    title: str,
    max_transcripts: int,
    learning: Sequence[tuple[Path, dict[str, Any]]] = (),
    baseline: str | None = None,
    card_notes: Sequence[str] = (),
    apart: Sequence[EvalResult] = (),
) -> str:
    """The whole report page. ``evals`` stand side by side (checked for comparable cards by
    :func:`~rapo_echo.benchmarks.report_figures.check_cards`); ``apart``, measured differently, get their
    own sections only; ``card_notes`` say which and why."""
    parts = [
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"
    ]
    if evals:
        parts += _comparison_html(evals, baseline, card_notes)
    if learning:  # learning benchmarks (bench_learning.py --algo rapo): arms side by side, seeds as bands
        parts.append(learning_html(learning))
    if runs:
        parts += _training_html(runs)
    for e in [*evals, *apart]:
        parts += _eval_html(e, max_transcripts)
    if not evals and not runs:
        parts.append(_note("nothing to report"))
    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(
    dirs: Sequence[str | Path],
    output: str | Path,
    *,
    max_transcripts: int = 50,
    title: str = "rapo-echo report",
    baseline: str | None = None,
    show_incomparable: bool = False,
) -> tuple[Path, Path]:
    """Write ``output/report.html`` and ``output/report.md``; returns their paths. ``baseline``: the
    eval folder or policy the others are compared with (default: each benchmark's first folder); an
    evaluation whose benchmark card differs from it is left out of the comparison, named with the
    difference, or with ``show_incomparable`` shown marked."""
    evals, runs = discover(dirs)
    evals, apart, notes = check_cards(evals, baseline, show_incomparable)
    output = Path(output)
    html_path, md_path = output / "report.html", output / "report.md"
    page = render_html(
        evals,
        runs,
        title=title,
        max_transcripts=max_transcripts,
        learning=find_learning(dirs),
        baseline=baseline,
        card_notes=notes,
        apart=apart,
    )
    write_text_atomic(html_path, page)
    md = f"# {title}\n\n"
    if evals:
        md += _markdown_comparison(evals) + "\n" + FIGURES_NOTE + "\n"
        md += "".join(f"\n> {n}\n" for n in notes)
        md += _md_section("Paired comparison", paired_table(evals, baseline), PAIRED_NOTE)
        md += _md_section("Judge consistency", judge_table(evals), JUDGE_NOTE)
        epm = [e for e in evals if e.benchmark == "epm"]
        if epm:
            md += _md_section("EPM-Q", epmq_table(epm))
        fidelity = [e for e in evals if e.benchmark == "fidelity" and e.summary["metrics"]]
        if fidelity:
            md += _md_section("Fidelity to real seekers", fidelity_table(fidelity))
    if runs:
        md += ("\n" if evals else "") + markdown_table(*summary_table(runs))
        md += _md_section("Held-out validation", validation_table(runs))
        md += _md_section("Judge bias", judge_bias_table(runs), JUDGE_BIAS_NOTE)
        md += _md_section(FIDELITY_CHECKS, run_checks_table(runs))
    if not evals and not runs:
        md += "Nothing to report.\n"
    write_text_atomic(md_path, md)
    return html_path, md_path
