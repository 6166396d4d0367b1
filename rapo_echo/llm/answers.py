"""Answers read from a model's text, for judges, simulators and annotators alike: the log-prob mode
switch, generation under a declared answer format with retries, the one-line field format; a reply that
stays unparseable is ``None`` (invalid), never 0. Label probabilities (the log-prob path) are in
:mod:`rapo_echo.llm.labels`."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

from rapo_echo.engines.base import ChatEngine, format_enforcement
from rapo_echo.errors import CapabilityError
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.strength import warn_if_weak
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import FAILED, Conversation, SamplingParams

T = TypeVar("T")
log = logging.getLogger(__name__)
RETRY_TEMPERATURE = 0.7  # retries sample at least this hot: a greedy retry would repeat the failure


@dataclass
class Parsed(Generic[T]):
    """A judge's parsed decision (``value`` None when invalid) with the raw text and attempts used;
    ``failed``: the engine's request failed for good (a remote failure, not an unparseable answer);
    ``top_logprobs``: the accepted reply's per-token top lists, when asked for and given
    (:attr:`~rapo_echo.types.Generation.top_logprobs`)."""

    value: T | None
    raw: str
    attempts: int
    failed: bool = False
    top_logprobs: list[tuple[str, list[tuple[str, float]]]] | None = None


LOGPROB_MODES = ("auto", "always", "never")


def check_logprobs_mode(owner: str, mode: str) -> str:
    """``mode`` if it is one of :data:`LOGPROB_MODES`, else a ``ValueError`` naming ``owner``."""
    if mode not in LOGPROB_MODES:
        raise ValueError(f"{owner}: use_logprobs must be auto|always|never, got {mode!r}")
    return mode


def wants_logprobs(engine: ChatEngine, mode: str) -> bool:
    """Whether to read label probabilities: ``always`` / ``never`` / ``auto`` (when the engine can)."""
    if mode == "never":
        return False
    if mode == "always":
        if not engine.supports_logprobs:
            raise CapabilityError(f"engine {engine.name!r} exposes no log-probs but use_logprobs is 'always'")
        return True
    return bool(engine.supports_logprobs)


def describe_engine(engine: ChatEngine) -> str:
    """The engine's name and, for a remote one, its endpoint (credentials removed), for warnings."""
    name = f"{getattr(engine, 'name', type(engine).__name__)!r}"
    url = getattr(engine, "base_url", None)
    if not isinstance(url, str):
        return name
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return f"{name} at {urlunsplit((parts.scheme, netloc, parts.path, '', ''))}"


def answer_words(text: str, fence: Fence | None, engine: ChatEngine, fmt: AnswerFormat | None = None) -> str:
    """The part of a judge's text its answer is read from. An engine that enforces answer formats
    (constrained decoding, a server's structured output, a checked script) wrote only the answer, so a
    text that is exactly one answer of ``fmt`` is read whole; otherwise the judge's own words
    (``fence``'s blocks, copies of fenced text and quotes removed,
    :meth:`~rapo_echo.llm.fencing.Fence.own_words`), from which the format reads the last well-formed
    answer."""
    if fence is None:
        return text
    if format_enforcement(engine) != "none" and (fmt is None or fmt.problem(text) is None):
        return text
    return fence.own_words(text, copies=True)


# one bounded line of free text; the closing newline is allowed so that the call's stop string ends it
FIELD_LINE = AnswerFormat.regex(r"[^\n]{1,400}\n?", name="field_line")


def field_line(text: str) -> str | None:
    """The line of a field continuation (e.g. after ``Cognitive need:``) read by :data:`FIELD_LINE`,
    whitespace normalised; None when it is not one line or has fewer than two words with letters
    (empty, punctuation, a lone label)."""
    value = FIELD_LINE.parse(text)
    if value is None:
        return None
    line = " ".join(value.split()).strip(" \"'*`")
    words = [w for w in line.split() if re.search(r"[A-Za-z]", w)]
    return line if len(words) >= 2 else None


def retry_sampling(params: SamplingParams, attempt: int) -> SamplingParams:
    """The sampling parameters of retry ``attempt`` (1, 2, ...) after a first try with ``params``: at least
    :data:`RETRY_TEMPERATURE` and, when ``params`` has a seed, seed + ``attempt``, so that a retry can differ
    from a greedy (or seeded) failure and reruns stay reproducible."""
    seed = None if params.seed is None else params.seed + attempt
    return replace(params, temperature=max(params.temperature, RETRY_TEMPERATURE), seed=seed)


def generate_parsed(
    engine: ChatEngine,
    prompts: Sequence[Conversation],
    parse: Callable[[str], T | None] | Sequence[Callable[[str], T | None]] | None,
    params: SamplingParams,
    *,
    max_retries: int = 2,
    retry_params: SamplingParams | None = None,
    role: str = "judge",
    answer_format: AnswerFormat | None = None,
) -> list[Parsed[T]]:
    """Generate one reply per prompt and parse it; prompts whose reply does not parse (or is not a string)
    are asked again together, up to ``max_retries`` more times, sampling (:func:`retry_sampling`: a greedy
    retry would repeat the failure) unless ``retry_params`` is given. ``parse``: one function, one per
    prompt, or None (``answer_format``'s own parser). ``answer_format`` travels in the sampling parameters
    of every attempt, so an engine that can constrain decoding produces only that shape. A request that
    failed for good (``finish_reason`` ``"error"``) is invalid at once, with ``failed`` set. Warnings name
    the ``role`` and the engine; a model too small for the role is logged once
    (:func:`~rapo_echo.llm.strength.warn_if_weak`)."""
    warn_if_weak(engine, role)
    if answer_format is not None:
        params = replace(params, answer_format=answer_format)
        retry_params = None if retry_params is None else replace(retry_params, answer_format=answer_format)
    if parse is None:
        if answer_format is None:
            raise ValueError("generate_parsed: give a parse function or an answer_format")
        parse = answer_format.parse
    parsers = [parse] * len(prompts) if callable(parse) else list(parse)
    if len(parsers) != len(prompts):
        raise ValueError(f"generate_parsed: {len(parsers)} parse functions for {len(prompts)} prompts")
    results: list[Parsed[T]] = [Parsed(None, "", 0) for _ in prompts]
    pending = list(range(len(prompts)))
    for attempt in range(max_retries + 1):
        if not pending:
            break
        use = params if attempt == 0 else retry_params or retry_sampling(params, attempt)
        replies = engine.generate([prompts[i] for i in pending], use)
        still = []
        for i, gens in zip(pending, replies):
            if gens and gens[0].finish_reason == FAILED:
                results[i] = Parsed(None, "", attempt + 1, failed=True)
                continue
            text = gens[0].text if gens and isinstance(gens[0].text, str) else ""
            value = parsers[i](text)
            results[i] = Parsed(value, text, attempt + 1, top_logprobs=gens[0].top_logprobs if gens else None)
            if value is None:
                still.append(i)
        pending = still
    if pending:
        log.warning(
            "%s engine %s: %d of %d replies stayed unparseable after %d attempts; they are invalid",
            role,
            describe_engine(engine),
            len(pending),
            len(prompts),
            max_retries + 1,
        )
    return results


def generate_field_lines(
    engine: ChatEngine, prompts: Sequence[Conversation], max_new_tokens: int, max_retries: int, role: str
) -> list[Parsed[str]]:
    """One field line per prompt (a prompt that continues ``<Field>:``): greedy, then sampled retries at
    temperature 0.7, each up to the first newline, under :data:`FIELD_LINE` and read by :func:`field_line`."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=("\n",))
    retry = replace(params, temperature=0.7)
    return generate_parsed(
        engine,
        prompts,
        field_line,
        params,
        max_retries=max_retries,
        retry_params=retry,
        role=role,
        answer_format=FIELD_LINE,
    )
