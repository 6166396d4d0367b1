"""What every benchmark shares: the engines of its roles, the run settings, the benchmark protocol and
the record it writes per case."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol

from pydantic import Field

from rapo_echo.config import DEFAULT_SYSTEM_PROMPT, Flag, LogprobMode, OptionalText, Strict
from rapo_echo.engines.base import ChatEngine
from rapo_echo.types import SamplingParams

Record = dict[str, Any]
Emit = Callable[[Record], None]


@dataclass
class Roles:
    """The engines a benchmark talks to. ``simulator`` plays the user (ESConv seeker, SOTOPIA partner),
    ``judge`` scores (PPDPP critic, SOTOPIA evaluator); a benchmark that needs no such role gets None."""

    policy: ChatEngine
    simulator: ChatEngine | None = None
    judge: ChatEngine | None = None


class EvalSettings(Strict):
    """How an evaluation samples and when episodes end (recorded in the output's ``config.json``).
    Temperature 0 is greedy decoding (the PPDPP test protocol)."""

    max_turns: int | None = Field(
        None, ge=1, description="Episode length limit (unset: esconv 8, sotopia 20, epm 45, sage 10 replies)."
    )
    max_new_tokens: int = Field(128, ge=1, description="Reply length limit of the policy and the simulator.")
    temperature: float = Field(0.0, ge=0.0, description="The policy's sampling temperature (0: greedy).")
    simulator_temperature: float = Field(0.0, ge=0.0, description="The simulator's sampling temperature.")
    judge_max_new_tokens: int = Field(256, ge=1, description="Reply length limit of the judge.")
    simulator_max_new_tokens: int | None = Field(
        None, ge=1, description="The simulator's reply length limit (unset: sage 512, else `max_new_tokens`)."
    )
    judge_retries: int = Field(
        2, ge=0, le=20, description="Retries of an unparseable judge or SAGE simulator reply."
    )
    judge_logprobs: LogprobMode = Field(
        "auto", description="Read label verdicts from log-probs (`auto`: when the judge engine has them)."
    )
    seed: int | None = Field(0, ge=0, description="Seed of the engines' sampling.")
    system_prompt: OptionalText = Field(
        DEFAULT_SYSTEM_PROMPT, description="The policy's system prompt (`''`: none)."
    )
    sage_system_prompt: Literal["sage", "ours"] = Field(
        "sage",
        description="sage: the policy's system prompt is SAGE's kind (comparable with SAGE's leaderboard) or "
        "`ours` (`system_prompt`).",
    )
    batch_size: int | None = Field(
        None,
        ge=1,
        description="Cases run together per batch (unset: every case at once, up to 512, when a role is an "
        "http(s) endpoint; else 8).",
    )
    subset: Literal["all", "hard"] = Field("all", description="sotopia: all scenarios or the hard ones.")
    sotopia_scorer: Annotated[Literal["ours", "sotopia"], Flag("--scorer")] = Field(
        "ours",
        description="sotopia: our evaluator on the judge engine, or SOTOPIA's own (needs pip install "
        "'rapo-echo[sotopia]'; comparable with published figures with a GPT-4-class model).",
    )
    sotopia_model: str = Field(
        "gpt-4o",
        description="sotopia with SOTOPIA's scorer: its evaluator model in sotopia's naming (gpt-4o, or "
        "custom/<model>@<base_url> for an OpenAI-compatible server).",
    )
    emotion_readout: Literal["auto", "text", "logprobs"] = Field(
        "auto",
        description="sage: the user's emotion change from label probabilities (`logprobs`; one forward, "
        "usable with small simulators), from the analysis's stated number (`text`: SAGE's protocol), or "
        "`auto` (logprobs when the simulator engine has them).",
    )
    sage_reply: Literal["plain", "fields"] = Field(
        "plain",
        description="sage: the simulated user writes its message alone (`plain`) or with SAGE's reasoning "
        "fields first (`fields`: SAGE's protocol, needs a capable simulator).",
    )
    epm: Annotated[dict[str, Any], Flag(metavar="KEY=VALUE")] = Field(
        default_factory=dict,
        description="epm: EPM constants to override (benchmarks/epm/vectors.py EpmConfig), e.g. `--epm "
        "alpha=0.05`; repeatable.",
    )
    # how far a figure can be trusted (docs/reading-results.md)
    repeats: int = Field(
        1,
        ge=1,
        description="Every case this many times, each repeat with its own simulator, judge and policy seeds "
        "(seed + 1000 k); the summary gives each figure's mean, interval over cases and spread across "
        "repeats (a larger N resumes a finished folder).",
    )
    judge_recheck: bool = Field(
        True,
        description="Each judged case asks its judge (SAGE: the simulated user's emotion reading) its last "
        "question once more with a fresh seed and prompt marker: the judge's self-agreement.",
    )
    state_probe: Literal["auto", "on", "off"] = Field(
        "auto",
        description="sage: ask the policy each turn how the user feels (0-100) beside the dialogue, and "
        "score its emotional state tracking against the simulator's hidden emotion (`auto`: with "
        "`profiles` hard).",
    )
    profiles: Literal["standard", "hard"] = Field(
        "standard",
        description="sage without `data`: our standard profiles, or our hard-to-help seekers (withdrawn, "
        "hostile, contradictory, testing, deflecting with humour, shifting goals).",
    )

    def policy_params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=self.seed
        )

    def simulator_params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.simulator_max_new_tokens or self.max_new_tokens,
            temperature=self.simulator_temperature,
            seed=self.seed,
        )

    def judge_params(self) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.judge_max_new_tokens, temperature=0.0, seed=self.seed)


@dataclass
class Case:
    """One unit of evaluation, identified by a stable ``id`` (what resume skips on)."""

    id: str
    data: Any
    meta: dict[str, Any] = field(default_factory=dict)


REPEAT_SEED_STRIDE = 1000  # repeat k runs with seed + k * this (far apart: a role may use seed + 1 too)


def repeat_seed(seed: int | None, repeat: int) -> int | None:
    """The seed of repeat ``repeat`` (``--repeats``): the run's own for the first (0), ``seed + repeat *``
    :data:`REPEAT_SEED_STRIDE` after it (None stays None: unseeded)."""
    return seed if seed is None or repeat == 0 else seed + repeat * REPEAT_SEED_STRIDE


def case_key(case: Case) -> str:
    """The case's own id, the same in every repeat (what its prompt markers are drawn from, so that a
    repeat is the case rerun with the repeat's seed)."""
    return str(case.meta.get("case", case.id))


class Benchmark(Protocol):
    """A benchmark: loads its cases, runs a batch of them in lockstep, and summarises the records.

    ``run_batch`` must make one engine call per role per turn covering every active case, and call
    ``emit`` with a record as soon as a case is finished. A record is a JSON-able dict with ``id``,
    ``valid`` (False when a judge stayed unparseable), ``metrics`` (numbers), ``transcript`` (list of
    ``{role, content}``) and ``info``. ``summarize`` gets every record written so far.
    """

    name: str
    roles: tuple[str, ...]  # which of policy / simulator / judge it uses
    headline: tuple[tuple[str, str], ...]  # (summary key, column label) for comparison tables

    def load_cases(self, data: str | None, settings: EvalSettings) -> list[Case]: ...

    def run_batch(self, cases: Sequence[Case], roles: Roles, settings: EvalSettings, emit: Emit) -> None: ...

    def summarize(self, records: Sequence[Record]) -> dict[str, Any]: ...


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean, None for no values."""
    return sum(values) / len(values) if values else None


RECHECK_SEED_OFFSET = 7919  # a judge's recheck samples with its seed + this (a prime: no repeat's seed)


def recheck_params(params: SamplingParams) -> SamplingParams:
    """The sampling of a judge's recheck: the same, with another seed."""
    return dataclasses.replace(
        params, seed=None if params.seed is None else params.seed + RECHECK_SEED_OFFSET
    )


def recheck_entry(first: Mapping[str, Any], again: Mapping[str, Any], diffs: Sequence[float] = ()) -> Record:
    """A judge's answers to the same questions, asked twice (the second time with a fresh seed and prompt
    marker), as a record's ``info['judge_recheck']``: ``agree`` is the share of the questions (the keys of
    ``first``) answered alike the second time (an unreadable second answer disagrees), ``abs_diff`` the
    mean of ``diffs``, the absolute differences of the numbers the answers give (None without any)."""
    keys = list(first)
    same = sum(again.get(k) is not None and again.get(k) == first[k] for k in keys)
    return {
        "agree": same / len(keys) if keys else None,
        "abs_diff": sum(diffs) / len(diffs) if diffs else None,
        "first": dict(first),
        "again": dict(again),
    }


def make_record(
    case: Case,
    *,
    valid: bool,
    metrics: dict[str, Any],
    transcript: list[dict[str, str]],
    info: dict[str, Any],
) -> Record:
    """A case's JSONL record in the common shape."""
    return {"id": case.id, "valid": valid, "metrics": metrics, "transcript": transcript, "info": info}
