"""The answers of the Echo-N1 judges (humanlike, empathy, dominant need): a choice among labels, with or
without a short reasoning first.

* Log-prob mode: the label is read from the label tokens' probabilities right after ``Verdict:``; with
  ``reasoning``, one batched generation first writes a bounded ``Reasoning:`` line (:data:`REASONING_LINE`).
* Text mode: one JSON object, :func:`verdict_format`, declared to the engine and read from the judge's
  own words only (docs/judges.md: a quoted reply never lends the judge its label); what does not parse is
  retried, then invalid (``None``), never 0.

As log-prob options labels get a leading space (``" human"``), a single token in common BPE vocabularies.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from rapo_echo.engines.base import ChatEngine
from rapo_echo.llm.answers import answer_words, check_logprobs_mode, generate_parsed, wants_logprobs
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.judge_screen import DEFAULT_CONTEXT_POLICY, DEFAULT_POLICY, JudgeScreen
from rapo_echo.llm.labels import judge_labels
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, SamplingParams, msg

REASONING_PREFIX = "Reasoning:"
VERDICT_PREFIX = "Verdict:"
VERDICT_KEY = "verdict"
REASONING_KEY = "reasoning"
REASONING_CHARS = 300  # the JSON reasoning's maxLength: a small model otherwise never closes the string
# log-prob mode's one reasoning line; the closing newline is allowed so that the stop string ends it
REASONING_LINE = AnswerFormat.regex(r"[^\n]{0,600}\n?", name="reasoning_line")


@dataclass
class Verdict:
    """A judge's decision among labels. ``probs`` (label -> probability) in log-prob mode, None in text
    mode; ``label`` the most likely or the parsed label; None when invalid."""

    label: str | None
    probs: dict[str, float] | None
    reasoning: str
    raw: str
    attempts: int
    mode: str  # "logprobs" or "text"

    @property
    def valid(self) -> bool:
        return self.label is not None


def verdict_format(labels: Sequence[str], reasoning: bool) -> AnswerFormat:
    """The text-mode answer: a JSON object with ``verdict`` (one of ``labels``) and, with ``reasoning``,
    a bounded ``reasoning`` string before it."""
    props: dict[str, Any] = {}
    if reasoning:  # first: a constrained engine writes the properties in the schema's order
        props[REASONING_KEY] = {"type": "string", "maxLength": REASONING_CHARS}
    props[VERDICT_KEY] = {"type": "string", "enum": list(labels)}
    return AnswerFormat.json_object(props, name="verdict")


def answer_instruction(
    labels: Sequence[str], reasoning: bool, prefix: str = VERDICT_PREFIX, *, text_mode: bool = False
) -> str:
    """The sentence that asks for the answer: in log-prob mode the lines the label is read after (e.g.
    ``... 'Verdict: human' or 'Verdict: AI'``), in text mode the JSON object of :func:`verdict_format`."""
    if text_mode:
        options = ", ".join(f'"{label}"' for label in labels)
        shape = (
            f'{{"{REASONING_KEY}": "<one or two short sentences>", "{VERDICT_KEY}": "<label>"}}'
            if reasoning
            else f'{{"{VERDICT_KEY}": "<label>"}}'
        )
        return f"Answer with one JSON object and nothing else, {shape}, where the label is one of {options}."
    options = " or ".join(f"'{prefix} {label}'" for label in labels)
    if reasoning:
        return (
            f"Answer with two lines: first '{REASONING_PREFIX}' and one or two sentences of reasoning, "
            f"then {options}."
        )
    return f"Answer with one line: {options}."


def answer_text(label: str, reasoning: str | None, prefix: str = VERDICT_PREFIX) -> str:
    """The log-prob mode's answer lines a judge should write (the target of judge training)."""
    line = f"{prefix} {label}"
    if reasoning:
        return f"{REASONING_PREFIX} {' '.join(reasoning.split())}\n{line}"
    return line


def read_verdict(
    text: str, fmt: AnswerFormat, fence: Fence | None = None, engine: ChatEngine | None = None
) -> dict[str, Any] | None:
    """The text-mode answer object read by ``fmt`` (:func:`verdict_format`) from the judge's own words
    (``fence``'s blocks, copies and quotes removed) or, from an ``engine`` that enforced ``fmt``, from the
    whole answer (:func:`~rapo_echo.llm.answers.answer_words`); None when it has none."""
    if fence is None:
        own = text
    elif engine is None:
        own = fence.own_words(text, copies=True)
    else:
        own = answer_words(text, fence, engine, fmt)
    value = fmt.parse(own)
    return value if isinstance(value, dict) else None


def _options(labels: Sequence[str]) -> dict[str, str]:
    return {" " + label: label for label in labels}


def decide(
    engine: ChatEngine,
    prompts: Sequence[Conversation],
    labels: Sequence[str],
    *,
    reasoning: bool = False,
    use_logprobs: str = "auto",
    max_retries: int = 2,
    max_new_tokens: int = 64,
    prefix: str = VERDICT_PREFIX,
    fence: Fence | None = None,
) -> list[Verdict]:
    """One verdict per prompt among ``labels`` (see the module docstring); ``prefix`` opens the
    verdict line in log-prob mode; ``fence`` (the one the prompts' blocks were built with) keeps the
    parse to the judge's own words. The prompts must have been built for the same mode
    (:func:`answer_instruction` with ``text_mode``)."""
    if not prompts:
        return []
    options = _options(labels)
    values = {opt: float(i) for i, opt in enumerate(options)}  # judge_labels needs numbers; unused here
    if wants_logprobs(engine, use_logprobs):
        thoughts = [""] * len(prompts)
        if reasoning:
            starts = [list(p) + [msg("assistant", REASONING_PREFIX)] for p in prompts]
            params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=("\n",))
            lines = generate_parsed(engine, starts, None, params, max_retries=0, answer_format=REASONING_LINE)
            thoughts = [" ".join((p.value or "").split()) for p in lines]
        heads = [(f"{REASONING_PREFIX} {t}\n" if reasoning else "") + prefix for t in thoughts]
        asked = [list(p) + [msg("assistant", h)] for p, h in zip(prompts, heads)]
        # a row whose labels all have probability 0 falls back to a generated label after the prefix
        label_format = AnswerFormat.choice(list(labels), name="label")

        def bare(text: str) -> str | None:
            own = text if fence is None else fence.own_words(text, copies=True)
            label = label_format.parse(own)
            return None if label is None else " " + label

        rows = judge_labels(
            engine,
            asked,
            values,
            bare,
            _params(max_new_tokens),
            retries=max_retries,
            answer_format=label_format,
        )
        out = []
        for row, thought in zip(rows, thoughts):
            probs = None if row.probs is None else {options[k]: v for k, v in row.probs.items()}
            label = None if row.label is None else options[row.label]
            out.append(Verdict(label, probs, thought, row.raw, row.attempts, row.mode))
        return out
    fmt = verdict_format(labels, reasoning)
    budget = max_new_tokens * (2 if reasoning else 1)
    views = [None if fence is None else fence.within(p) for p in prompts]  # each answer, its prompt's texts
    parsed = generate_parsed(
        engine,
        prompts,
        [partial(read_verdict, fmt=fmt, fence=view, engine=engine) for view in views],
        _params(budget),
        max_retries=max_retries,
        answer_format=fmt,
    )
    return [
        Verdict(
            None if p.value is None else p.value[VERDICT_KEY],
            None,
            "" if p.value is None else " ".join(str(p.value.get(REASONING_KEY, "")).split()),
            p.raw,
            p.attempts,
            "text",
        )
        for p in parsed
    ]


def _params(max_new_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)


def label_probability(verdict: Verdict, label: str) -> float | None:
    """P(``label``): from the label probabilities in log-prob mode, 1 or 0 in text mode, None if invalid."""
    if not verdict.valid:
        return None
    if verdict.probs is not None:
        return verdict.probs.get(label, 0.0)
    return 1.0 if verdict.label == label else 0.0


def expected(verdict: Verdict, values: Mapping[str, float]) -> float | None:
    """Expected value of ``values`` under the verdict (its label's value in text mode); None if invalid."""
    if not verdict.valid:
        return None
    if verdict.probs is not None:
        return sum(p * values[label] for label, p in verdict.probs.items())
    return values[verdict.label]  # type: ignore[index]  # a valid verdict has a label


class VerdictJudge:
    """What the verdict judges (humanlike, empathy) share: engine, answer settings, screen, fence
    generator and counts."""

    def __init__(
        self,
        engine: ChatEngine,
        *,
        reasoning: bool = False,
        use_logprobs: str = "auto",
        max_retries: int = 2,
        max_new_tokens: int = 64,
        rng: random.Random | None = None,
        addressed: str = DEFAULT_POLICY,
        addressed_context: str = DEFAULT_CONTEXT_POLICY,
        owner: str | None = None,
    ) -> None:
        """``owner`` names the judge in errors (default: its class)."""
        owner = owner or type(self).__name__
        check_logprobs_mode(owner, use_logprobs)
        self.screen = JudgeScreen(addressed, addressed_context, owner=owner)
        if max_retries < 0 or max_new_tokens < 1:
            raise ValueError(f"{owner}: max_retries must be >= 0 and max_new_tokens >= 1")
        self.engine = engine
        self.reasoning = reasoning
        self.use_logprobs = use_logprobs
        self.max_retries = max_retries
        self.max_new_tokens = max_new_tokens
        self.rng = rng if rng is not None else random.Random(0)
        self.stats: Counter[str] = Counter()

    @property
    def text_mode(self) -> bool:
        """Whether verdicts are generated as text (no log-probs): the prompts then ask for JSON. Prompts
        built without an engine (judge training data) ask for the log-prob mode's lines, the form of
        the training targets (:func:`answer_text`)."""
        return self.engine is not None and not wants_logprobs(self.engine, self.use_logprobs)

    def decide(
        self,
        prompts: Sequence[Conversation],
        labels: Sequence[str],
        fence: Fence,
        prefix: str = VERDICT_PREFIX,
    ) -> list[Verdict]:
        """:func:`decide` under this judge's settings."""
        return decide(
            self.engine,
            prompts,
            labels,
            reasoning=self.reasoning,
            use_logprobs=self.use_logprobs,
            max_retries=self.max_retries,
            max_new_tokens=self.max_new_tokens,
            prefix=prefix,
            fence=fence,
        )
