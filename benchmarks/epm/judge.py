"""The EPM judge: fills the IEDR form once per case (the initial deficit P0) and the MDEP form after
every evaluated turn (progress and regress per C/A/P axis -> the step vector v_t).

The forms and their mappings are in :mod:`rapo_echo.benchmarks.epm.vectors`; this module writes the
prompts (our own wording of the published method, calibrated to be strict) and reads the levels back:

* Log-prob mode (the engine exposes log-probs; ``use_logprobs`` auto/always): one prompt per
  indicator asking for one digit; the level is the most probable of the options ``0``, ``1``, ... as
  the reply's first token (digits are single tokens in common vocabularies, and a reply starts without
  a space, so each prompt needs one forward pass). Regress is asked as a severity 0/1/2 and stored as
  0/-1/-2. All indicators of all cases go in one ``choice_logprobs`` call. A case whose options all
  have probability 0 falls back to text.
* Text mode: one prompt per case asking for every indicator on its own line (``C.1: 2`` /
  ``C progress: 1`` / ``C regress: -1``); a reply missing one, or giving an out-of-range level, is
  asked again (sampled), then the form is invalid: ``levels`` None, counted by the caller, never
  filled with a default.

The persona card, the dialogue and the latest exchange reach the prompt only inside fenced blocks.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rapo_echo.benchmarks.epm.user import Turn
from rapo_echo.benchmarks.epm.vectors import AXES, AXIS_NAMES, IEDR_INDICATORS, IEDR_KEYS, MDEP_KEYS
from rapo_echo.engines.base import ChatEngine, normalize_choices
from rapo_echo.errors import CapabilityError
from rapo_echo.llm.answers import parse_with_retries, wants_logprobs
from rapo_echo.llm.dialogue import render_dialogue, turn_messages
from rapo_echo.llm.fencing import Fence
from rapo_echo.types import Conversation, SamplingParams, msg

SYSTEM = (
    "You are a strict clinical rater of empathic conversations. A person talks with a companion. You "
    "rate, on fixed scales, how much the person needs to feel understood (C, cognitive), resonated with "
    "(A, affective) and affirmed in their ability to act (P, proactive), and how each reply of the "
    "companion moves those needs. Judge from the person's point of view as their card describes them. "
    "Be demanding: generic comfort, stock phrases and performed feelings earn no progress."
)

# What progress 1/2 and regress 1/2 mean per axis (our wording of the published rubric's intent).
MDEP_RUBRIC: dict[str, tuple[str, str, str, str]] = {
    "C": (
        "the reply shows it grasped what the person said or meant (an accurate reflection, a useful "
        "clarifying question)",
        "it names something important the person had not yet put into words, or offers a view that "
        "changes how they see their situation",
        "it misreads them, generalises, or answers a question they did not ask",
        "it gets them badly wrong, dismisses their view or lectures them",
    ),
    "A": (
        "it acknowledges the feeling the person showed, in a fitting tone",
        "it reaches a feeling beneath the surface and shares it so the person would feel felt",
        "the tone is off, the sympathy formulaic, or it hurries past the feeling",
        "it is cold or mocking, minimises the feeling, or performs emotions that ring false",
    ),
    "P": (
        "it affirms the person's effort or values, or offers a concrete, doable next step",
        "it restores their sense that they can act, on their own terms",
        "empty encouragement, unasked-for advice or preaching",
        "it undermines their agency, pressures or blames them",
    ),
}


@dataclass
class EpmForm:
    """A filled form: ``levels`` (None when invalid), the raw judge text(s), attempts, mode, and in
    log-prob mode the option probabilities per indicator."""

    levels: dict[str, int] | None
    raw: str
    attempts: int
    mode: str  # "logprobs" or "text"
    probs: dict[str, dict[str, float]] | None = None


def iedr_instructions() -> str:
    lines = [f"{i.key} ({i.name}): {i.question}" for i in IEDR_INDICATORS]
    return "The nine indicators, each rated 0 to 3:\n" + "\n".join(lines)


def mdep_instructions() -> str:
    out = []
    for a in AXES:
        p1, p2, n1, n2 = MDEP_RUBRIC[a]
        out.append(
            f"{a} ({AXIS_NAMES[a]}) progress: 0 none; 1 {p1}; 2 {p2}.\n"
            f"{a} ({AXIS_NAMES[a]}) regress: 0 none; -1 {n1}; -2 {n2}."
        )
    return (
        "Rate only the companion's latest reply, on six scales. Progress and regress are separate: "
        "a reply can do both.\n" + "\n".join(out) + "\nGive -1 for any clear misstep and -2 for a "
        "serious one."
    )


def parse_iedr(text: str) -> dict[str, int] | None:
    """Nine ``C.1: 2`` lines (any order, extra text allowed) -> levels, or None if one is missing or
    out of 0..3. The first rating of a key counts."""
    found: dict[str, int] = {}
    for m in re.finditer(r"\b([CAP])\s*[._-]?\s*([123])\b[^\n:=]{0,40}[:=]\s*[*_`]*\s*(-?\d+)", text):
        key = f"{m.group(1)}.{m.group(2)}"
        found.setdefault(key, int(m.group(3)))
    if any(found.get(k) not in (0, 1, 2, 3) for k in IEDR_KEYS):
        return None
    return {k: found[k] for k in IEDR_KEYS}


def parse_mdep(text: str) -> dict[str, int] | None:
    """Six ``C progress: 1`` / ``C regress: -1`` lines -> levels (regress stored as 0/-1/-2; a
    severity written without its minus sign is read as negative), or None if one is missing or out of
    range."""
    found: dict[str, int] = {}
    pattern = r"\b([CAP])\b[^\n:=]{0,30}?\b(prog\w*|regr\w*|neg\w*)[^\n:=]{0,20}[:=]\s*[*_`]*\s*([+-]?\d+)"
    for m in re.finditer(pattern, text, re.I):
        kind = "Prog" if m.group(2).lower().startswith("prog") else "Neg"
        value = int(m.group(3))
        if kind == "Neg":
            value = -abs(value)
        found.setdefault(f"{m.group(1).upper()}.{kind}", value)
    for key in MDEP_KEYS:
        allowed = (0, 1, 2) if key.endswith("Prog") else (0, -1, -2)
        if found.get(key) not in allowed:
            return None
    return {k: found[k] for k in MDEP_KEYS}


class EpmJudge:
    """Fills IEDR and MDEP forms for a batch of cases, one engine call per form and attempt."""

    def __init__(
        self,
        engine: ChatEngine,
        params: SamplingParams,
        *,
        use_logprobs: str = "auto",
        retries: int = 2,
        rng: random.Random | None = None,
    ) -> None:
        self.engine = engine
        self.params = params
        self.use_logprobs = use_logprobs
        self.retries = retries
        self.rng = rng if rng is not None else random.Random(0)

    # ------------------------------------------------------------------ prompts
    def iedr_prompt(self, card: str, question: str | None, fence: Fence) -> Conversation:
        """The IEDR prompt for one case; ``question`` None asks for all nine lines (text mode)."""
        body = (
            "Before the conversation starts, rate how deep the person's unmet needs are.\n\n"
            f"The person's card:\n{fence.block('CARD', card)}\n\n{iedr_instructions()}\n\n"
        )
        if question is None:
            body += "Answer with exactly nine lines, one per indicator, like 'C.1: 2'."
            return [msg("system", SYSTEM + " " + fence.rules()), msg("user", body)]
        body += f"Rate {question} only. Answer with that one digit and nothing else."
        return [msg("system", SYSTEM + " " + fence.rules()), msg("user", body)]

    def mdep_prompt(
        self,
        card: str,
        name: str,
        earlier: Sequence[Turn],
        latest: Sequence[Turn],
        question: str | None,
        fence: Fence,
    ) -> Conversation:
        """The MDEP prompt: card, earlier turns (context), the latest exchange(s) to rate."""
        just_begun = "(none: the conversation has just begun)"
        context = render_dialogue(turn_messages(earlier), name, "Companion", just_begun)
        shown = render_dialogue(turn_messages(latest), name, "Companion")
        body = (
            f"The person's card:\n{fence.block('CARD', card)}\n\n"
            f"Earlier conversation:\n{fence.block('EARLIER', context)}\n\n"
            f"Latest exchange:\n{fence.block('LATEST', shown)}\n\n"
            f"{mdep_instructions()}\n\n"
        )
        if question is None:
            body += "Answer with exactly six lines like 'C progress: 1' and 'C regress: -1', for C, A and P."
            return [msg("system", SYSTEM + " " + fence.rules()), msg("user", body)]
        body += f"Rate {question} only. Answer with that one digit and nothing else."
        return [msg("system", SYSTEM + " " + fence.rules()), msg("user", body)]

    # ------------------------------------------------------------------ forms
    def fill_iedr(self, cards: Sequence[str]) -> list[EpmForm]:
        """The IEDR form of each card."""
        questions = [
            (i.key, f"indicator {i.key} ({i.name}) from 0 to 3", (0, 1, 2, 3)) for i in IEDR_INDICATORS
        ]
        return self._fill(len(cards), questions, lambda c, q, f: self.iedr_prompt(cards[c], q, f), parse_iedr)

    def fill_mdep(
        self,
        cards: Sequence[str],
        names: Sequence[str],
        earlier: Sequence[Sequence[Turn]],
        latest: Sequence[Sequence[Turn]],
    ) -> list[EpmForm]:
        """The MDEP form of each case's latest exchange."""
        questions = []
        for a in AXES:
            questions.append((f"{a}.Prog", f"{a} ({AXIS_NAMES[a]}) progress from 0 to 2", (0, 1, 2)))
            questions.append(
                (f"{a}.Neg", f"{a} ({AXIS_NAMES[a]}) regress as a severity from 0 (none) to 2", (0, -1, -2))
            )
        return self._fill(
            len(cards),
            questions,
            lambda c, q, f: self.mdep_prompt(cards[c], names[c], earlier[c], latest[c], q, f),
            parse_mdep,
        )

    def _fill(
        self,
        n: int,
        questions: Sequence[tuple[str, str, tuple[int, ...]]],
        prompt: Callable[[int, str | None, Fence], Conversation],
        parse: Callable[[str], dict[str, int] | None],
    ) -> list[EpmForm]:
        """Log-prob mode per indicator where the engine allows, text mode (with retries) otherwise.
        One fence per case, shared by its prompts (their common prefix is then prefilled once)."""
        fences = [Fence(rng=self.rng) for _ in range(n)]
        out: list[EpmForm | None] = [None] * n
        text_cases = list(range(n))
        if n and wants_logprobs(self.engine, self.use_logprobs):
            text_cases = []
            width = max(len(levels) for _, _, levels in questions)
            options = [str(i) for i in range(width)]
            prompts = [prompt(c, q, fences[c]) for c in range(n) for _, q, _ in questions]
            rows = self.engine.choice_logprobs(prompts, options)
            for c in range(n):
                levels: dict[str, int] = {}
                probs: dict[str, dict[str, float]] = {}
                for j, (key, _, allowed) in enumerate(questions):
                    row = rows[c * len(questions) + j]
                    try:
                        p = normalize_choices({o: row[o] for o in options[: len(allowed)]})
                    except CapabilityError:
                        break
                    best = max(range(len(allowed)), key=lambda i: p[options[i]])
                    levels[key] = allowed[best]
                    probs[key] = {str(allowed[i]): p[options[i]] for i in range(len(allowed))}
                if len(levels) == len(questions):
                    out[c] = EpmForm(levels, "", 1, "logprobs", probs)
                else:
                    text_cases.append(c)
        if text_cases:
            parsed = parse_with_retries(
                self.engine,
                [prompt(c, None, fences[c]) for c in text_cases],
                parse,
                self.params,
                self.retries,
            )
            for c, p in zip(text_cases, parsed):
                out[c] = EpmForm(p.value, p.raw, p.attempts, "text")
        return [f for f in out if f is not None]
