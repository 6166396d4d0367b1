"""``rapo-echo eval`` and ``rapo-echo report``.

``eval --benchmark NAME --policy SPEC --output DIR`` runs a benchmark; SPEC (for ``--policy``,
``--simulator``, ``--judge``) is ``default`` (the embedded model), a model folder, a training run folder, a
``.gguf`` file, a Hugging Face id, or an ``http(s)://`` OpenAI-compatible endpoint; ``--simulator`` and
``--judge`` also take ``policy`` (share the policy's engine). Roles with the same spec share one engine.
``eval --benchmark fidelity --data FILE [--user NAME ...] [--reward NAME ...] --output DIR`` needs no policy:
it scores simulated users (on ``--simulator``) and rewards (judged by ``--judge``) against ESConv seekers'
own ratings. ``report DIR [DIR ...]`` renders evaluation and training-run folders into one HTML page and a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from rapo_echo.benchmarks.base import Roles
from rapo_echo.config import Flag, Strict, add_flags, section_from_args
from rapo_echo.errors import ConfigError

if TYPE_CHECKING:
    from rapo_echo.benchmarks.eval_command import EvalCommand


class ReportCommand(Strict):
    """`rapo-echo report`: evaluation and training-run folders rendered into one HTML page and a Markdown
    table."""

    dirs: Annotated[list[str], Flag(positional=True)] = Field(
        description="Eval output folders, training run folders, or folders holding them."
    )
    output: str = Field("report", description="Folder for report.html and report.md.")
    max_transcripts: int = Field(50, ge=0, description="Transcripts shown per evaluation.")
    title: str = Field("rapo-echo report", description="The page's title.")
    baseline: str | None = Field(
        None,
        description="Eval folder or policy spec the others are compared with, figure by figure and card by "
        "card (unset: each benchmark's first folder as given).",
    )
    show_incomparable: bool = Field(
        False,
        description="Put evaluations whose benchmark cards differ (another simulator, judge, sampling, "
        "prompt or data) side by side anyway, marked (unset: they are left out of the comparison and "
        "named).",
    )


def register(subparsers: Any) -> None:
    """Add the ``eval`` sub-command."""
    from rapo_echo.benchmarks.eval_command import (
        EvalCommand,  # the benchmarks' registry: loaded for eval only
    )

    help = "run a benchmark (esconv, esconv-ref, sotopia, epm, sage) on a policy, or fidelity"
    add_command(subparsers, "eval", help, EvalCommand, run_eval_command, doc=__doc__, config=True)


def register_report(subparsers: Any) -> None:
    """Add the ``report`` sub-command."""
    help = "render evaluation / training-run folders into an HTML report"
    add_command(subparsers, "report", help, ReportCommand, run_report_command)


def add_command(
    subparsers: Any,
    name: str,
    help: str,
    section: type[Strict],
    func: Callable[[argparse.Namespace], int],
    *,
    doc: str | None = None,
    config: bool = False,
) -> None:
    """Add sub-command ``name``: ``section``'s flags (``config``: and ``--config``), ``doc`` its description
    as written."""
    parser = subparsers.add_parser(
        name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_flags(parser, section, config=config)
    parser.set_defaults(func=func)


def build_roles(needed: tuple[str, ...], specs: dict[str, Any], **engine_kw: Any) -> Roles:
    """Engines for the roles a benchmark needs, each a model spec or an engine object (the Python API's);
    ``policy`` or a repeated spec reuses the same engine, named by the roles it plays."""
    from rapo_echo.engines import engines_for_roles
    from rapo_echo.llm.strength import warn_if_weak

    roles = ["policy", *(r for r in ("simulator", "judge") if r in needed)]
    named = {r: specs["policy"] if specs[r] == "policy" else specs[r] for r in roles}
    strings = {r: s for r, s in named.items() if isinstance(s, str)}
    others = {**named, **engines_for_roles(strings, **engine_kw)}
    policy = others.pop("policy")
    for role, engine in others.items():
        warn_if_weak(engine, role, "eval")
    return Roles(policy=policy, **others)


def run_eval_command(args: argparse.Namespace) -> int:
    from rapo_echo.benchmarks.eval_command import EvalCommand
    from rapo_echo.benchmarks.runner import data_or_default, get_benchmark, run_eval

    cmd = section_from_args(EvalCommand, args)
    if cmd.recompute:
        if cmd.benchmark != "epm":
            raise ConfigError("--recompute works with --benchmark epm only")
        from rapo_echo.benchmarks.epm.recompute import recompute

        summary = recompute(cmd.recompute, cmd.output, cmd.epm)
        print(json.dumps(summary, indent=2))
        print(f"results: {cmd.output}/results.jsonl  summary: {cmd.output}/summary.json")
        return 0
    if cmd.transcripts:
        return run_transcripts_command(cmd)
    if cmd.benchmark == "fidelity":
        from rapo_echo.benchmarks.fidelity.cli import run_fidelity_command

        return run_fidelity_command(cmd)
    if cmd.user or cmd.reward:
        raise ConfigError("--user and --reward apply to --benchmark fidelity only")
    if not cmd.policy:
        raise ConfigError("eval: --policy is required (except with --recompute, or --transcripts with sage)")
    if cmd.epm and cmd.benchmark != "epm":
        raise ConfigError("--epm settings apply to --benchmark epm only")
    benchmark = get_benchmark(cmd.benchmark)
    data = data_or_default(benchmark, cmd.data)
    settings = cmd.settings()
    specs = {"policy": cmd.policy, "simulator": cmd.simulator, "judge": cmd.judge}
    models = {r: s for r, s in specs.items() if r in benchmark.roles}
    cases = benchmark.load_cases(data, settings)  # fail on bad data before loading any model
    if not cases:
        print(f"{cmd.benchmark}: no cases")
        return 1
    from rapo_echo.benchmarks.runner import check_output, eval_config
    from rapo_echo.rundir import check_writable

    # an unwritable --output, or one holding other files or another evaluation: refused before any model
    config = eval_config(benchmark.name, models, data, settings, getattr(benchmark, "protocol", None))
    check_output(check_writable(cmd.output), config)
    roles = build_roles(benchmark.roles, specs, **cmd.engine_args())
    from rapo_echo import progress

    progress.enable()
    summary = run_eval(benchmark, roles, settings, cmd.output, data=data, limit=cmd.limit, models=models)
    print(json.dumps(summary, indent=2))
    print(f"results: {cmd.output}/results.jsonl  summary: {cmd.output}/summary.json")
    return 0


def run_transcripts_command(cmd: EvalCommand) -> int:
    """``eval --benchmark sage --transcripts DIR``: score released SAGE result files, print a table."""
    from rapo_echo.benchmarks.sage.transcripts import score_transcripts

    if cmd.benchmark != "sage":
        raise ConfigError(
            f"eval: --transcripts scores SAGE result files; use --benchmark sage, not {cmd.benchmark}"
        )
    summaries = score_transcripts(cmd.transcripts, cmd.output)
    print("| model | dialogues | valid | SAGE score | success | failure | avg turns |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for s in summaries:
        m = s["metrics"]
        score = "–" if m["score"] is None else f"{m['score']:.2f}"
        turns = "–" if m["avg_turns"] is None else f"{m['avg_turns']:.2f}"
        print(
            f"| {s['models']['policy']} | {s['n_cases']} | {s['n_valid']} | {score} | {m['successes']} | "
            f"{m['failures']} | {turns} |"
        )
    for s in summaries:
        bad = s.get("invalid_cases") or {}
        if bad:
            shown = "; ".join(f"{k}: {v}" for k, v in list(bad.items())[:10])
            more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
            print(f"{s['models']['policy']}: {len(bad)} invalid, not scored: {shown}{more}")
    print(f"written under {cmd.output}")
    return 0


def run_report_command(args: argparse.Namespace) -> int:
    from rapo_echo.benchmarks.report import build_report

    cmd = section_from_args(ReportCommand, args)
    html_path, md_path = build_report(
        cmd.dirs,
        cmd.output,
        max_transcripts=cmd.max_transcripts,
        title=cmd.title,
        baseline=cmd.baseline,
        show_incomparable=cmd.show_incomparable,
    )
    print(f"report: {html_path}\nmarkdown table: {md_path}")
    return 0
