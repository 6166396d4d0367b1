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
    """ValueError naming ``name`` unless ``value`` is a finite number >= 0."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class SamplingParams:
    """How an engine samples (``temperature == 0``: greedy). ``stop`` strings end a reply (the text
    excludes them, the token ids keep them); ``answer_format``: the shape a simulator's or judge's reply
    must take (:mod:`rapo_echo.structured`); ``top_logprobs``: the most likely tokens at each position,
    where the engine gives them."""

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
    """One sampled reply. ``logprobs`` are those of ``token_ids`` (EOS / stop tokens included when
    sampled) under the temperature-scaled, untruncated distribution, as the trainer computes them; an
    engine that cannot give them leaves ``token_ids`` empty and ``logprobs`` None."""

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
    """One dialogue context to reply to (``messages``; the policy writes the next assistant turn), plus
    the hidden ``profile`` only simulators and judges read, an optional real ``reference`` reply and any
    other ``meta`` (source file, dialogue id, turn index)."""

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
    """A held-out validation of the policy (:meth:`Algorithm.validate`), per held-out scenario in order:
    ``scores`` of the validation key (None: not scored), ``rules`` (per negative rule fired, the share of
    replies that fired it) and the greedy ``replies``; the checks pair them with the best's."""

    metrics: dict[str, float]
    scores: list[float | None]
    rules: dict[str, list[float | None]] = field(default_factory=dict)
    replies: list[list[str]] = field(default_factory=list)

