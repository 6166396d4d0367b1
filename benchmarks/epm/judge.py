"""The EPM judge: fills the IEDR form once per case (the initial deficit P0) and the MDEP form after
every evaluated turn (progress and regress per C/A/P axis -> the step vector v_t; mappings in
:mod:`.vectors`). The prompts are our own wording of the published method, calibrated to be strict.

* Log-prob mode (``use_logprobs`` auto/always on an engine with log-probs): one prompt per indicator
  asking for one digit, all indicators of all cases in one ``choice_logprobs`` call; the level is the
  most probable option as the reply's first token (digits are single tokens in common vocabularies). A
  case whose options all have probability 0 falls back to text.
* Text mode: one prompt per case, the whole form as one JSON object under a schema (:func:`iedr_format`,
  :func:`mdep_format`); an answer that does not parse is asked again, then the form is invalid
  (``levels`` None), never filled with a default.

Regress is asked as a severity 0/1/2 and stored as 0/-1/-2. The persona card, the dialogue and the
latest exchange reach the prompt only inside fenced blocks."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field

from rapo_echo.benchmarks.epm.user import Turn
from rapo_echo.benchmarks.epm.vectors import AXES, AXIS_NAMES, IEDR_INDICATORS, IEDR_KEYS, MDEP_KEYS
from rapo_echo.engines.base import ChatEngine, normalize_choices
from rapo_echo.errors import CapabilityError
from rapo_echo.llm.answers import generate_parsed, wants_logprobs
from rapo_echo.llm.dialogue import render_dialogue, turn_messages
from rapo_echo.llm.fencing import Fence
from rapo_echo.structured import AnswerFormat
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


def _levels_format(keys: dict[str, tuple[int, int]], name: str) -> AnswerFormat:
    props = {k: {"type": "integer", "minimum": lo, "maximum": hi} for k, (lo, hi) in keys.items()}
    return AnswerFormat.json_object(props, name=name)


def mdep_answer_key(key: str) -> str:
    """The JSON key of an MDEP level: ``C.Prog`` -> ``C progress``, ``C.Neg`` -> ``C regress``."""
    axis, kind = key.split(".")
    return f"{axis} {'progress' if kind == 'Prog' else 'regress'}"


def iedr_format() -> AnswerFormat:
    """The IEDR form as one JSON object: the nine indicators ``C.1`` .. ``P.3``, each an integer 0..3."""
    return _levels_format(dict.fromkeys(IEDR_KEYS, (0, 3)), "epm_iedr")


def mdep_format() -> AnswerFormat:
    """The MDEP form as one JSON object: ``C progress`` 0..2 and ``C regress`` (a severity) 0..2, for C, A
    and P."""
    return _levels_format({mdep_answer_key(k): (0, 2) for k in MDEP_KEYS}, "epm_mdep")


def parse_iedr(text: str) -> dict[str, int] | None:
    """The nine IEDR levels of a text-mode answer (:func:`iedr_format`), or None."""
    value = iedr_format().parse(text)
    return None if value is None else {k: int(value[k]) for k in IEDR_KEYS}


def parse_mdep(text: str) -> dict[str, int] | None:
    """The six MDEP levels of a text-mode answer (:func:`mdep_format`), regress stored as 0/-1/-2; or
    None."""
    value = mdep_format().parse(text)
    if value is None:
        return None
    levels = {k: int(value[mdep_answer_key(k)]) for k in MDEP_KEYS}
    return {k: -v if k.endswith("Neg") else v for k, v in levels.items()}


@dataclass
class EpmJudge:
    """Fills IEDR and MDEP forms for a batch of cases, one engine call per form and attempt."""

    engine: ChatEngine
    params: SamplingParams
    _: KW_ONLY
    use_logprobs: str = "auto"
    retries: int = 2
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    # ------------------------------------------------------------------ prompts
    def iedr_prompt(self, card: str, question: str | None, fence: Fence) -> Conversation:
        """The IEDR prompt for one case; ``question`` None asks for the whole form (text mode)."""
        body = (
            "Before the conversation starts, rate how deep the person's unmet needs are.\n\n"
            f"The person's card:\n{fence.block('CARD', card)}\n\n{iedr_instructions()}\n\n"
        )
        if question is None:
            body += (
                "Answer with one JSON object and nothing else: the nine indicators as keys, each with its "
                'level, e.g. {"A.1": 1, "A.2": 0, "A.3": 2, "C.1": 2, ..., "P.3": 0}.'
            )
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
            body += (
                "Answer with one JSON object and nothing else, with a progress level (0 to 2) and a regress "
                "severity (0 none, 1 a misstep, 2 a serious one) for each axis: "
                '{"A progress": 1, "A regress": 0, "C progress": 0, "C regress": 1, "P progress": 0, '
                '"P regress": 0}.'
            )
            return [msg("system", SYSTEM + " " + fence.rules()), msg("user", body)]
        body += f"Rate {question} only. Answer with that one digit and nothing else."
        return [msg("system", SYSTEM + " " + fence.rules()), msg("user", body)]

    # ------------------------------------------------------------------ forms
    def fill_iedr(self, cards: Sequence[str]) -> list[EpmForm]:
        """The IEDR form of each card."""
        questions = [
            (i.key, f"indicator {i.key} ({i.name}) from 0 to 3", (0, 1, 2, 3)) for i in IEDR_INDICATORS
        ]
        return self._fill(
            len(cards),
            questions,
            lambda c, q, f: self.iedr_prompt(cards[c], q, f),
            parse_iedr,
            iedr_format(),
        )

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
            mdep_format(),
        )

    def _fill(
        self,
        n: int,
        questions: Sequence[tuple[str, str, tuple[int, ...]]],
        prompt: Callable[[int, str | None, Fence], Conversation],
        parse: Callable[[str], dict[str, int] | None],
        fmt: AnswerFormat,
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
                    except (CapabilityError, KeyError):  # no option scored, or the request failed
                        break
                    best = max(range(len(allowed)), key=lambda i: p[options[i]])
                    levels[key] = allowed[best]
                    probs[key] = {str(allowed[i]): p[options[i]] for i in range(len(allowed))}
                if len(levels) == len(questions):
                    out[c] = EpmForm(levels, "", 1, "logprobs", probs)
                else:
                    text_cases.append(c)
        if text_cases:
            parsed = generate_parsed(
                self.engine,
                [prompt(c, None, fences[c]) for c in text_cases],
                parse,
                self.params,
                max_retries=self.retries,
                answer_format=fmt,
            )
            for c, p in zip(text_cases, parsed):
                out[c] = EpmForm(p.value, p.raw, p.attempts, "text")
        return [f for f in out if f is not None]
