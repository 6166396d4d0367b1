"""One-step reaction simulator ("echo"): how the person reacts to one candidate supporter reply
(docs/algorithms/rapo.md).

For each (context, candidate reply) the simulator plays the person behind the hidden profile and returns
what they say next, how their feelings changed and a short inner thought; each stage is one batched call.
Log-prob mode writes the message with the roles flipped (:data:`MESSAGE_FORMAT`), reads the change from
the labels ``1``..``7`` (:func:`emotion_delta`) and, with ``with_thought``, writes the thought
(:data:`THOUGHT_FORMAT`). Text mode asks for the JSON object of :meth:`ReactionSimulator.answer_format`;
what does not parse is asked again, then invalid (never a silent 0).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

from rapo_echo.engines.base import ChatEngine
from rapo_echo.engines.concurrency import calls_concurrently, together
from rapo_echo.llm.answers import Parsed, check_logprobs_mode, generate_parsed, wants_logprobs
from rapo_echo.llm.dialogue import clean_reply, render_dialogue
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.labels import read_label_probabilities
from rapo_echo.llm.reaction import Reaction, render_profile
from rapo_echo.simulators.base import UserSimulator
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, SamplingParams, Scenario, msg

PARAGRAPH_STOP = ("\n\n",)  # a message or thought is one short paragraph
EMOTION_LABELS = ("1", "2", "3", "4", "5", "6", "7")
EMOTION_PREFIX = "Answer: "  # "...: " then a digit tokenises as ':', ' ', digit: digits are single tokens
MESSAGE_CHARS = 400  # the longest message the person says
THOUGHT_CHARS = 200  # the longest inner thought
MESSAGE_FORMAT = AnswerFormat.regex(rf"[^\n]{{1,{MESSAGE_CHARS}}}", name="reaction_message")
THOUGHT_FORMAT = AnswerFormat.regex(rf"[^\n]{{1,{THOUGHT_CHARS}}}", name="reaction_thought")
CHANGE_KEY = "valence_change"  # sorts after "reply" and "thought": the number is written last


def emotion_delta(probs: Mapping[str, float], scale: float) -> float:
    """Expected 7-point label mapped linearly onto ``[-scale, +scale]``.

    ``E = sum_k k * p(k)`` over labels ``1``..``7`` (1 = much worse, 4 = no change, 7 = much better),
    then ``delta = (E - 4) / 3 * scale``: label 1 -> ``-scale``, 4 -> 0, 7 -> ``+scale``.
    """
    total = sum(probs.get(k, 0.0) for k in EMOTION_LABELS)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"emotion label probabilities must sum to 1 over 1..7, got {total}")
    expected = sum(int(k) * probs.get(k, 0.0) for k in EMOTION_LABELS)
    return (expected - 4.0) / 3.0 * scale


_THOUGHT_LABEL = re.compile(
    r"^[\s*_`]*(?:(?:the|my)\s+)?(?:inner\s+|private\s+)?thought[\s*_`]*[:=][\s*_`]*", re.I
)


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


@dataclass(eq=False)
class ReactionSimulator(UserSimulator):
    """Plays the person of each scenario's hidden profile and reacts to candidate replies."""

    engine: ChatEngine
    _: KW_ONLY
    scale: float = 10.0
    use_logprobs: str = "auto"
    max_new_tokens: int = 96
    thought_tokens: int = 40
    temperature: float = 0.7
    max_retries: int = 2
    with_thought: bool = True
    # draws each batch's fence marker (e.g. the algorithm's seeded, checkpointed generator); None: a hash
    # of the batch's texts
    rng: random.Random | None = None

    def __post_init__(self) -> None:
        if self.scale <= 0:
            raise ValueError(f"ReactionSimulator: scale must be > 0, got {self.scale}")
        check_logprobs_mode("ReactionSimulator", self.use_logprobs)
        if self.max_new_tokens < 1 or self.thought_tokens < 1:
            raise ValueError("ReactionSimulator: max_new_tokens and thought_tokens must be >= 1")
        if self.max_retries < 0:
            raise ValueError(f"ReactionSimulator: max_retries must be >= 0, got {self.max_retries}")

    # ------------------------------------------------------------------ prompts
    def fence(self, pairs: Sequence[tuple[Scenario, str]]) -> Fence:
        """One fence for a batch: from ``rng`` when the simulator has one, else a hash of the batch's
        texts (reproducible either way; prompts of one context keep their shared prefix)."""
        if self.rng is not None:
            return Fence(rng=self.rng)
        return Fence.derived(
            (t for s, r in pairs for t in (r, *(m["content"] for m in s.messages))), "reaction"
        )

    def system_prompt(self, scenario: Scenario, fence: Fence | None = None) -> str:
        """The role brief: who the person is (fenced), and to answer briefly as that person, never as an
        assistant."""
        fence = fence or self.fence([(scenario, "")])
        profile = render_profile(scenario.profile)
        about = (
            f"About you (the supporter does not know this):\n{fence.block('PROFILE', profile)}\n\n"
            if profile
            else ""
        )
        return (
            "You are role-playing a person who is talking to a supporter about something that troubles "
            f"you.\n{fence.rules()}\n\n{about}"
            "Stay in character: answer in 1-3 short sentences as this person would, honestly showing how "
            "the supporter's words land with you. Never act as an assistant, never give advice, never "
            "break character."
        )

    def message_prompt(self, scenario: Scenario, reply: str, fence: Fence | None = None) -> Conversation:
        """Roles flipped: the person is ``assistant``, the supporter (dialogue + candidate reply) ``user``.
        The turns stay chat messages of their own (the role-play itself); the profile is fenced."""
        fence = fence or self.fence([(scenario, reply)])
        flip = {"user": "assistant", "assistant": "user"}
        turns = [msg(flip[m["role"]], m["content"]) for m in scenario.messages if m["role"] in flip]
        turns.append(msg("user", reply))
        if turns[0]["role"] == "assistant":  # templates that need user-first alternation
            turns.insert(0, msg("user", "(The chat with the supporter begins. You speak first.)"))
        merged: Conversation = [msg("system", self.system_prompt(scenario, fence))]
        for m in turns:
            if merged[-1]["role"] == m["role"]:
                merged[-1] = msg(m["role"], merged[-1]["content"] + "\n\n" + m["content"])
            else:
                merged.append(m)
        return merged

    def _situation(self, scenario: Scenario, reply: str, fence: Fence) -> str:
        dialogue = render_dialogue(scenario.messages, user="You", assistant="Supporter")
        shown = fence.block("DIALOGUE", dialogue) if dialogue else "(none: the supporter speaks first)"
        return (
            f"The conversation so far:\n{shown}\n\nThe supporter now says:\n{fence.block('REPLY', reply)}\n\n"
        )

    def emotion_prompt(self, scenario: Scenario, reply: str, fence: Fence | None = None) -> Conversation:
        """Asks (in character) how the reply changed the person's feelings, on the 7-point label scale;
        ends with an assistant prefix right before the label."""
        fence = fence or self.fence([(scenario, reply)])
        question = (
            self._situation(scenario, reply, fence)
            + "How does this reply change how you feel? Answer with one number: 1 = much worse, "
            "2 = worse, 3 = a little worse, 4 = no change, 5 = a little better, 6 = better, "
            "7 = much better."
        )
        return [
            msg("system", self.system_prompt(scenario, fence)),
            msg("user", question),
            msg("assistant", EMOTION_PREFIX),
        ]

    def thought_prompt(
        self, scenario: Scenario, reply: str, message: str, fence: Fence | None = None
    ) -> Conversation:
        """Asks for the person's short private thought about the reply (not said aloud)."""
        fence = fence or self.fence([(scenario, reply + message)])
        question = (
            self._situation(scenario, reply, fence)
            + f"You answered:\n{fence.block('YOUR ANSWER', message)}\n\nIn one short sentence, what do you "
            "privately think or feel about the supporter's reply, that you would not say aloud? Write only "
            "the thought."
        )
        return [msg("system", self.system_prompt(scenario, fence)), msg("user", question)]

    def answer_format(self) -> AnswerFormat:
        """Text mode's answer: ``{"reply": str, "thought": str, "valence_change": int}`` (``thought`` only
        ``with_thought``), the change an integer in ``[-scale, scale]``."""
        bound = math.floor(self.scale)
        props: dict[str, Any] = {"reply": {"type": "string", "minLength": 1, "maxLength": MESSAGE_CHARS}}
        if self.with_thought:
            props["thought"] = {"type": "string", "minLength": 1, "maxLength": THOUGHT_CHARS}
        props[CHANGE_KEY] = {"type": "integer", "minimum": -bound, "maximum": bound}
        return AnswerFormat.json_object(props, name="reaction")

    def text_prompt(self, scenario: Scenario, reply: str, fence: Fence | None = None) -> Conversation:
        """Text mode: one prompt asking for the JSON object of :meth:`answer_format`."""
        fence = fence or self.fence([(scenario, reply)])
        bound = f"{math.floor(self.scale)}"
        lines = ['"reply": what you say next, 1-3 sentences']
        if self.with_thought:
            lines.append('"thought": one short sentence you think but do not say')
        lines.append(
            f'"{CHANGE_KEY}": how the reply changed your feelings, an integer from -{bound} (much worse) to '
            f"{bound} (much better), 0 = same"
        )
        example = ", ".join(
            [
                '"reply": "..."',
                *(['"thought": "..."'] if self.with_thought else []),
                f'"{CHANGE_KEY}": 0',
            ]
        )
        question = (
            self._situation(scenario, reply, fence)
            + "React as this person. Answer with one JSON object with exactly these keys, in this order, "
            "and nothing else:\n" + "\n".join(lines) + f"\nShape: {{{example}}}"
        )
        return [msg("system", self.system_prompt(scenario, fence)), msg("user", question)]

    # ------------------------------------------------------------------ parsing
    @staticmethod
    def clean_message(text: str) -> str | None:
        """A generated message without role tags, surrounding quotes or whitespace; None when empty."""
        text = _unquote(clean_reply(text))
        return text or None

    @staticmethod
    def clean_thought(text: str) -> str | None:
        """A generated thought without a leading ``Thought:`` label, role tags or quotes; None when empty."""
        return ReactionSimulator.clean_message(_THOUGHT_LABEL.sub("", text.strip(), count=1))

    def parse_text(self, text: str) -> tuple[str, float, str] | None:
        """``(message, emotion_delta, thought)`` from a text-mode answer (:meth:`answer_format`), or None
        when it does not parse or the reply is empty once cleaned."""
        value = self.answer_format().parse(text)
        if value is None:
            return None
        message = self.clean_message(value["reply"])
        if message is None:
            return None
        return message, float(value[CHANGE_KEY]), self.clean_thought(value.get("thought", "")) or ""

    # ------------------------------------------------------------------ running
    def react(self, pairs: Sequence[tuple[Scenario, str]]) -> list[Reaction]:
        """The person's reaction to each ``(context, candidate reply)``, in order."""
        if not pairs:
            return []
        if wants_logprobs(self.engine, self.use_logprobs):
            return self._react_logprobs(pairs)
        return self._react_text(pairs)

    def _params(self, max_new_tokens: int, stop: tuple[str, ...] = ()) -> SamplingParams:
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=self.temperature, stop=stop)

    def _react_logprobs(self, pairs: Sequence[tuple[Scenario, str]]) -> list[Reaction]:
        fence = self.fence(pairs)

        def write_messages() -> list[Parsed[str]]:
            return generate_parsed(
                self.engine,
                [self.message_prompt(s, r, fence) for s, r in pairs],
                lambda text: self.clean_message(fence.own_words(text)),
                self._params(self.max_new_tokens, stop=PARAGRAPH_STOP),
                max_retries=self.max_retries,
                role="simulator",
                answer_format=MESSAGE_FORMAT,
            )

        def read_emotions() -> list[dict[str, float] | None]:
            return read_label_probabilities(
                self.engine,
                [self.emotion_prompt(s, r, fence) for s, r in pairs],
                EMOTION_LABELS,
                role="simulator",
            )

        # the message and the emotion read do not depend on each other: one round on a served simulator
        messages, probs = together(
            [write_messages, read_emotions], concurrent=calls_concurrently(self.engine)
        )
        deltas = [None if p is None else emotion_delta(p, self.scale) for p in probs]
        thoughts: dict[int, Parsed[str]] = {}
        ok = [i for i, m in enumerate(messages) if m.value is not None and deltas[i] is not None]
        if self.with_thought and ok:
            prompts = [self.thought_prompt(*pairs[i], messages[i].value or "", fence) for i in ok]
            params = self._params(self.thought_tokens, stop=PARAGRAPH_STOP)
            written = generate_parsed(
                self.engine,
                prompts,
                lambda text: self.clean_thought(fence.own_words(text)),
                params,
                max_retries=0,
                role="simulator",
                answer_format=THOUGHT_FORMAT,
            )
            thoughts = dict(zip(ok, written))
        out = []
        for i, m in enumerate(messages):
            valid = m.value is not None and deltas[i] is not None  # no usable emotion labels: invalid
            thought = thoughts.get(i)
            out.append(
                Reaction(
                    message=m.value or "",
                    emotion_delta=deltas[i] if valid else None,
                    thought=(thought.value or "") if thought else "",
                    valid=valid,
                    raw=m.raw if thought is None else f"{m.raw}\n[thought] {thought.raw}",
                    attempts=m.attempts,
                    scale=self.scale,
                )
            )
        return out

    def _react_text(self, pairs: Sequence[tuple[Scenario, str]]) -> list[Reaction]:
        fence = self.fence(pairs)
        parsed = generate_parsed(
            self.engine,
            [self.text_prompt(s, r, fence) for s, r in pairs],
            lambda text: self.parse_text(fence.own_words(text)),
            self._params(self.max_new_tokens + (self.thought_tokens if self.with_thought else 0)),
            max_retries=self.max_retries,
            role="simulator",
            answer_format=self.answer_format(),
        )
        out = []
        for p in parsed:
            message, delta, thought = p.value if p.value is not None else ("", None, "")
            out.append(
                Reaction(
                    message=message,
                    emotion_delta=delta,
                    thought=thought if self.with_thought else "",
                    valid=p.value is not None,
                    raw=p.raw,
                    attempts=p.attempts,
                    scale=self.scale,
                )
            )
        return out
