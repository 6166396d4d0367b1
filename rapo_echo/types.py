"""Value types that flow between engines, simulators, judges, rewards and the trainer."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from rapo_echo.structured import AnswerFormat


class Message(TypedDict):
    """One chat message: ``{"role": "system" | "user" | "assistant", "content": str}``."""

    role: str
    content: str


Conversation = list[Message]


def msg(role: str, content: str) -> Message:
    """Build a :class:`Message`."""
    return {"role": role, "content": content}


def check_temperature(value: float, name: str = "temperature") -> None:
    """ValueError naming ``name`` unless ``value`` is a finite number >= 0 (NaN and infinity make every
    sampled probability NaN or one-hot; a negative one is no temperature)."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class SamplingParams:
    """How an engine samples. ``temperature == 0`` means greedy decoding.

    ``n`` replies are drawn per prompt; engines that can share the prompt's prefill across the
    ``n`` samples do so. ``stop`` strings end a reply (the text excludes them, the token ids keep
    the tokens that were sampled). ``answer_format`` (simulators and judges): the shape the reply must
    take; an engine that can constrain decoding produces only text of that shape
    (:mod:`rapo_echo.structured`). ``top_logprobs`` asks engines that can (the ``openai`` engine) for the
    most likely tokens at each sampled position (:attr:`Generation.top_logprobs`).
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    answer_format: AnswerFormat | None = None
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        check_temperature(self.temperature)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.n < 1:
            raise ValueError(f"top_k must be >= 0 and n >= 1, got top_k={self.top_k}, n={self.n}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")


FAILED = "error"  # Generation.finish_reason of a remote request that failed for good


@dataclass
class Generation:
    """One sampled reply.

    ``token_ids`` are the sampled completion tokens (EOS / stop-string tokens included when they
    were sampled) and ``logprobs`` their log-probabilities under the temperature-scaled, untruncated
    distribution, the same quantity the trainer computes. Engines that cannot give them leave
    ``token_ids`` empty and ``logprobs`` None. ``top_logprobs`` (when asked with
    :attr:`SamplingParams.top_logprobs` and the engine gives them): per sampled token its text and the most
    likely tokens at that position with their log-probs. ``finish_reason`` ``"error"``: a remote request that
    failed for good (the text is empty; the item is invalid).
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    prompt_ids: list[int] | None = None
    # "stop" (EOS or stop string), "length", "error" (a failed request) or "grammar_error" (see error)
    finish_reason: str = "stop"
    error: str | None = None  # why the engine could not finish the reply as asked (a grammar that gave up)
    top_logprobs: list[tuple[str, list[tuple[str, float]]]] | None = None


def last_user_message(messages: Sequence[Mapping[str, Any]]) -> str:
    """The content of the last user message of a conversation, or '' when there is none."""
    for m in reversed(messages):
        if m.get("role") == "user":
            return str(m.get("content", ""))
    return ""


@dataclass
class Scenario:
    """One dialogue context to reply to, plus what the policy must not see.

    ``messages`` is the visible dialogue (the policy writes the next assistant turn);
    ``profile`` is the hidden user profile (persona, emotion, problem, situation, need) that only
    simulators and judges read; ``reference`` is an optional real reply (e.g. the ESConv supporter
    turn); ``meta`` carries anything else (source file, dialogue id, turn index).
    """

    id: str
    messages: Conversation
    profile: dict[str, Any] = field(default_factory=dict)
    reference: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def last_user_message(self) -> str:
        """The content of the last user message, or '' when there is none."""
        return last_user_message(self.messages)

    def assistant_replies(self) -> list[str]:
        """The contents of the assistant (supporter) turns so far, oldest first."""
        return [str(m.get("content", "")) for m in self.messages if m.get("role") == "assistant"]


@dataclass
class Sample:
    """One policy reply as it flows through rollout, rewards and the loss."""

    scenario: Scenario
    group: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None
    text: str
    finish_reason: str = "stop"
    rewards: dict[str, float | None] = field(default_factory=dict)
    reward: float | None = None
    critique: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        """False when a reward could not score this sample; it is then masked out of the loss."""
        return self.reward is not None


@dataclass
class ValidationResult:
    """A held-out validation of the policy (:meth:`Algorithm.validate`): ``metrics`` (``val/...``, the
    run's validation key among them) and ``scores``, the per-context score of the key, one per held-out
    scenario in order (None where the reply could not be scored); validation pairs them with the best's.
    ``rules``: where the simulated person has rules, for each negative rule fired at least once, per
    scenario the share of its replies that fired it (None where it had no reply); the ``rule_floor``
    check pairs them. ``replies``: per scenario the policy's greedy replies, in order (the
    ``variety_floor`` check compares their Distinct-2)."""

    metrics: dict[str, float]
    scores: list[float | None]
    rules: dict[str, list[float | None]] = field(default_factory=dict)
    replies: list[list[str]] = field(default_factory=list)


def group_slices(groups: Sequence[int]) -> list[slice]:
    """Contiguous slices of equal group ids, in order (samples of a group are stored together)."""
    out: list[slice] = []
    start = 0
    for i in range(1, len(groups) + 1):
        if i == len(groups) or groups[i] != groups[start]:
            out.append(slice(start, i))
            start = i
    return out
