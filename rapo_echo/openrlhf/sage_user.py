"""An RLVER / SAGE-style simulated user: a persona with a hidden intention whose emotion (0-100) is
the reward (research notes: ``rlver.md`` sections 1.1-1.5; prompts are our own English wording).

Per policy turn the simulator LLM is called twice, as in SAGE:

1. *analysis*: given persona, background, hidden intention, current emotion and the dialogue, it
   writes ``Content / TargetCompletion / Activity / Analyse / Change``; ``Change`` is the signed
   emotion change, clamped to ``[-max_delta, max_delta]`` (SAGE: 10; RLVER's training simulator does
   not clamp: ``max_delta=None``), then the emotion is kept in [0, 100];
2. *reply*: given the new emotion tier (S >= 100, A >= 70, B >= 40, C >= 10, F below) it writes
   ``Thinking / Origin / Change / Response``; only ``Response`` is said to the supporter.

The dialogue ends when the emotion reaches ``end_high`` (100) or falls to ``end_low`` (0) or below,
after ``max_turns`` supporter replies, or when the user says goodbye. The reward is the final
emotion / 100. The first user message is the profile's preset ``first_talk`` when it has one,
else written by the simulator. Replies that do not parse are asked again (``max_retries``); an
analysis that never parses leaves the emotion unchanged and is counted in ``parse_failures``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rapo_echo.engines.base import ChatEngine
from rapo_echo.errors import DataError
from rapo_echo.judges.base import generate_parsed
from rapo_echo.types import Conversation, SamplingParams, msg

EMOTION_MIN = 0.0
EMOTION_MAX = 100.0
ANALYSIS_FIELDS = ("Content", "TargetCompletion", "Activity", "Analyse", "Change")
REPLY_FIELDS = ("Thinking", "Origin", "Change", "Response")
TIERS = (("S", 100.0), ("A", 70.0), ("B", 40.0), ("C", 10.0), ("F", -float("inf")))
TIER_BEHAVIOUR = {
    "S": "you feel fully understood and better; thank the other person warmly and say goodbye",
    "A": "you feel positive and engaged; you open up and share more",
    "B": "you feel neutral; you keep talking but stay guarded",
    "C": "you feel negative; your replies are short, doubtful or irritated",
    "F": "you have lost all patience; say goodbye and end the conversation",
}


@dataclass(frozen=True)
class SageSettings:
    """How the simulated user behaves. Defaults follow SAGE's evaluation simulator except the early
    stop, which uses the 0 / 100 bounds (SAGE stops below 10: set ``end_low=9.999``).
    :meth:`rlver_training` gives RLVER's released training simulator."""

    initial_emotion: float = 40.0
    max_delta: float | None = 10.0
    max_turns: int = 10
    end_low: float = EMOTION_MIN
    end_high: float = EMOTION_MAX
    goodbye_words: tuple[str, ...] = ("goodbye", "bye", "再见", "拜拜")
    temperature: float = 0.7
    max_new_tokens: int = 512
    max_retries: int = 2

    def __post_init__(self) -> None:
        if not EMOTION_MIN <= self.initial_emotion <= EMOTION_MAX:
            raise ValueError(f"initial_emotion must be in [0, 100], got {self.initial_emotion}")
        if self.max_delta is not None and self.max_delta <= 0:
            raise ValueError(f"max_delta must be > 0 or None (no clamp), got {self.max_delta}")
        if self.max_turns < 1 or self.max_retries < 0:
            raise ValueError(
                f"max_turns must be >= 1 and max_retries >= 0, got {self.max_turns}, {self.max_retries}"
            )
        if not self.end_low < self.initial_emotion < self.end_high:
            raise ValueError(
                f"initial_emotion {self.initial_emotion} must lie strictly between end_low {self.end_low} "
                f"and end_high {self.end_high}, or the dialogue would end before it starts"
            )

    @classmethod
    def rlver_training(cls) -> SageSettings:
        """RLVER's released training simulator: starts at 30, no clamp on the change, 8 turns."""
        return cls(initial_emotion=30.0, max_delta=None, max_turns=8)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "sage") -> SageSettings:
        """Build from a JSON/YAML mapping; unknown keys and bad values name ``where``."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise DataError(f"{where}: unknown keys {unknown}; allowed: {', '.join(sorted(known))}")
        values = dict(data)
        if "goodbye_words" in values:
            values["goodbye_words"] = tuple(values["goodbye_words"])
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{where}: {exc}") from exc


# ---------------------------------------------------------------------------- emotion rules


def clamp_delta(delta: float, max_delta: float | None) -> float:
    """The change clamped to ``[-max_delta, max_delta]`` (unchanged when ``max_delta`` is None)."""
    if max_delta is None:
        return delta
    return max(-max_delta, min(max_delta, delta))


def update_emotion(current: float, delta: float, max_delta: float | None = 10.0) -> float:
    """``clamp(current + clamp_delta(delta), 0, 100)``: SAGE's per-turn update."""
    return max(EMOTION_MIN, min(EMOTION_MAX, current + clamp_delta(delta, max_delta)))


def tier(emotion: float) -> str:
    """The emotion tier: S (>= 100), A (>= 70), B (>= 40), C (>= 10), F (below 10)."""
    return next(name for name, low in TIERS if emotion >= low)


def says_goodbye(text: str, words: Sequence[str]) -> bool:
    """True when ``text`` contains a goodbye word (whole words for Latin script, substrings otherwise)."""
    for word in words:
        if word.isascii():
            if re.search(rf"(?<![a-z]){re.escape(word.lower())}(?![a-z])", text.lower()):
                return True
        elif word in text:
            return True
    return False


def end_reason(emotion: float, turns: int, settings: SageSettings) -> str | None:
    """Why the dialogue ends after ``turns`` supporter replies at this emotion, or None."""
    if emotion >= settings.end_high:
        return "emotion_high"
    if emotion <= settings.end_low:
        return "emotion_low"
    if turns >= settings.max_turns:
        return "max_turns"
    return None


# ---------------------------------------------------------------------------- parsing


def parse_fields(text: str, names: Sequence[str]) -> dict[str, str]:
    """Labelled fields ``Name: value`` (any case, optional markdown bold / bullets, ASCII or full-width
    colon); each value runs until the next known label."""
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    label = re.compile(rf"^[ \t>*#\-]*\**\s*({alternatives})\s*\**\s*[:：]\s*\**", re.I | re.M)
    found = list(label.finditer(text))
    canonical = {n.lower(): n for n in names}
    out: dict[str, str] = {}
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        name = canonical[m.group(1).lower()]
        out.setdefault(name, text[m.end() : end].strip().strip("*").strip())
    return out


def parse_change(text: str) -> float | None:
    """The emotion change of an analysis: the first signed number of its ``Change`` field."""
    value = parse_fields(text, ANALYSIS_FIELDS).get("Change")
    if value is None:
        return None
    m = re.search(r"[-+−]?\s*\d+(?:\.\d+)?", value)
    if not m:
        return None
    return float(m.group(0).replace("−", "-").replace(" ", ""))


def parse_response(text: str) -> str | None:
    """The ``Response`` field of a reply (what the user says), or None when it is missing or empty."""
    value = parse_fields(text, REPLY_FIELDS).get("Response")
    if not value:
        return None
    return value.strip().strip('"').strip("“”").strip() or None


# ---------------------------------------------------------------------------- profile and prompts


@dataclass(frozen=True)
class SageProfile:
    """Who the simulated user is. ``first_talk`` is a preset opening message (SAGE's test set)."""

    persona: str
    background: str
    hidden_intention: str = ""
    first_talk: str | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "profile") -> SageProfile:
        """Accepts RLVER / SAGE profile rows (``player``, ``scene``, ``task``, ``first_talk``), rapo-echo
        scenario profiles (``persona``, ``situation``, ``need``, ...) or a whole scenario mapping
        (``profile`` plus ``messages`` / ``opening``, whose last user message is the first talk)."""
        if not isinstance(data, Mapping):
            raise DataError(f"{where}: expected a JSON object, got {type(data).__name__}")
        first = data.get("first_talk") or data.get("opening")
        if isinstance(data.get("profile"), Mapping):
            messages = data.get("messages") or []
            users = [m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
            first = first or (users[-1] if users else None)
            data = {**data["profile"], **({"first_talk": first} if first else {})}
        persona = data.get("player") or data.get("persona")
        background = data.get("scene") or data.get("situation") or data.get("background")
        extra = [f"{k.replace('_', ' ')}: {data[k]}" for k in ("emotion_type", "problem_type") if data.get(k)]
        if extra:
            background = "\n".join([background or "", *extra]).strip()
        if not persona and not background:
            raise DataError(
                f"{where}: needs a persona ('player' or 'persona') or a background ('scene' or 'situation'); "
                f"got keys {sorted(data)}"
            )
        intention = data.get("task") or data.get("need") or data.get("hidden_intention") or ""
        return cls(
            persona=str(persona or "(not given)"),
            background=str(background or "(not given)"),
            hidden_intention=str(intention),
            first_talk=str(first) if first else None,
        )

    @classmethod
    def from_label(cls, label: Any, where: str = "label") -> SageProfile:
        """From an OpenRLHF label: a JSON string (or already decoded mapping) of a profile."""
        if isinstance(label, str):
            try:
                label = json.loads(label)
            except ValueError as exc:
                raise DataError(f"{where}: not a JSON profile ({exc}): {label[:120]!r}") from exc
        return cls.from_mapping(label, where)


PURPOSE = (
    "This is a heart-to-heart talk: you confide in the other person (the supporter) about the events "
    "in your background, concretely rather than in abstract feelings. Act in line with your hidden "
    "intention, but never state it outright. How you respond depends on your current emotion."
)


def _character(profile: SageProfile) -> str:
    hidden = f"\n\nYour hidden intention (never say it outright):\n{profile.hidden_intention}"
    return f"Your persona:\n{profile.persona}\n\nYour background:\n{profile.background}" + (
        hidden if profile.hidden_intention else ""
    )


def render_dialogue(history: Sequence[Mapping[str, str]]) -> str:
    """The dialogue from the user's side: ``You:`` for the user, ``Supporter:`` for the policy."""
    names = {"user": "You", "assistant": "Supporter"}
    lines = [f"{names[m['role']]}: {m['content']}" for m in history if m["role"] in names]
    return "\n".join(lines) or "(nothing yet)"


def analysis_prompt(
    profile: SageProfile, history: Sequence[Mapping[str, str]], emotion: float
) -> Conversation:
    """Call A: how the supporter's last reply makes the character feel, ending in a signed change."""
    body = (
        f"{PURPOSE}\n\n{_character(profile)}\n\nYour current emotion: {emotion:g} on a scale from 0 "
        "(you want to leave) to 100 (fully understood, happy to have talked).\n\n"
        "The dialogue so far (the last line is the supporter's newest reply):\n"
        f"{render_dialogue(history)}\n\n"
        "Stay in character (tone, way of thinking, feelings). Analyse in five steps and answer exactly "
        "in this format:\n"
        "Content: what the supporter is trying to say\n"
        "TargetCompletion: how well the reply meets your goal and hidden intention, and what might "
        "upset you\n"
        "Activity: your inner activity right now, given your persona and current emotion\n"
        "Analyse: your concrete feeling about this reply (a reply that is not natural language feels "
        "very bad)\n"
        "Change: the change of your emotion, one signed integer from -10 to 10"
    )
    return [
        msg("system", "You analyse how a role-played character feels in a conversation."),
        msg("user", body),
    ]


def reply_prompt(
    profile: SageProfile, history: Sequence[Mapping[str, str]], emotion_tier: str, feeling: str | None
) -> Conversation:
    """Call B: the character's next message, given its emotion tier (and the analysis, after turn 1)."""
    start = not any(m["role"] == "assistant" for m in history)
    situation = (
        "The conversation starts now: open with a short message that begins to confide."
        if start
        else f"The dialogue so far:\n{render_dialogue(history)}\n\nHow the supporter's last reply made you "
        f"feel:\n{feeling or '(no analysis)'}"
    )
    body = (
        f"You are an actor playing the character below, talking to a supporter.\n{PURPOSE}\n\n"
        f"{_character(profile)}\n\nYour current emotion tier is {emotion_tier}: "
        f"{TIER_BEHAVIOUR[emotion_tier]}.\n\n{situation}\n\n"
        "Write a first draft, then rewrite it to sound real: short and casual, emotions implied by the tone "
        "rather than named, no repetition of earlier lines, at most two questions, in the language of your "
        "persona. Answer exactly in this format:\n"
        "Thinking: your attitude and the goal of this message\n"
        "Origin: the first draft\n"
        "Change: how you rewrote it\n"
        "Response: the final message you say"
    )
    return [
        msg("system", "You play a character in a conversation, faithfully and briefly."),
        msg("user", body),
    ]


# ---------------------------------------------------------------------------- the user


@dataclass
class Reaction:
    """What happened after one supporter reply."""

    emotion: float
    delta: float | None
    done: bool
    reason: str | None
    message: str | None
    analysis: dict[str, str] = field(default_factory=dict)


class SageUser:
    """One simulated user in one dialogue (stateful: emotion, turn count, parse failures)."""

    def __init__(
        self, engine: ChatEngine, profile: SageProfile, settings: SageSettings | None = None
    ) -> None:
        self.engine = engine
        self.profile = profile
        self.settings = settings or SageSettings()
        self.emotion = self.settings.initial_emotion
        self.turns = 0
        self.parse_failures = 0
        self.done = False
        self.reason: str | None = None

    def _params(self) -> SamplingParams:
        s = self.settings
        return SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature)

    def _ask(self, prompt: Conversation, parse: Any) -> tuple[Any, str]:
        result = generate_parsed(
            self.engine, [prompt], parse, self._params(), max_retries=self.settings.max_retries
        )[0]
        if result.value is None:
            self.parse_failures += 1
        return result.value, result.raw

    def _say(self, history: Sequence[Mapping[str, str]], feeling: str | None) -> str:
        prompt = reply_prompt(self.profile, history, tier(self.emotion), feeling)
        text, raw = self._ask(prompt, parse_response)
        return text if text is not None else raw.strip()

    def opening(self) -> str:
        """The first user message: the preset ``first_talk``, else written by the simulator."""
        if self.profile.first_talk:
            return self.profile.first_talk
        return self._say([], None)

    def react(self, history: Sequence[Mapping[str, str]]) -> Reaction:
        """Update the emotion after the supporter's reply (the last message of ``history``) and, unless
        the dialogue ends, write the user's next message."""
        if self.done:
            raise RuntimeError("the dialogue has already ended")
        if not history or history[-1]["role"] != "assistant":
            raise ValueError("react() needs a history whose last message is the supporter's reply")
        delta, raw = self._ask(analysis_prompt(self.profile, history, self.emotion), parse_change)
        analysis = parse_fields(raw, ANALYSIS_FIELDS)
        if delta is not None:
            self.emotion = update_emotion(self.emotion, delta, self.settings.max_delta)
        self.turns += 1
        reason = end_reason(self.emotion, self.turns, self.settings)
        message = None
        if reason is None:
            feeling = "\n".join(
                f"{k}: {analysis[k]}" for k in ("TargetCompletion", "Analyse") if k in analysis
            )
            message = self._say(history, feeling or None)
            if says_goodbye(message, self.settings.goodbye_words):
                reason = "goodbye"
        self.done = reason is not None
        self.reason = reason
        return Reaction(self.emotion, delta, self.done, reason, message, analysis)

    @property
    def reward(self) -> float:
        """RLVER's reward: the current (final, once done) emotion / 100."""
        return self.emotion / EMOTION_MAX
