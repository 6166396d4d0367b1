"""What every benchmark shares: the engines of its roles, the run settings, the benchmark protocol and
the record it writes per case."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rapo_echo.config import DEFAULT_SYSTEM_PROMPT
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


@dataclass(frozen=True)
class EvalSettings:
    """How an evaluation samples and when episodes end. ``max_turns`` None = the benchmark's own default
    (ESConv 8, SOTOPIA 20). Temperature 0 is greedy decoding (the PPDPP test protocol)."""

    max_turns: int | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    simulator_temperature: float = 0.0
    judge_max_new_tokens: int = 256
    simulator_max_new_tokens: int | None = None  # None: the benchmark's own (SAGE 512, else max_new_tokens)
    judge_retries: int = 2
    judge_logprobs: str = "auto"  # auto | always | never (see rapo_echo.llm.answers.wants_logprobs)
    seed: int | None = 0
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    sage_system_prompt: str = "sage"  # SAGE: sage (SAGE's kind of prompt) | ours (``system_prompt``)
    batch_size: int | None = None  # cases run together; None: auto (rapo_echo.benchmarks.runner.batch_size)
    subset: str = "all"  # SOTOPIA: all | hard
    sotopia_scorer: str = "ours"  # SOTOPIA: ours (the judge role) | sotopia (the official evaluator)
    sotopia_model: str = "gpt-4o"  # SOTOPIA with the official scorer: its evaluator model (litellm name)
    emotion_readout: str = "auto"  # SAGE: the user's emotion change from text | logprobs | auto
    sage_reply: str = "plain"  # SAGE: the user's message alone (plain) or SAGE's reasoning fields (fields)
    epm: dict[str, Any] = field(default_factory=dict)  # EPM: EpmConfig overrides (benchmarks/epm/vectors.py)
    # -- how far a figure can be trusted (docs/reading-results.md); each field's flag: benchmarks/cli.py
    # add_measure_flags. repeats: every case this many times, each repeat with its own seeds
    # (repeat_seed below); judge_recheck: each judged case asks its judge its last
    # question once more, with a fresh seed and prompt marker (the judge's self-agreement); state_probe:
    # SAGE asks the policy each turn how the user feels (emotional state tracking; auto = with the hard
    # profiles); profiles: SAGE's bundled profile set.
    repeats: int = 1
    judge_recheck: bool = True
    state_probe: str = "auto"  # auto | on | off
    profiles: str = "standard"  # standard | hard

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.state_probe not in ("auto", "on", "off"):
            raise ValueError(f"state_probe must be auto, on or off, got {self.state_probe!r}")
        if self.profiles not in ("standard", "hard"):
            raise ValueError(f"profiles must be standard or hard, got {self.profiles!r}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.simulator_max_new_tokens is not None and self.simulator_max_new_tokens < 1:
            raise ValueError(f"simulator_max_new_tokens must be >= 1, got {self.simulator_max_new_tokens}")
        if (self.batch_size is not None and self.batch_size < 1) or self.judge_retries < 0:
            raise ValueError("batch_size must be >= 1 and judge_retries >= 0")
        if self.judge_logprobs not in ("auto", "always", "never"):
            raise ValueError(f"judge_logprobs must be auto, always or never, got {self.judge_logprobs!r}")
        if self.sage_system_prompt not in ("sage", "ours"):
            raise ValueError(f"sage_system_prompt must be 'sage' or 'ours', got {self.sage_system_prompt!r}")
        if self.subset not in ("all", "hard"):
            raise ValueError(f"subset must be 'all' or 'hard', got {self.subset!r}")
        if self.sotopia_scorer not in ("ours", "sotopia"):
            raise ValueError(f"sotopia_scorer must be 'ours' or 'sotopia', got {self.sotopia_scorer!r}")
        if self.emotion_readout not in ("auto", "text", "logprobs"):
            raise ValueError(f"emotion_readout must be auto, text or logprobs, got {self.emotion_readout!r}")
        if self.sage_reply not in ("plain", "fields"):
            raise ValueError(f"sage_reply must be 'plain' or 'fields', got {self.sage_reply!r}")

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
