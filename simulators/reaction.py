"""One-step reaction simulator ("echo"): how the person reacts to one candidate supporter reply.

RAPO judges replies by their consequence (research/rapo.md section 2.2): for each (context, candidate
reply) the simulator plays the person behind the hidden profile and returns what they say next, how
their feelings changed and a short inner thought. Every stage is one batched engine call.

* Log-prob mode (the engine exposes log-probs): the next message is generated with the roles flipped
  (the simulator LLM is ``assistant`` = the person, the supporter's turns are ``user`` turns), the
  emotion change is read from the probabilities of the labels ``1``..``7`` (see :func:`emotion_delta`),
  and, with ``with_thought``, one more generation writes the inner thought.
* Text mode: one generation per attempt writes labelled fields (``Thought:``, ``Reply:``,
  ``Emotion change: N``), parsed leniently; what does not parse is asked again together, then marked
  invalid (never a silent 0).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rapo_echo.engines.base import ChatEngine
from rapo_echo.judges.base import (
    Parsed,
    check_logprobs_mode,
    generate_parsed,
    read_label_probabilities,
    wants_logprobs,
)
from rapo_echo.judges.fencing import Fence
from rapo_echo.rewards.judge import render_dialogue
from rapo_echo.simulators.base import Reaction, UserSimulator
from rapo_echo.simulators.replies import clean_reply
from rapo_echo.types import Conversation, SamplingParams, Scenario, msg

PARAGRAPH_STOP = ("\n\n",)  # a message or thought is one short paragraph
EMOTION_LABELS = ("1", "2", "3", "4", "5", "6", "7")
EMOTION_PREFIX = "Answer: "  # "...: " then a digit tokenises as ':', ' ', digit: digits are single tokens
PROFILE_FIELDS = {
    "persona": "Who you are",
    "emotion_type": "Main emotion",
    "problem_type": "Problem",
    "situation": "Situation",
    "need": "What you need from the supporter (unspoken)",
}


def render_profile(profile: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> str:
    """The hidden profile as ``- Label: value`` lines: known fields first (in a fixed order, with readable
    labels), then any other non-empty field under its own name; '' when nothing is set."""
    labels = PROFILE_FIELDS if labels is None else labels
    keys = [k for k in labels if k in profile] + [k for k in profile if k not in labels]
    lines = []
    for key in keys:
        value = profile[key]
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        lines.append(f"- {labels.get(key, key)}: {str(value).strip()}")
    return "\n".join(lines)


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


_LABEL = r"(inner thought|thought|reply|emotion(?:al)?(?:[ _-]*change)?)[\s*_`]*[:=][\s*_`]*"
_FIELD_AT_LINE_START = re.compile(r"^[\s>*_#`-]*" + _LABEL, re.I | re.M)
_FIELD_ANYWHERE = re.compile(r"\b" + _LABEL, re.I)
_THOUGHT_LABEL = re.compile(
    r"^[\s*_`]*(?:(?:the|my)\s+)?(?:inner\s+|private\s+)?thought[\s*_`]*[:=][\s*_`]*", re.I
)


def parse_fields(text: str) -> dict[str, str]:
    """Labelled fields of a text-mode reaction, keys ``thought`` / ``reply`` / ``emotion``: each value
    runs from its label (any case, markdown bold allowed, ``:`` or ``=``) to the next label; the first
    occurrence of a field wins. Labels at line starts are preferred when they give both ``reply`` and
    ``emotion`` (so "their reply: ..." inside a thought line is not a label), else labels anywhere
    (one-line answers); the other reading fills missing fields."""
    text = text.replace("\u2212", "-")
    line_start, anywhere = (_fields(text, p) for p in (_FIELD_AT_LINE_START, _FIELD_ANYWHERE))
    if "reply" in line_start and "emotion" in line_start:
        return {**anywhere, **line_start}
    return {**line_start, **anywhere}


def _fields(text: str, pattern: re.Pattern[str]) -> dict[str, str]:
    found = list(pattern.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(found):
        key = m.group(1).lower()
        key = "emotion" if key.startswith("emotion") else "thought" if key.endswith("thought") else key
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        out.setdefault(key, text[m.end() : end].strip().strip("*_`").strip())
    return out


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text


class ReactionSimulator(UserSimulator):
    """Plays the person of each scenario's hidden profile and reacts to candidate replies."""

    def __init__(
        self,
        engine: ChatEngine,
        *,
        scale: float = 10.0,
        use_logprobs: str = "auto",
        max_new_tokens: int = 96,
        thought_tokens: int = 40,
        temperature: float = 0.7,
        max_retries: int = 2,
        with_thought: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        """``rng`` (e.g. the algorithm's seeded, checkpointed generator) draws each batch's fence marker;
        without one the marker is a hash of the batch's texts."""
        if scale <= 0:
            raise ValueError(f"ReactionSimulator: scale must be > 0, got {scale}")
        check_logprobs_mode("ReactionSimulator", use_logprobs)
        if max_new_tokens < 1 or thought_tokens < 1:
            raise ValueError("ReactionSimulator: max_new_tokens and thought_tokens must be >= 1")
        if max_retries < 0:
            raise ValueError(f"ReactionSimulator: max_retries must be >= 0, got {max_retries}")
        self.engine = engine
        self.scale = scale
        self.use_logprobs = use_logprobs
        self.max_new_tokens = max_new_tokens
        self.thought_tokens = thought_tokens
        self.temperature = temperature
        self.max_retries = max_retries
        self.with_thought = with_thought
        self.rng = rng

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

    def text_prompt(self, scenario: Scenario, reply: str, fence: Fence | None = None) -> Conversation:
        """Text mode: one prompt asking for the labelled fields."""
        fence = fence or self.fence([(scenario, reply)])
        bound = f"{self.scale:g}"
        lines = []
        if self.with_thought:
            lines.append("Thought: <one short sentence you think but do not say>")
        lines += [
            "Reply: <what you say next, 1-3 sentences>",
            f"Emotion change: <an integer from -{bound} (much worse) to {bound} (much better), 0 = same>",
        ]
        question = (
            self._situation(scenario, reply, fence)
            + "React as this person. Write exactly these lines and nothing else:\n"
            + "\n".join(lines)
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
        """``(message, emotion_delta, thought)`` from a text-mode answer, or None when the reply is
        missing/empty or the emotion change is missing, not an integer, or outside ``[-scale, scale]``."""
        fields = parse_fields(text)
        message = self.clean_message(fields.get("reply", ""))
        m = re.match(r"\(?\s*([+-]?\d+)(?![\d.])", fields.get("emotion", ""))
        if message is None or m is None:
            return None
        delta = int(m.group(1))
        if abs(delta) > self.scale:
            return None
        return message, float(delta), self.clean_thought(fields.get("thought", "")) or ""

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
        messages = generate_parsed(
            self.engine,
            [self.message_prompt(s, r, fence) for s, r in pairs],
            lambda text: self.clean_message(fence.own_words(text)),
            self._params(self.max_new_tokens, stop=PARAGRAPH_STOP),
            max_retries=self.max_retries,
            role="simulator",
        )
        probs = read_label_probabilities(
            self.engine,
            [self.emotion_prompt(s, r, fence) for s, r in pairs],
            EMOTION_LABELS,
            role="simulator",
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
