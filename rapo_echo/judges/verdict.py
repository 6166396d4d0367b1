"""The answer format of the Echo-N1 judges (humanlike, empathy): an optional ``Reasoning:`` line, then
one ``Verdict: LABEL`` line.

* Log-prob mode (the engine exposes log-probs): the label is read from the label tokens'
  probabilities right after the prefix ``Verdict:``; with ``reasoning`` on, one batched generation
  first writes the judge's ``Reasoning:`` line and the label is read after it (a generative judge
  that reasons before its verdict, as Echo-N1's are said to).
* Text mode: the judge writes the lines; the verdict is parsed from its last ``Verdict:`` line (or a
  reply that is a bare label); unparseable replies are retried, then invalid (``None``), never 0.
  Given the prompts' ``fence``, only the judge's own words are parsed
  (:meth:`~rapo_echo.llm.fencing.Fence.own_words` with ``copies=True``, as the generic ``judge``
  reward does): a quoted reply that ends in ``Verdict: human``, with or without its fence markers,
  never lends the judge its label.

Labels are words such as ``human`` / ``AI`` or ``A`` / ``B`` / ``tie``; as log-prob options they get a
leading space (``" human"``), a single token in common BPE vocabularies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rapo_echo.engines.base import ChatEngine, generate_texts
from rapo_echo.llm.answers import wants_logprobs
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.labels import judge_labels
from rapo_echo.types import Conversation, SamplingParams, msg

REASONING_PREFIX = "Reasoning:"
VERDICT_PREFIX = "Verdict:"


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


def answer_instruction(labels: Sequence[str], reasoning: bool, prefix: str = VERDICT_PREFIX) -> str:
    """The sentence that asks for the answer lines, e.g. ``... 'Verdict: human' or 'Verdict: AI'``."""
    options = " or ".join(f"'{prefix} {label}'" for label in labels)
    if reasoning:
        return (
            f"Answer with two lines: first '{REASONING_PREFIX}' and one or two sentences of reasoning, "
            f"then {options}."
        )
    return f"Answer with one line: {options}."


def answer_text(label: str, reasoning: str | None, prefix: str = VERDICT_PREFIX) -> str:
    """The answer a judge should write (the target of judge training)."""
    line = f"{prefix} {label}"
    if reasoning:
        return f"{REASONING_PREFIX} {' '.join(reasoning.split())}\n{line}"
    return line


def parse_verdict(text: str, labels: Sequence[str], prefix: str = VERDICT_PREFIX) -> str | None:
    """The label of the last ``Verdict: LABEL`` line of ``text`` (case, markdown and a trailing period or
    explanation tolerated), or of a reply that is a bare label; None otherwise."""
    by_lower = {label.lower(): label for label in labels}
    words = "|".join(re.escape(k) for k in sorted(by_lower, key=len, reverse=True))
    key = re.escape(prefix.rstrip(":"))
    label_re = rf"[*_`\"'\s]*(?:reply\s+)?({words})(?![\w-])"
    hits = re.findall(rf"{key}[*_`\s]*[:=-]{label_re}", text, re.I)
    if hits:
        return by_lower[hits[-1].lower()]
    bare = re.fullmatch(rf"{label_re}[\s.!*_`\"']*", text, re.I)
    return by_lower[bare.group(1).lower()] if bare else None


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
    verdict line; ``fence`` (the one the prompts' blocks were built with) keeps the parse to the
    judge's own words."""
    if not prompts:
        return []

    def own(text: str) -> str:
        return text if fence is None else fence.own_words(text, copies=True)

    options = _options(labels)
    values = {opt: float(i) for i, opt in enumerate(options)}  # judge_labels needs numbers; unused here
    if wants_logprobs(engine, use_logprobs):
        thoughts = [""] * len(prompts)
        if reasoning:
            starts = [list(p) + [msg("assistant", REASONING_PREFIX)] for p in prompts]
            params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=("\n",))
            thoughts = [" ".join(t.split()) for t in generate_texts(engine, starts, params)]
        heads = [(f"{REASONING_PREFIX} {t}\n" if reasoning else "") + prefix for t in thoughts]
        asked = [list(p) + [msg("assistant", h)] for p, h in zip(prompts, heads)]

        def bare(text: str) -> str | None:
            label = parse_verdict(own(text), labels, prefix)
            return None if label is None else " " + label

        rows = judge_labels(engine, asked, values, bare, _params(max_new_tokens), retries=max_retries)
        out = []
        for row, thought in zip(rows, thoughts):
            probs = None if row.probs is None else {options[k]: v for k, v in row.probs.items()}
            label = None if row.label is None else options[row.label]
            out.append(Verdict(label, probs, thought, row.raw, row.attempts, row.mode))
        return out
    budget = max_new_tokens * (2 if reasoning else 1)

    def parse(text: str) -> str | None:
        label = parse_verdict(own(text), labels, prefix)
        return None if label is None else " " + label

    rows = judge_labels(
        engine, prompts, values, parse, _params(budget), retries=max_retries, logprobs="never"
    )
    return [
        Verdict(
            None if r.label is None else options[r.label],
            None,
            reasoning_of(own(r.raw)),
            r.raw,
            r.attempts,
            "text",
        )
        for r in rows
    ]


def _params(max_new_tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)


def reasoning_of(text: str) -> str:
    """The text after the last ``Reasoning:`` up to the verdict line ('' when there is none)."""
    hits = re.findall(rf"{re.escape(REASONING_PREFIX)}\s*(.*?)(?:\n|$)", text, re.I)
    return " ".join(hits[-1].split()) if hits else ""


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
    return values[verdict.label]  # type: ignore[index]
