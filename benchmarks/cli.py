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
import dataclasses
import json
from typing import Any

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.config import DEFAULT_SYSTEM_PROMPT


def register(subparsers: Any) -> None:
    """Add the ``eval`` sub-command."""
    from rapo_echo.benchmarks.runner import BENCHMARKS

    ev = subparsers.add_parser(
        "eval",
        help="run a benchmark (esconv, esconv-ref, sotopia, epm, sage) on a policy, or fidelity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument("--benchmark", required=True, choices=sorted(BENCHMARKS))
    ev.add_argument("--policy", help="model spec or http(s):// endpoint of the policy (required)")
    ev.add_argument(
        "--transcripts",
        help="sage: score dialogues already run, in SAGE's released result format (a *_result.jsonl file "
        "or a folder of them; one output folder per file); no model is loaded",
    )
    ev.add_argument(
        "--data",
        help="data in the benchmark's format (ESConv JSON/JSONL; SOTOPIA JSON file or folder; EPM persona "
        "cards or EMPA's case folder; SAGE / RLVER profile JSONL; fidelity: ESConv with in-dialogue "
        "ratings); default: our bundled English sets (esconv, esconv-ref: bundled:esconv_style_en.json); "
        "fidelity needs it",
    )
    ev.add_argument(
        "--simulator",
        default="default",
        help="seeker / partner / EPM user and director model spec, or 'policy' (default: default)",
    )
    ev.add_argument(
        "--judge",
        default="default",
        help="critic / evaluator / EPM rater model spec, or 'policy' (default: default)",
    )
    ev.add_argument(
        "--user",
        action="append",
        default=[],
        metavar="NAME",
        help="fidelity: a simulated user to test, on the --simulator engine: reaction (RAPO), sage "
        "(RLVER's SAGE-style user) or a simulator plugin (module:Class); repeatable",
    )
    ev.add_argument(
        "--reward",
        action="append",
        default=[],
        metavar="NAME",
        help="fidelity: a reward plugin to test (empathy, humanlike, judge, length, module:attr, ...; judge "
        "rewards use the --judge engine); repeatable",
    )
    ev.add_argument("--limit", type=int, help="only the first N cases (fidelity: conversations)")
    ev.add_argument(
        "--output", required=True, help="output folder (results.jsonl, summary.json); resumes if it exists"
    )
    ev.add_argument(
        "--batch-size",
        type=int,
        help="cases run together per batch (default: every case at once, up to 512, when a role is an "
        "http(s) endpoint; else 8)",
    )
    ev.add_argument(
        "--max-concurrency",
        type=int,
        help="http(s) endpoints: requests in flight at once per endpoint (default 256; lower it for a hosted "
        "API's cap)",
    )
    ev.add_argument("--max-rpm", type=float, help="http(s) endpoints: requests per minute (default: none)")
    ev.add_argument("--max-tpm", type=float, help="http(s) endpoints: tokens per minute (default: none)")
    ev.add_argument(
        "--max-turns",
        type=int,
        help="episode length limit (default: esconv 8, sotopia 20, epm 45, sage 10 replies)",
    )
    ev.add_argument(
        "--max-new-tokens", type=int, default=128, help="reply length limit for policy and simulator"
    )
    ev.add_argument("--temperature", type=float, default=0.0, help="policy sampling temperature (0 = greedy)")
    ev.add_argument("--simulator-temperature", type=float, default=0.0)
    ev.add_argument(
        "--simulator-max-new-tokens",
        type=int,
        help="simulator reply length limit (default: sage 512, others --max-new-tokens)",
    )
    ev.add_argument("--judge-max-new-tokens", type=int, default=256)
    ev.add_argument(
        "--judge-retries",
        type=int,
        default=2,
        help="retries of an unparseable judge or SAGE simulator reply (default 2)",
    )
    ev.add_argument(
        "--judge-logprobs",
        choices=("auto", "always", "never"),
        default="auto",
        help="read label verdicts from log-probs: auto = when the judge engine exposes them",
    )
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument(
        "--system-prompt", default=DEFAULT_SYSTEM_PROMPT, help="the policy's system prompt ('' for none)"
    )
    ev.add_argument(
        "--sage-system-prompt",
        choices=("sage", "ours"),
        default="sage",
        help="sage: the policy's system prompt is SAGE's kind (comparable with SAGE's leaderboard; the "
        "default) or ours (--system-prompt)",
    )
    ev.add_argument(
        "--subset", choices=("all", "hard"), default="all", help="sotopia: all scenarios or the hard ones"
    )
    ev.add_argument(
        "--scorer",
        choices=("ours", "sotopia"),
        default="ours",
        help="sotopia: our evaluator on the --judge engine (default) or SOTOPIA's own evaluator (needs "
        "pip install 'rapo-echo[sotopia]'; comparable with published figures with a GPT-4-class model)",
    )
    ev.add_argument(
        "--sotopia-model",
        default="gpt-4o",
        help="sotopia --scorer sotopia: the evaluator model in sotopia's naming (gpt-4o, or "
        "custom/<model>@<base_url> for an OpenAI-compatible server)",
    )
    ev.add_argument(
        "--emotion-readout",
        choices=("auto", "text", "logprobs"),
        default="auto",
        help="sage: the user's emotion change from label probabilities (logprobs; one forward, usable "
        "with small simulators), from the analysis's stated number (text: SAGE's protocol), or auto "
        "(logprobs when the simulator engine has them; the default)",
    )
    ev.add_argument(
        "--sage-reply",
        choices=("plain", "fields"),
        default="plain",
        help="sage: the simulated user writes its message alone (plain, the default) or with SAGE's "
        "reasoning fields first (fields: SAGE's protocol, needs a capable simulator)",
    )
    ev.add_argument(
        "--epm",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="epm: override an EPM constant (benchmarks/epm/vectors.py EpmConfig), e.g. --epm alpha=0.05",
    )
    ev.add_argument(
        "--recompute",
        metavar="DIR",
        help="epm: recompute success and EPM-Q from published per-case result files in DIR (no models)",
    )
    ev.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "auto"))
    ev.add_argument("--device", default="auto")
    add_measure_flags(ev)
    ev.set_defaults(func=run_eval_command)


def register_report(subparsers: Any) -> None:
    """Add the ``report`` sub-command."""
    rep = subparsers.add_parser("report", help="render evaluation / training-run folders into an HTML report")
    rep.add_argument(
        "dirs", nargs="+", help="eval output folders, training run folders, or folders holding them"
    )
    rep.add_argument(
        "--output", default="report", help="folder for report.html and report.md (default: ./report)"
    )
    rep.add_argument(
        "--max-transcripts", type=int, default=50, help="transcripts shown per evaluation (default 50)"
    )
    rep.add_argument("--title", default="rapo-echo report")
    rep.add_argument(
        "--baseline",
        help="eval folder or policy spec the others are compared with, figure by figure and card by card "
        "(default: each benchmark's first folder as given)",
    )
    rep.add_argument(
        "--show-incomparable",
        action="store_true",
        help="put evaluations whose benchmark cards differ (another simulator, judge, sampling, prompt or "
        "data) side by side anyway, marked; by default they are left out of the comparison and named",
    )
    rep.set_defaults(func=run_report_command)
    from rapo_echo.benchmarks.compare import register as register_compare

    register_compare(subparsers)


# ------------------------------------------------------------------ how far a figure can be trusted
# The eval settings of repeats, judge rechecks, state probes and hard profiles (EvalSettings' last block),
# one flag each with its default from EvalSettings: docs/reading-results.md.
MEASURE_FLAGS: dict[str, dict[str, Any]] = {
    "repeats": {
        "type": int,
        "help": "run every case N times, each repeat with its own simulator, judge and policy seeds "
        "(seed + 1000 k); the summary gives each figure's mean, interval over cases and spread across "
        "repeats (default 1; a larger N resumes a finished folder)",
    },
    "judge_recheck": {
        "choices": ("on", "off"),
        "help": "each judged case asks its judge (SAGE: the simulated user's emotion reading) its last "
        "question once more with a fresh seed and prompt marker: the judge's self-agreement (default on)",
    },
    "state_probe": {
        "choices": ("auto", "on", "off"),
        "help": "sage: ask the policy each turn how the user feels (0-100) beside the dialogue, and score "
        "its emotional state tracking against the simulator's hidden emotion (auto: with --profiles hard)",
    },
    "profiles": {
        "choices": ("standard", "hard"),
        "help": "sage without --data: our standard profiles, or our hard-to-help seekers (withdrawn, "
        "hostile, contradictory, testing, deflecting with humour, shifting goals)",
    },
}


def add_measure_flags(parser: argparse.ArgumentParser) -> None:
    """The ``MEASURE_FLAGS``, their defaults from :class:`EvalSettings`."""
    defaults = {f.name: f.default for f in dataclasses.fields(EvalSettings)}
    for name, spec in MEASURE_FLAGS.items():
        default = defaults[name]
        shown = ("on" if default else "off") if isinstance(default, bool) else default
        parser.add_argument("--" + name.replace("_", "-"), default=shown, **spec)


def measure_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ``MEASURE_FLAGS`` of parsed arguments as EvalSettings fields (on/off as booleans)."""
    out = {name: getattr(args, name) for name in MEASURE_FLAGS}
    out["judge_recheck"] = out["judge_recheck"] == "on"
    return out


def settings_from_args(args: argparse.Namespace) -> EvalSettings:
    try:
        return EvalSettings(
            max_turns=args.max_turns,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            simulator_temperature=args.simulator_temperature,
            judge_max_new_tokens=args.judge_max_new_tokens,
            simulator_max_new_tokens=args.simulator_max_new_tokens,
            judge_retries=args.judge_retries,
            judge_logprobs=args.judge_logprobs,
            seed=args.seed,
            system_prompt=args.system_prompt or None,
            sage_system_prompt=args.sage_system_prompt,
            batch_size=args.batch_size,
            subset=args.subset,
            sotopia_scorer=args.scorer,
            sotopia_model=args.sotopia_model,
            emotion_readout=args.emotion_readout,
            sage_reply=args.sage_reply,
            epm=epm_overrides(args.epm),
            **measure_settings(args),
        )
    except ValueError as exc:
        from rapo_echo.errors import ConfigError

        raise ConfigError(f"eval: {exc}") from exc


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


def engine_args(args: argparse.Namespace) -> dict[str, Any]:
    """The engine settings of the eval flags (the request limits only where given: the config's defaults
    apply otherwise)."""
    kw: dict[str, Any] = {"dtype": args.dtype, "device": args.device}
    limits = {"max_concurrency": args.max_concurrency, "max_rpm": args.max_rpm, "max_tpm": args.max_tpm}
    kw.update({k: v for k, v in limits.items() if v is not None})
    return kw


def epm_overrides(items: list[str]) -> dict[str, Any]:
    """``--epm KEY=VALUE`` flags as a mapping (values parsed as YAML scalars)."""
    from rapo_echo.config import parse_override

    return {".".join(key): value for key, value in (parse_override(t) for t in items)}


def run_eval_command(args: argparse.Namespace) -> int:
    from rapo_echo.benchmarks.runner import data_or_default, get_benchmark, run_eval
    from rapo_echo.errors import ConfigError

    if args.recompute:
        if args.benchmark != "epm":
            raise ConfigError("--recompute works with --benchmark epm only")
        from rapo_echo.benchmarks.epm.recompute import recompute

        summary = recompute(args.recompute, args.output, epm_overrides(args.epm))
        print(json.dumps(summary, indent=2))
        print(f"results: {args.output}/results.jsonl  summary: {args.output}/summary.json")
        return 0
    if args.transcripts:
        return run_transcripts_command(args)
    if args.benchmark == "fidelity":
        from rapo_echo.benchmarks.fidelity.cli import run_fidelity_command

        return run_fidelity_command(args, settings_from_args(args), engine_args(args))
    if args.user or args.reward:
        raise ConfigError("--user and --reward apply to --benchmark fidelity only")
    if not args.policy:
        raise ConfigError("eval: --policy is required (except with --recompute, or --transcripts with sage)")
    if args.epm and args.benchmark != "epm":
        raise ConfigError("--epm settings apply to --benchmark epm only")
    benchmark = get_benchmark(args.benchmark)
    data = data_or_default(benchmark, args.data)
    settings = settings_from_args(args)
    specs = {"policy": args.policy, "simulator": args.simulator, "judge": args.judge}
    models = {r: s for r, s in specs.items() if r in benchmark.roles}
    cases = benchmark.load_cases(data, settings)  # fail on bad data before loading any model
    if not cases:
        print(f"{args.benchmark}: no cases")
        return 1
    from rapo_echo.benchmarks.runner import check_output, eval_config
    from rapo_echo.rundir import check_writable

    # an unwritable --output, or one holding other files or another evaluation: refused before any model
    config = eval_config(benchmark.name, models, data, settings, getattr(benchmark, "protocol", None))
    check_output(check_writable(args.output), config)
    roles = build_roles(benchmark.roles, specs, **engine_args(args))
    from rapo_echo import progress

    progress.enable()
    summary = run_eval(
        benchmark, roles, settings, args.output, data=data, limit=args.limit, models=models
    )
    print(json.dumps(summary, indent=2))
    print(f"results: {args.output}/results.jsonl  summary: {args.output}/summary.json")
    return 0


def run_transcripts_command(args: argparse.Namespace) -> int:
    """``eval --benchmark sage --transcripts DIR``: score released SAGE result files, print a table."""
    from rapo_echo.benchmarks.sage.transcripts import score_transcripts
    from rapo_echo.errors import ConfigError

    if args.benchmark != "sage":
        raise ConfigError(
            f"eval: --transcripts scores SAGE result files; use --benchmark sage, not {args.benchmark}"
        )
    summaries = score_transcripts(args.transcripts, args.output)
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
    print(f"written under {args.output}")
    return 0


def run_report_command(args: argparse.Namespace) -> int:
    from rapo_echo.benchmarks.report import build_report

    html_path, md_path = build_report(
        args.dirs,
        args.output,
        max_transcripts=args.max_transcripts,
        title=args.title,
        baseline=args.baseline,
        show_incomparable=args.show_incomparable,
    )
    print(f"report: {html_path}\nmarkdown table: {md_path}")
    return 0
