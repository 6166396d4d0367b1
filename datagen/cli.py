"""``rapo-echo data``: Echo-N1's data pipelines as commands (docs/algorithms/echo_n1.md, "Data pipelines").

* ``data critique-rewrite``: preference pairs for the empathy judge -> ``pairs.jsonl`` (``train-judge``);
* ``data references``: a reference reply graded 3 of 5 per prompt -> ``scenarios.jsonl`` (the
  ``empathy`` reward's ``reference``);
* ``data hard-prompts``: the prompts the policy does not already win -> ``prompts.jsonl`` (``train``);
* ``data synthesize``: three-agent dialogues for the SFT warm start -> ``sft.jsonl`` (``messages`` rows).

Each reads ``--data`` with the training data loader, runs its stages as batched calls of the role
engines (a model spec, an ``http(s)://`` OpenAI-compatible endpoint, or the name of another role of the
command to share its engine), and writes ``--output``: ``config.json``, ``results.jsonl`` (one line per
finished context; the same command resumes there and refuses changed inputs), ``summary.json`` and the
dataset.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from typing import Any

from rapo_echo.config import DEFAULT_SYSTEM_PROMPT
from rapo_echo.errors import ConfigError

COMMANDS = ("critique-rewrite", "references", "hard-prompts", "synthesize")


def register(subparsers: Any) -> None:
    """Add ``data`` and its sub-commands."""
    data = subparsers.add_parser(
        "data",
        help="make Echo-N1's data: critique-rewrite, references, hard-prompts, synthesize",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = data.add_subparsers(dest="data_command", metavar="STEP")
    data.set_defaults(func=lambda args: _help(data))

    cr = _common(sub, "critique-rewrite", "preference pairs for the empathy judge (pairs.jsonl)")
    _role(cr, "writer", "default", "writes the candidate replies")
    _role(cr, "judge", "default", "selects, screens and grades (the strong judge)")
    _role(cr, "rewriter", "judge", "rewrites low-graded replies from their critique")
    cr.add_argument(
        "--select",
        choices=("judge", "all"),
        default="judge",
        help="judge: keep only contexts the judge says call for empathy; all: keep every one",
    )
    cr.add_argument(
        "--safety",
        choices=("judge", "off"),
        default="judge",
        help="judge: keep out contexts the safety constitution names; off: no screening",
    )
    cr.add_argument(
        "--constitution",
        metavar="FILE",
        help="a safety constitution of 'name: description' lines (default: ours)",
    )
    cr.add_argument("--candidates", type=int, default=2, help="replies sampled per context (default 2)")
    _reference_flag(cr)
    cr.add_argument("--rewrite-max", type=int, default=3, help="rewrite replies graded at most this (3)")
    cr.add_argument("--golden-min", type=int, default=4, help="a reply graded at least this is golden (4)")
    cr.add_argument("--low-max", type=int, default=3, help="a contrast reply is graded at most this (3)")
    cr.add_argument(
        "--min-gap", type=int, default=1, help="a pair's golden reply is graded at least this much higher (1)"
    )
    cr.add_argument("--rounds", type=int, default=2, help="rewrite rounds per reply (default 2)")
    cr.add_argument(
        "--pairing",
        choices=("all", "own"),
        default="all",
        help="all: every golden with every contrast reply; own: each rewrite with its original",
    )
    cr.add_argument("--max-pairs", type=int, default=4, help="pairs per context at most (default 4)")
    cr.add_argument(
        "--screen-reasoning",
        action="store_true",
        help="the selection and safety judges write a reasoning line before their verdict",
    )
    _generation(cr, temperature=1.0)
    _grading(cr)
    cr.set_defaults(func=run_critique_rewrite)

    ref = _common(sub, "references", "a reference reply graded 3 of 5 per prompt (scenarios.jsonl)")
    _role(ref, "writer", "default", "writes the candidate references")
    _role(ref, "judge", "default", "grades them (the strong judge)")
    ref.add_argument("--target", type=int, default=3, help="the grade a reference must have (default 3)")
    ref.add_argument("--candidates", type=int, default=4, help="replies sampled per round (default 4)")
    ref.add_argument("--rounds", type=int, default=2, help="sampling rounds for prompts without one (2)")
    _reference_flag(ref)
    ref.add_argument(
        "--fallback",
        choices=("skip", "closest"),
        default="skip",
        help="a prompt without a reply at the target: skip it (default) or take the closest",
    )
    _generation(ref, temperature=1.0)
    _grading(ref)
    ref.set_defaults(func=run_references)

    hp = _common(sub, "hard-prompts", "keep the prompts the policy does not already win (prompts.jsonl)")
    _role(hp, "policy", "default", "the policy to be trained (samples best-of-N)")
    _role(hp, "judge", "default", "the reward's judge")
    hp.add_argument("--n", type=int, default=4, help="replies sampled per prompt (best-of-N; default 4)")
    hp.add_argument(
        "--criterion",
        choices=("best", "mean"),
        default="best",
        help="best: keep when even the best reply does not win; mean: when the mean score is low",
    )
    hp.add_argument("--threshold", type=float, default=0.5, help="keep when criterion <= this (0.5)")
    hp.add_argument(
        "--reward",
        choices=("empathy", "echo_n1"),
        default="empathy",
        help="the pairwise filter: the empathy reward, or echo_n1 (routes chit-chat to humanlike)",
    )
    hp.add_argument(
        "--reward-args", default="{}", metavar="JSON", help="the reward's args, as in a run config"
    )
    _generation(hp, temperature=1.0)
    hp.set_defaults(func=run_hard_prompts)

    syn = _common(sub, "synthesize", "three-agent dialogues for the SFT warm start (sft.jsonl)")
    _role(syn, "companion", "default", "the AI companion (the replies the SFT data teaches)")
    _role(syn, "user", "default", "invents each person's profile and plays them")
    _role(syn, "director", "user", "decides every few exchanges: continue, switch topic, or end")
    syn.add_argument(
        "--stages",
        default="6:neutral,10:mild,16:intense",
        help="the curriculum, TURNS:TONE,... from first to last (tones: neutral, mild, intense)",
    )
    syn.add_argument("--director-every", type=int, default=5, help="exchanges between decisions (5)")
    syn.add_argument("--companion-prompt", help="the companion's system prompt (default: ours)")
    syn.add_argument(
        "--no-system-in-rows",
        action="store_true",
        help="leave the companion's system prompt out of the sft.jsonl rows",
    )
    syn.add_argument("--user-temperature", type=float, default=0.9)
    syn.add_argument("--user-tokens", type=int, default=64, help="a user message's token budget (64)")
    syn.add_argument("--profile-tokens", type=int, default=320, help="a profile's token budget (320)")
    _generation(syn, temperature=0.7, system=False)
    syn.add_argument(
        "--use-logprobs",
        choices=("auto", "always", "never"),
        default="auto",
        help="the director's decision from label probabilities (auto: where the engine has them)",
    )
    syn.add_argument("--max-retries", type=int, default=2, help="retries of an unreadable answer (2)")
    syn.set_defaults(func=run_synthesize)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _common(sub: Any, name: str, help_: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_, description=help_)
    p.add_argument("--data", help="contexts: any file `train` reads (default: the bundled scenarios)")
    p.add_argument("--format", default="auto", help="the data file's format (default: auto)")
    p.add_argument("--limit", type=int, help="only the first N contexts")
    p.add_argument("--output", required=True, help="output folder; the same command resumes there")
    p.add_argument("--batch-size", type=int, default=16, help="contexts per chunk of batched calls (16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "auto"))
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--timeout-minutes",
        type=float,
        help="stop (resumably) before the next chunk once this many minutes passed (default: none)",
    )
    return p


def _role(p: argparse.ArgumentParser, role: str, default: str, what: str) -> None:
    p.add_argument(
        f"--{role}",
        default=default,
        help=f"{what}: a model spec, an http(s):// endpoint or another role's name (default {default})",
    )


def _reference_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-include-reference",
        dest="include_reference",
        action="store_false",
        help="do not grade the context's own reference reply (e.g. the ESConv supporter turn)",
    )


def _generation(p: argparse.ArgumentParser, temperature: float, system: bool = True) -> None:
    p.add_argument(
        "--temperature", type=float, default=temperature, help=f"sampling temperature ({temperature})"
    )
    p.add_argument("--max-new-tokens", type=int, default=96, help="a reply's token budget (96)")
    if system:
        p.add_argument(
            "--system-prompt",
            default=DEFAULT_SYSTEM_PROMPT,
            help="the policy's system prompt for sampled replies ('' for none; default: train's)",
        )


def _grading(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grade-tokens", type=int, default=96, help="the critique's token budget (96)")
    p.add_argument(
        "--use-logprobs",
        choices=("auto", "always", "never"),
        default="auto",
        help="read verdicts and grades from label probabilities (auto: where the engine has them)",
    )
    p.add_argument("--max-retries", type=int, default=2, help="retries of an unreadable answer (2)")


# ---------------------------------------------------------------------------- running
def _settings(cls: type, **kw: Any) -> Any:
    try:
        return cls(**kw)
    except ValueError as exc:
        raise ConfigError(f"data: {exc}") from None


def _resolve_specs(specs: dict[str, str]) -> dict[str, str]:
    """Each role's model spec, a role named as another's spec standing for that role's spec."""
    out = {}
    for role, spec in specs.items():
        seen = {role}
        while spec in specs and spec not in seen:
            seen.add(spec)
            spec = specs[spec]
        if spec in specs:
            raise ConfigError(f"--{role}: the roles {', '.join(sorted(seen))} name each other")
        out[role] = spec
    return out


def load_engines(specs: dict[str, str], **kw: Any) -> dict[str, Any]:
    """One engine per role; roles with the same spec share one."""
    from rapo_echo.engines import engine_from_spec

    cache: dict[str, Any] = {}
    out = {}
    for role, spec in _resolve_specs(specs).items():
        if spec not in cache:
            cache[spec] = engine_from_spec(spec, **kw)
        out[role] = cache[spec]
    return out


# the roles whose answers are read as judgements, and the role names their calls log under
JUDGING_ROLES = {
    "judge": ("judge",),
    "rewriter": ("rewriter",),
    "user": ("simulator",),
    "director": ("judge", "simulator"),
}


def warn_weak_roles(engines: dict[str, Any]) -> None:
    """Say once, before the run, which judging role runs on a model too small to mean anything (with the
    data commands' advice, not training's)."""
    from rapo_echo.llm.strength import warn_if_weak

    for role, engine in engines.items():
        for logged_as in JUDGING_ROLES.get(role, ()):
            warn_if_weak(engine, logged_as, "data")


def _run(
    args: argparse.Namespace, command: str, specs: dict[str, str], settings: Any, protocol: dict, build: Any
) -> int:
    """Load the contexts, check ``--output`` (both before any model loads), load the engines, run."""
    from rapo_echo.benchmarks.runner import check_output
    from rapo_echo.datagen.contexts import load_contexts
    from rapo_echo.datagen.runner import WHAT, data_config, run_pipeline
    from rapo_echo.rundir import check_writable

    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    timeout = args.timeout_minutes
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"--timeout-minutes must be a finite number > 0, got {timeout}")
    contexts = load_contexts(args.data, args.format, args.limit)
    models = _resolve_specs(specs)
    config = data_config(command, models, args.data, args.format, asdict(settings), protocol)
    check_output(check_writable(args.output), config, WHAT)
    engines = load_engines(specs, dtype=args.dtype, device=args.device)
    warn_weak_roles(engines)
    pipeline = build(engines, contexts)
    summary = run_pipeline(
        pipeline,
        contexts,
        args.output,
        config,
        batch_size=args.batch_size,
        progress=not args.no_progress,
        timeout_s=None if timeout is None else timeout * 60,
    )
    print(json.dumps(summary, indent=2))
    print(f"dataset: {args.output}/{pipeline.dataset_file}  records: {args.output}/results.jsonl")
    if not summary["complete"]:
        failed = f"{summary['n_failed']} contexts failed"
        why = f"stopped early ({summary['stopped']})" if summary["stopped"] else failed
        print(f"incomplete: {why}; run the same command again to resume")
        return 1
    return 0


def _system(value: str | None) -> str | None:
    return value or None


def run_critique_rewrite(args: argparse.Namespace) -> int:
    from rapo_echo.datagen.critique_rewrite import (
        CritiqueRewrite,
        CritiqueRewriteSettings,
        protocol,
    )
    from rapo_echo.datagen.screening import Constitution

    constitution = Constitution.from_file(args.constitution) if args.constitution else Constitution()
    settings = _settings(
        CritiqueRewriteSettings,
        select=args.select,
        safety=args.safety,
        candidates=args.candidates,
        include_reference=args.include_reference,
        rewrite_max=args.rewrite_max,
        golden_min=args.golden_min,
        low_max=args.low_max,
        min_gap=args.min_gap,
        rounds=args.rounds,
        pairing=args.pairing,
        max_pairs=args.max_pairs,
        screen_reasoning=args.screen_reasoning,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        grade_tokens=args.grade_tokens,
        system_prompt=_system(args.system_prompt),
        use_logprobs=args.use_logprobs,
        max_retries=args.max_retries,
        seed=args.seed,
        batch_size=args.batch_size,
    )
    specs = {"writer": args.writer, "judge": args.judge, "rewriter": args.rewriter}
    return _run(
        args,
        "critique-rewrite",
        specs,
        settings,
        protocol(constitution),
        lambda e, _: CritiqueRewrite(e["writer"], e["judge"], e["rewriter"], settings, constitution),
    )


def run_references(args: argparse.Namespace) -> int:
    from rapo_echo.datagen.reference_replies import References, ReferenceSettings, protocol

    settings = _settings(
        ReferenceSettings,
        target=args.target,
        candidates=args.candidates,
        rounds=args.rounds,
        include_reference=args.include_reference,
        fallback=args.fallback,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        grade_tokens=args.grade_tokens,
        system_prompt=_system(args.system_prompt),
        use_logprobs=args.use_logprobs,
        max_retries=args.max_retries,
        seed=args.seed,
        batch_size=args.batch_size,
    )
    specs = {"writer": args.writer, "judge": args.judge}
    return _run(
        args,
        "references",
        specs,
        settings,
        protocol(),
        lambda e, _: References(e["writer"], e["judge"], settings),
    )


def run_hard_prompts(args: argparse.Namespace) -> int:
    from rapo_echo.datagen.hard_prompts import HardPrompts, HardPromptSettings, protocol

    try:
        reward_args = json.loads(args.reward_args)
    except ValueError as exc:
        raise ConfigError(f"--reward-args: not valid JSON ({exc})") from None
    if not isinstance(reward_args, dict):
        raise ConfigError("--reward-args: expected a JSON object of the reward's args")
    settings = _settings(
        HardPromptSettings,
        n=args.n,
        criterion=args.criterion,
        threshold=args.threshold,
        reward=args.reward,
        reward_args=reward_args,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        system_prompt=_system(args.system_prompt),
        seed=args.seed,
        batch_size=args.batch_size,
    )
    specs = {"policy": args.policy, "judge": args.judge}
    return _run(
        args,
        "hard-prompts",
        specs,
        settings,
        protocol(),
        lambda e, _: HardPrompts(e["policy"], e["judge"], settings),
    )


def run_synthesize(args: argparse.Namespace) -> int:
    from rapo_echo.datagen.synthesis import (
        COMPANION_PROMPT,
        Synthesis,
        SynthesisSettings,
        protocol,
    )

    settings = _settings(
        SynthesisSettings,
        stages=tuple(s.strip() for s in args.stages.split(",") if s.strip()),
        director_every=args.director_every,
        companion_prompt=args.companion_prompt or COMPANION_PROMPT,
        system_in_rows=not args.no_system_in_rows,
        temperature=args.temperature,
        user_temperature=args.user_temperature,
        max_new_tokens=args.max_new_tokens,
        user_tokens=args.user_tokens,
        profile_tokens=args.profile_tokens,
        use_logprobs=args.use_logprobs,
        max_retries=args.max_retries,
        seed=args.seed,
        batch_size=args.batch_size,
    )
    specs = {"companion": args.companion, "user": args.user, "director": args.director}
    return _run(
        args,
        "synthesize",
        specs,
        settings,
        protocol(),
        lambda e, contexts: Synthesis(
            e["companion"], e["user"], e["director"], settings, {sc.id: i for i, sc in enumerate(contexts)}
        ),
    )
