"""What every generative judge needs: label-token probabilities when the engine exposes log-probs,
parsed text otherwise, with retries; a reply that stays unparseable is ``None`` (invalid), never 0."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

from rapo_echo.engines.base import ChatEngine, normalize_choices
from rapo_echo.errors import CapabilityError
from rapo_echo.types import Conversation, SamplingParams

T = TypeVar("T")
log = logging.getLogger(__name__)
RETRY_TEMPERATURE = 0.7  # retries sample at least this hot: a greedy retry would repeat the failure


@dataclass
class Parsed(Generic[T]):
    """A judge's parsed decision (``value`` None when invalid) with the raw text and attempts used."""

    value: T | None
    raw: str
    attempts: int


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


def label_probabilities(
    engine: ChatEngine, prompts: Sequence[Conversation], labels: Sequence[str]
) -> list[dict[str, float]]:
    """Normalised probability of each label as the judge's next token(s), one dict per prompt (raises
    :class:`CapabilityError` when no label has any probability; see :func:`read_label_probabilities`)."""
    return [normalize_choices(lp) for lp in engine.choice_logprobs(prompts, labels)]


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


_MARKUP = re.compile(r"[*_#>`\s]+")
_NUMBER = r"([+-]?[0-9]{1,6})(?:\s*(?:/|out\s+of)\s*([0-9]{1,6}))?\.?"


def parse_answer_line(text: str, key: str, lo: int, hi: int) -> int | None:
    """The integer of the answer line ``KEY: N`` in a judge's reply, or None.

    Only a line that holds nothing but the answer counts (any case, markdown allowed, ``:`` / ``=`` or no
    sign, an optional ``/hi`` or ``out of hi`` and a final period), so an echoed instruction ("Score: 1
    (worst) to 5") or a quote inside reasoning ("the reply says Score: 5") never parses. A reply that is a
    bare integer is its own answer line. Several answer lines must agree; N must lie in ``[lo, hi]``.
    """
    name = _MARKUP.sub(" ", key).strip()
    keyed = re.compile(rf"{re.escape(name)}\s*[:=]?\s*{_NUMBER}", re.I)
    lines = [_MARKUP.sub(" ", line).strip() for line in str(text).splitlines()]
    lines = [line for line in lines if line]
    matches = [keyed.fullmatch(line) for line in lines]
    if len(lines) == 1 and matches[0] is None:
        matches = [re.fullmatch(_NUMBER, lines[0])]
    found = {int(m.group(1)) for m in matches if m is not None and m.group(2) in (None, str(hi))}
    if len(found) != 1:
        return None
    (value,) = found
    return value if lo <= value <= hi else None


def retry_sampling(params: SamplingParams, attempt: int) -> SamplingParams:
    """The sampling parameters of retry ``attempt`` (1, 2, ...) after a first try with ``params``: at least
    :data:`RETRY_TEMPERATURE` and, when ``params`` has a seed, seed + ``attempt``, so that a retry can differ
    from a greedy (or seeded) failure and reruns stay reproducible."""
    seed = None if params.seed is None else params.seed + attempt
    return replace(params, temperature=max(params.temperature, RETRY_TEMPERATURE), seed=seed)


def generate_parsed(
    engine: ChatEngine,
    prompts: Sequence[Conversation],
    parse: Callable[[str], T | None] | Sequence[Callable[[str], T | None]],
    params: SamplingParams,
    *,
    max_retries: int = 2,
    retry_params: SamplingParams | None = None,
    role: str = "judge",
) -> list[Parsed[T]]:
    """Generate one reply per prompt and parse it; prompts whose reply does not parse are asked
    again together (one batched call per attempt), up to ``max_retries`` more times. Retries sample
    (:func:`retry_sampling`: a greedy retry would repeat the failure) unless ``retry_params`` is given.
    ``parse`` is one function for every reply or a sequence with one function per prompt; a reply that
    is not a string counts as unparseable. The warning about replies that stay unparseable names the
    ``role`` (judge / simulator) and the engine with its endpoint."""
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
            text = gens[0].text if gens and isinstance(gens[0].text, str) else ""
            value = parsers[i](text)
            results[i] = Parsed(value, text, attempt + 1)
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
