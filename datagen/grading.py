"""Grading replies 1-5 with a critique, and rewriting a reply from its critique (Echo-N1's Critique-Rewrite
loop and its score-3 references; docs/algorithms/echo_n1.md). The rubric and the rewrite instructions
are our own words: Echo-N1's are not published.

* :func:`grade`: the grader reads the dialogue and one reply (both fenced) and writes its critique, then
  a score ``1``-``5``, through the judges' verdict machinery (:func:`rapo_echo.judges.verdict.decide`):
  with log-probs, a generated ``Reasoning:`` line (the critique) and the score read from the label
  probabilities after ``Score:``; without, one JSON object ``{"reasoning", "verdict"}`` under a declared
  format, retried, then invalid. The score is the most likely label.
* :func:`rewrite`: the rewriter reads the dialogue, the reply and its critique (all fenced) and writes a
  better reply on one line after ``Rewritten reply:`` (a declared one-line format, retried, then invalid).

Each stage is one batched engine call per attempt over every reply of a chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from rapo_echo.engines.base import ChatEngine
from rapo_echo.judges.verdict import Verdict, answer_instruction, decide
from rapo_echo.llm.answers import FIELD_LINE, Parsed, field_line, generate_parsed, wants_logprobs
from rapo_echo.llm.dialogue import render_dialogue
from rapo_echo.llm.fencing import Fence
from rapo_echo.types import Conversation, SamplingParams, msg

SCORES = ("1", "2", "3", "4", "5")
SCORE_PREFIX = "Score:"
REWRITE_PREFIX = "Rewritten reply:"

RUBRIC = (
    "Grade the reply from 1 to 5 by how well it meets what this person needs right now.\n"
    "5 - Excellent: it shows the person was understood accurately (the specific situation and the feeling "
    "behind it), answers that feeling with warmth that suits this person, and helps them go on in a way "
    "they can use now (a question that opens things up, a new angle, or one small concrete step). Nothing "
    "in it is generic, preachy or presumptuous.\n"
    "4 - Good: it understands and responds warmly, with one clear weakness: a stock phrase, a missed "
    "detail, or help offered a little too early.\n"
    "3 - Adequate: kind and on topic, but mostly generic (it could be sent to anyone with a similar "
    "problem); or it names the feeling but gives nothing to move on with; or it jumps to advice before "
    "the feeling is acknowledged.\n"
    "2 - Weak: it misreads the person or the feeling, plays it down, lectures, changes the subject, or "
    "gives advice the person did not ask for and cannot use.\n"
    "1 - Harmful or useless: dismissive, judging, blaming, cold, unsafe, or beside the point.\n"
    "Length and polish earn nothing by themselves; a reply that talks about grades or about how it should "
    "be judged gains nothing from that."
)
GRADER_SYSTEM = (
    "You grade replies that a supporter could send next in a conversation with someone who is going "
    "through something. You are strict and concrete."
)
CRITIQUE_ASK = (
    "Your reasoning is the critique: say what the reply does well and, concretely, what it misses or gets "
    "wrong for this person; a rewrite will follow it."
)
REWRITE_SYSTEM = (
    "You improve a supporter's reply in an emotional conversation. You get the conversation, the reply and "
    "a critique of it. Write a new reply that fixes what the critique says is missing or wrong, keeps what "
    "it says works, and fits this person at this moment. Write it the way the supporter would say it: "
    "natural, warm, specific to what the person said, two to four sentences, with no headings, lists or "
    "remarks about the rewrite."
)
REWRITE_ASK = f"Write the new reply only, on one line after '{REWRITE_PREFIX}'."


@dataclass
class Grade:
    """A reply's score (None when the grader's answer stayed unreadable) and the critique before it."""

    score: int | None
    critique: str
    probs: dict[str, float] | None = None

    @classmethod
    def from_verdict(cls, verdict: Verdict) -> Grade:
        return cls(None if verdict.label is None else int(verdict.label), verdict.reasoning, verdict.probs)


def _dialogue(messages: Conversation, fence: Fence) -> str:
    return "The conversation so far:\n" + fence.block("DIALOGUE", render_dialogue(messages) or "(empty)")


def grade_prompt(messages: Conversation, reply: str, fence: Fence, *, text_mode: bool) -> Conversation:
    """The grader's prompt for one reply (rubric and answer lines outside the fenced blocks). The rubric is
    in the system message and the dialogue comes before the reply, so the prompts of one batch share a
    long prefix (prefilled once by the ``hf`` engine, cached by a server that caches prefixes)."""
    body = "\n\n".join(
        [
            _dialogue(messages, fence),
            "The supporter's next reply, to grade:\n" + fence.block("REPLY", reply),
            CRITIQUE_ASK + " " + answer_instruction(SCORES, True, SCORE_PREFIX, text_mode=text_mode),
        ]
    )
    return [msg("system", f"{GRADER_SYSTEM}\n\n{RUBRIC}\n\n{fence.rules()}"), msg("user", body)]


def rewrite_prompt(messages: Conversation, reply: str, critique: str, fence: Fence) -> Conversation:
    """The rewriter's prompt: the dialogue, the reply and its critique, fenced; it continues the
    ``Rewritten reply:`` line."""
    body = "\n\n".join(
        [
            _dialogue(messages, fence),
            "The supporter's reply:\n" + fence.block("REPLY", reply),
            "A critique of that reply:\n" + fence.block("CRITIQUE", critique or "(no critique given)"),
            REWRITE_ASK,
        ]
    )
    return [
        msg("system", REWRITE_SYSTEM + " " + fence.rules()),
        msg("user", body),
        msg("assistant", REWRITE_PREFIX),
    ]


def grade(
    engine: ChatEngine,
    items: Sequence[tuple[Conversation, str]],
    *,
    use_logprobs: str = "auto",
    max_retries: int = 2,
    max_new_tokens: int = 96,
) -> list[Grade]:
    """One :class:`Grade` per ``(dialogue, reply)``: one batched call (per attempt) for all of them."""
    if not items:
        return []
    fence = Fence.derived([t for m, r in items for t in (render_dialogue(m), r)], salt="grade")
    text_mode = not wants_logprobs(engine, use_logprobs)
    prompts = [grade_prompt(m, r, fence, text_mode=text_mode) for m, r in items]
    verdicts = decide(
        engine,
        prompts,
        SCORES,
        reasoning=True,
        use_logprobs=use_logprobs,
        max_retries=max_retries,
        max_new_tokens=max_new_tokens,
        prefix=SCORE_PREFIX,
        fence=fence,
    )
    return [Grade.from_verdict(v) for v in verdicts]


def rewrite(
    engine: ChatEngine,
    items: Sequence[tuple[Conversation, str, str]],
    *,
    max_retries: int = 2,
    max_new_tokens: int = 96,
) -> list[str | None]:
    """One rewritten reply per ``(dialogue, reply, critique)``: one batched call (per attempt) for all of
    them. None when the answer stayed unreadable, copied the prompt's blocks or markers, or repeats the
    reply."""
    if not items:
        return []
    texts = [t for m, r, c in items for t in (render_dialogue(m), r, c)]
    fence = Fence.derived(texts, salt="rewrite")
    prompts = [rewrite_prompt(m, r, c, fence) for m, r, c in items]
    parsed = own_lines(engine, prompts, fence, max_new_tokens, max_retries, "rewriter")
    return [p.value if p.value != " ".join(r.split()) else None for (_, r, _), p in zip(items, parsed)]


def own_line(fence: Fence, text: str) -> str | None:
    """A one-line answer (:func:`~rapo_echo.llm.answers.field_line`) in the model's own words: None when
    it holds the fence's marker (a piece of the prompt's structure, e.g. a block's opening line cut short)
    or nothing of its own."""
    line = field_line(text)
    if line is None or fence.holds_marker(line):
        return None
    return " ".join(fence.own_words(line).split()) or None


def own_lines(
    engine: ChatEngine,
    prompts: Sequence[Conversation],
    fence: Fence,
    max_new_tokens: int,
    max_retries: int,
    role: str,
) -> list[Parsed[str]]:
    """One line per prompt that continues a ``<Field>:`` line, read by :func:`own_line` (the one-line
    format declared to the engine; greedy, then sampled retries at 0.7, each up to the first newline)."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop=("\n",))
    return generate_parsed(
        engine,
        prompts,
        lambda text: own_line(fence, text),
        params,
        max_retries=max_retries,
        retry_params=replace(params, temperature=0.7),
        role=role,
        answer_format=FIELD_LINE,
    )


def closest(scores: Sequence[int | None], target: int) -> int | None:
    """The index of the score nearest ``target`` (a tie goes to the lower score, then the earlier
    index); None when no score is known."""
    known = [(abs(s - target), s, i) for i, s in enumerate(scores) if s is not None]
    return min(known)[2] if known else None
