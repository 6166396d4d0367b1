"""Label probabilities: a model's choice among labels read from the label tokens' log-probs when the
engine exposes them (else parsed from text, with retries, :mod:`rapo_echo.llm.answers`). A reply that
stays unparseable, or a row of unusable log-probs, gives ``None`` (the case is then invalid), never a
default score.

Retries matter only if a second attempt can differ: the first attempt uses the given (usually greedy)
parameters, every retry samples (:func:`rapo_echo.llm.answers.retry_sampling`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rapo_echo.engines.base import ChatEngine, normalize_choices
from rapo_echo.errors import CapabilityError
from rapo_echo.llm.answers import describe_engine, generate_parsed, wants_logprobs
from rapo_echo.llm.strength import warn_if_weak
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, SamplingParams

log = logging.getLogger(__name__)


def label_probabilities(
    engine: ChatEngine, prompts: Sequence[Conversation], labels: Sequence[str]
) -> list[dict[str, float]]:
    """Normalised probability of each label as the judge's next token(s), one dict per prompt (raises
    :class:`CapabilityError` when no label has any probability; see :func:`read_label_probabilities`)."""
    return [normalize_choices(lp) for lp in engine.choice_logprobs(prompts, labels)]


def usable_probabilities(row: Mapping[str, float], labels: Sequence[str]) -> dict[str, float] | None:
    """``row``'s log-probs of ``labels`` renormalised into probabilities, or None when they cannot be
    used: a label missing, a NaN or +inf, or every label at probability 0 (none among a server's top
    log-probs)."""
    try:
        values = {label: float(row[label]) for label in labels}
    except (KeyError, TypeError, ValueError):
        return None
    if not values or any(math.isnan(v) or v == math.inf for v in values.values()):
        return None
    try:
        return normalize_choices(values)
    except CapabilityError:
        return None


def read_label_probabilities(
    engine: ChatEngine, prompts: Sequence[Conversation], labels: Sequence[str], *, role: str
) -> list[dict[str, float] | None]:
    """:func:`label_probabilities` that never raises on bad output: a prompt whose label log-probs are
    unusable (:func:`usable_probabilities`) gets None, to be marked invalid and counted by the caller,
    and one warning names the ``role`` (judge / simulator), the engine and its endpoint."""
    if not prompts:
        return []
    warn_if_weak(engine, role)
    rows = engine.choice_logprobs(prompts, labels)
    out = [usable_probabilities(row, labels) for row in rows]
    bad = sum(p is None for p in out)
    if bad:
        log.warning(
            "%s engine %s: %d of %d prompts gave no usable label probabilities (NaN, or no label among "
            "the top log-probs); those samples are invalid",
            role,
            describe_engine(engine),
            bad,
            len(prompts),
        )
    return out


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
    answer_format: AnswerFormat | None = None,
) -> list[LabelVerdict]:
    """Each prompt's verdict among ``values``' labels. With log-probs: one ``choice_logprobs`` call, the
    label probabilities renormalised over the labels; a row where every label has probability 0 (e.g. none
    is in a server's top log-probs) falls back to text; an empty row (the request failed for good) is
    invalid. Text: generate, ``parse_label`` (one function, or
    one per prompt), retry; ``answer_format`` declares the generated answer's shape to the engine
    (:func:`~rapo_echo.llm.answers.generate_parsed`)."""
    warn_if_weak(engine, "judge")
    labels = list(values)
    out: list[LabelVerdict | None] = [None] * len(prompts)
    text_rows = list(range(len(prompts)))
    if prompts and wants_logprobs(engine, logprobs):
        text_rows = []
        for i, row in enumerate(engine.choice_logprobs(prompts, labels)):
            if not row:  # the request failed for good: invalid, not asked again as text
                out[i] = LabelVerdict(None, None, None, "", 1, "logprobs")
                continue
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
            answer_format=answer_format,
        )
        for i, p in zip(text_rows, parsed):
            value = None if p.value is None else values[p.value]
            out[i] = LabelVerdict(value, p.value, None, p.raw, p.attempts, "text")
    return [v for v in out if v is not None]
