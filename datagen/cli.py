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
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import Field

from rapo_echo.config import Device, Dtype, ScenarioFormat, Strict, add_flags, section_from_args
from rapo_echo.datagen.critique_rewrite import CritiqueRewriteSettings
from rapo_echo.datagen.hard_prompts import HardPromptSettings
from rapo_echo.datagen.reference_replies import ReferenceSettings
from rapo_echo.datagen.synthesis import SynthesisSettings
from rapo_echo.errors import ConfigError


def role(default: str, what: str) -> Any:
    """A role's engine: a model spec, an endpoint or another role's name (which shares its engine)."""
    return Field(default, description=f"{what}: a model spec, an http(s):// endpoint or another role's name.")


class DataCommand(Strict):
    """What every data command reads and writes, and where its local models run. A command's class is
    ``(DataCommand, its pipeline's settings)`` and names its ``roles``."""

    roles: ClassVar[tuple[str, ...]]

    data: str | None = Field(
        None, description="Contexts: any file `train` reads (unset: the bundled scenarios)."
    )
    format: ScenarioFormat = Field("auto", description="The data file's format.")
    limit: int | None = Field(None, ge=1, description="Only the first N contexts.")
    output: str = Field(description="Output folder; the same command resumes there.")
    dtype: Dtype = Field("float32", description="Local models' weights' dtype.")
    device: Device = Field("auto", description="Local models' device: auto, cpu, cuda, cuda:N or mps.")
    progress: bool = Field(True, description="Show a progress bar.")
    timeout_minutes: float | None = Field(
        None, gt=0, description="Stop (resumably) before the next chunk once this many minutes passed."
    )


class CritiqueRewriteCommand(DataCommand, CritiqueRewriteSettings):
    """`rapo-echo data critique-rewrite`: preference pairs for the empathy judge (pairs.jsonl)."""

    roles: ClassVar = ("writer", "judge", "rewriter")
    writer: str = role("default", "Writes the candidate replies")
    judge: str = role("default", "Selects, screens and grades (the strong judge)")
    rewriter: str = role("judge", "Rewrites low-graded replies from their critique")
    constitution: str | None = Field(
        None, description="A safety constitution file of 'name: description' lines (unset: ours)."
    )


class ReferencesCommand(DataCommand, ReferenceSettings):
    """`rapo-echo data references`: a reference reply graded 3 of 5 per prompt (scenarios.jsonl)."""

    roles: ClassVar = ("writer", "judge")
    writer: str = role("default", "Writes the candidate references")
    judge: str = role("default", "Grades them (the strong judge)")


class HardPromptsCommand(DataCommand, HardPromptSettings):
    """`rapo-echo data hard-prompts`: the prompts the policy does not already win (prompts.jsonl)."""

    roles: ClassVar = ("policy", "judge")
    policy: str = role("default", "The policy to be trained (samples best-of-N)")
    judge: str = role("default", "The reward's judge")


class SynthesizeCommand(DataCommand, SynthesisSettings):
    """`rapo-echo data synthesize`: three-agent dialogues for the SFT warm start (sft.jsonl)."""

    roles: ClassVar = ("companion", "user", "director")
    companion: str = role("default", "The AI companion (the replies the SFT data teaches)")
    user: str = role("default", "Invents each person's profile and plays them")
    director: str = role("user", "Decides every few exchanges: continue, switch topic, or end")


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
    for name, section, run in (
        ("critique-rewrite", CritiqueRewriteCommand, run_critique_rewrite),
        ("references", ReferencesCommand, run_references),
        ("hard-prompts", HardPromptsCommand, run_hard_prompts),
        ("synthesize", SynthesizeCommand, run_synthesize),
    ):
        what = (section.__doc__ or "").split(": ", 1)[-1].strip().rstrip(".")  # the docstring says it
        p = sub.add_parser(name, help=what, description=what)
        add_flags(p, section)
        p.set_defaults(func=run)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


# ---------------------------------------------------------------------------- running
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
    """One engine per role; roles with the same spec share one, named by them (``writer+judge:hf``)."""
    from rapo_echo.engines import engines_for_roles

    return engines_for_roles(_resolve_specs(specs), **kw)


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


def _run(cmd: DataCommand, command: str, protocol: dict, build: Callable) -> int:
    """Load the contexts, check ``--output`` (both before any model loads), load the engines, run."""
    from rapo_echo.benchmarks.runner import check_output
    from rapo_echo.datagen.contexts import load_contexts
    from rapo_echo.datagen.runner import WHAT, data_config, empty_note, run_pipeline
    from rapo_echo.rundir import check_writable

    contexts = load_contexts(cmd.data, cmd.format, cmd.limit)
    specs = {r: getattr(cmd, r) for r in cmd.roles}
    models = _resolve_specs(specs)
    _, settings = type(cmd).__bases__
    recorded = cmd.model_dump(include=set(settings.model_fields))
    config = data_config(command, models, cmd.data, cmd.format, recorded, protocol)
    check_output(check_writable(cmd.output), config, WHAT)
    engines = load_engines(specs, dtype=cmd.dtype, device=cmd.device)
    warn_weak_roles(engines)
    pipeline = build(engines, contexts)
    summary = run_pipeline(
        pipeline,
        contexts,
        cmd.output,
        config,
        batch_size=cmd.batch_size,
        progress=cmd.progress,
        timeout_s=None if cmd.timeout_minutes is None else cmd.timeout_minutes * 60,
    )
    print(json.dumps(summary, indent=2))
    print(f"dataset: {cmd.output}/{pipeline.dataset_file}  records: {cmd.output}/results.jsonl")
    note = empty_note(pipeline, summary)
    if note:
        print(note)
    if not summary["complete"]:
        failed = f"{summary['n_failed']} contexts failed"
        why = f"stopped early ({summary['stopped']})" if summary["stopped"] else failed
        print(f"incomplete: {why}; run the same command again to resume")
        return 1
    return 0


def run_critique_rewrite(args: argparse.Namespace) -> int:
    from rapo_echo.datagen.critique_rewrite import CritiqueRewrite, protocol
    from rapo_echo.datagen.screening import Constitution

    cmd = section_from_args(CritiqueRewriteCommand, args)
    constitution = Constitution.from_file(cmd.constitution) if cmd.constitution else Constitution()
    return _run(
        cmd,
        "critique-rewrite",
        protocol(constitution),
        lambda e, _: CritiqueRewrite(e["writer"], e["judge"], e["rewriter"], cmd, constitution),
    )


def run_references(args: argparse.Namespace) -> int:
    from rapo_echo.datagen.reference_replies import References, protocol

    cmd = section_from_args(ReferencesCommand, args)
    return _run(cmd, "references", protocol(), lambda e, _: References(e["writer"], e["judge"], cmd))


def run_hard_prompts(args: argparse.Namespace) -> int:
    from rapo_echo.datagen.hard_prompts import HardPrompts, protocol

    cmd = section_from_args(HardPromptsCommand, args)
    return _run(cmd, "hard-prompts", protocol(), lambda e, _: HardPrompts(e["policy"], e["judge"], cmd))


def run_synthesize(args: argparse.Namespace) -> int:
    from rapo_echo.datagen.synthesis import Synthesis, protocol

    cmd = section_from_args(SynthesizeCommand, args)
    return _run(
        cmd,
        "synthesize",
        protocol(),
        lambda e, contexts: Synthesis(
            e["companion"], e["user"], e["director"], cmd, {sc.id: i for i, sc in enumerate(contexts)}
        ),
    )
