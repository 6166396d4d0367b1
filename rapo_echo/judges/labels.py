"""Benchmark judges on top of :mod:`rapo_echo.judges.base`: label verdicts read from label-token
probabilities when the engine exposes log-probs (else parsed from text), and text verdicts parsed with
retries. A reply that stays unparseable gives ``None`` (the case is then invalid), never a default score.

Retries matter only if a second attempt can differ: the first attempt uses the given (usually greedy)
parameters, every retry samples (:func:`rapo_echo.judges.base.retry_sampling`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from rapo_echo.engines.base import ChatEngine, normalize_choices
from rapo_echo.errors import CapabilityError
from rapo_echo.judges.base import Parsed, generate_parsed, wants_logprobs
from rapo_echo.types import Conversation, SamplingParams

T = TypeVar("T")


@dataclass
class LabelVerdict:
    """A judge's choice among labels: ``value`` is the expected label value under ``probs`` (log-prob
    mode) or the parsed label's value (text mode); None when invalid."""

    value: float | None
    label: str | None
    probs: dict[str, float] | None
    raw: str
    attempts: int
    mode: str  # "logprobs" or "text"


def parse_with_retries(
    engine: ChatEngine,
    prompts: Sequence[Conversation],
    parse: Callable[[str], T | None],
    params: SamplingParams,
    retries: int,
) -> list[Parsed[T]]:
    """:func:`~rapo_echo.judges.base.generate_parsed` with ``retries`` (the benchmarks' call form)."""
    return generate_parsed(engine, prompts, parse, params, max_retries=retries)


def expected_value(probs: Mapping[str, float], values: Mapping[str, float]) -> float:
    """Sum over labels of probability x value."""
    return sum(p * values[label] for label, p in probs.items())


def judge_labels(
    engine: ChatEngine,
    prompts: Sequence[Conversation],
    values: Mapping[str, float],
    parse_label: Callable[[str], str | None] | Sequence[Callable[[str], str | None]],
    params: SamplingParams,
    *,
    retries: int = 2,
    logprobs: str = "auto",
) -> list[LabelVerdict]:
    """Each prompt's verdict among ``values``' labels. With log-probs: one ``choice_logprobs`` call, the
    label probabilities renormalised over the labels; a row where every label has probability 0 (e.g. none
    is in a server's top log-probs) falls back to text. Text: generate, ``parse_label`` (one function, or
    one per prompt), retry."""
    labels = list(values)
    out: list[LabelVerdict | None] = [None] * len(prompts)
    text_rows = list(range(len(prompts)))
    if prompts and wants_logprobs(engine, logprobs):
        text_rows = []
        for i, row in enumerate(engine.choice_logprobs(prompts, labels)):
            try:
                probs = normalize_choices(row)
            except CapabilityError:
                text_rows.append(i)
                continue
            best = max(probs, key=probs.__getitem__)
            out[i] = LabelVerdict(expected_value(probs, values), best, probs, "", 1, "logprobs")
    if text_rows:
        parsers = [parse_label] * len(prompts) if callable(parse_label) else list(parse_label)
        parsed = generate_parsed(
            engine,
            [prompts[i] for i in text_rows],
            [parsers[i] for i in text_rows],
            params,
            max_retries=retries,
        )
        for i, p in zip(text_rows, parsed):
            value = None if p.value is None else values[p.value]
            out[i] = LabelVerdict(value, p.value, None, p.raw, p.attempts, "text")
    return [v for v in out if v is not None]
