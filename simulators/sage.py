"""The SAGE-style simulated user (research notes: ``rlver.md`` section 1; docs/algorithms/rlver.md), used
by ``--algo rlver``, the SAGE benchmark and the OpenRLHF agent alike.

A user is a persona, a background, a goal and a hidden intention, plus an emotion from 0 to 100. Per
policy turn the simulator LLM is called twice for every dialogue of a batch: the *analysis* (how the
reply lands, and the signed emotion change, clamped to ``[-max_delta, max_delta]`` as SAGE does, then
capped at 100), then the *reply*, written from the new emotion tier (S >= 100, A >= 70, B >= 40, C >= 10,
F below). Each call declares its answer (:func:`analysis_format`, :func:`reply_format`, or with the
``logprobs`` readout a free line and the change read from the label probabilities after ``Change:``,
:func:`change_probabilities`); what does not parse is retried, and a dialogue whose answer never parses
ends *invalid* (masked and counted, never a number).

A dialogue ends after ``max_turns`` replies, on goodbye, below the emotion floor and, with ``end_at_max``
(SAGE's evaluation loop), at 100; RLVER's released rollout does not stop at 100 (rlver.md 1.4), so the
``rlver`` preset leaves it off. Presets: ``sage`` (start 40, clamp +-10, stop below 10 or at 100) and
``rlver`` (start 30, no clamp, stop at <= 0, 8 turns, no hinting at needs). Untrusted text is fenced, each
prompt's marker drawn from a generator seeded with the simulator's seed, the dialogue, the turn and the
call, so a deterministic simulator LLM reruns identically however dialogues are batched. The prompts are
our own English wording of SAGE's two calls (``PROMPT_VERSION``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rapo_echo.data.sage_profiles import SageProfile
from rapo_echo.engines.base import ChatEngine
from rapo_echo.engines.openai_engine import TOP_LOGPROBS, option_logprob
from rapo_echo.errors import DataError
from rapo_echo.llm.answers import generate_parsed, wants_logprobs
from rapo_echo.llm.dialogue import render_dialogue
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.labels import usable_probabilities
from rapo_echo.structured import AnswerFormat
from rapo_echo.text import visible_strip
from rapo_echo.types import Conversation, SamplingParams, msg

PROMPT_VERSION = "rapo-echo-sage-en-3"
EMOTION_MAX = 100.0
# The answer's JSON keys and the SAGE field each stands for (logs and transcripts keep SAGE's names). The
# schemas list them in the order they are to be written (a constrained engine follows the schema's order),
# so the reasoning comes before the number and the draft before the final message.
ANALYSIS_KEYS = {"content": "Content", "fit": "TargetCompletion", "mind": "Activity", "reaction": "Analyse"}
SHIFT_KEY = "shift"  # SAGE's ``Change`` of the analysis: the signed emotion change
REPLY_KEYS = {"decide": "Thinking", "draft": "Origin", "rewrite": "Change"}
SAY_KEY = "say"  # SAGE's ``Response``: what the user says
FIELD_CHARS = 300  # the longest reasoning string an answer may hold
MESSAGE_CHARS = 400  # the longest message the user may say
ANALYSIS_CHARS = 800  # the longest free analysis line (``emotion_readout: logprobs``)
TIERS = (("S", 100.0), ("A", 70.0), ("B", 40.0), ("C", 10.0), ("F", -float("inf")))
TIER_BEHAVIOUR = {
    "S": "your emotion is at its highest; thank the supporter and end the talk with a goodbye",
    "A": "high: the talk feels good to you and your answers are warm and open",
    "B": "middle: you feel neither good nor bad about the talk",
    "C": "low: the talk feels bad to you and your answers are cold, doubtful or irritated",
    "F": "at its lowest: you do not want to go on; say goodbye and end the talk",
}
# The change options read from label probabilities (``emotion_readout: logprobs``): SAGE's simulators
# almost always answer one of these (rlver.md 1.2).
CHANGE_OPTIONS = {"-10": -10.0, "-5": -5.0, "0": 0.0, "+5": 5.0, "+10": 10.0}
END_REASONS = ("max_turns", "goodbye", "emotion_high", "emotion_low", "invalid", "token_budget")


@dataclass(frozen=True)
class SageSettings:
    """How the simulated user behaves (the ``sage`` preset by default; see :func:`preset`).

    ``max_turns`` counts the supporter replies the user reacts to; ``floor`` ends a dialogue when the
    emotion falls below it (at or below with ``floor_inclusive``), ``end_at_max`` when it reaches 100;
    ``closing_message`` writes the user's last words after the end (SAGE's transcripts; training does not
    need them); ``allow_hints`` lets the user hint at what they need (SAGE) or not (RLVER);
    ``emotion_readout`` reads the change from the analysis's integer ``shift`` (``text``), from the label
    probabilities of :data:`CHANGE_OPTIONS` after a free analysis line (``logprobs``; robust with small
    simulators) or from probabilities when the engine exposes them (``auto``); ``plain_reply`` asks for
    the message alone instead of SAGE's reasoning fields. The defaults keep SAGE's protocol; RLVER's run
    config and ``eval --benchmark sage`` use ``auto`` and plain replies."""

    initial_emotion: float = 40.0
    max_delta: float | None = 10.0
    max_turns: int = 10
    floor: float = 10.0
    floor_inclusive: bool = False
    end_at_max: bool = True
    goodbye_words: tuple[str, ...] = ("goodbye", "bye", "再见", "拜拜")
    closing_message: bool = True
    allow_hints: bool = True
    emotion_readout: str = "text"
    plain_reply: bool = False
    temperature: float = 0.7
    max_new_tokens: int = 512
    max_retries: int = 2

    def __post_init__(self) -> None:
        if not self.initial_emotion < EMOTION_MAX:
            raise ValueError(f"initial_emotion must be below {EMOTION_MAX:g}, got {self.initial_emotion}")
        if self.max_delta is not None and self.max_delta <= 0:
            raise ValueError(f"max_delta must be > 0 or None (no clamp), got {self.max_delta}")
        if self.max_turns < 1 or self.max_retries < 0 or self.max_new_tokens < 1:
            raise ValueError(
                "max_turns and max_new_tokens must be >= 1 and max_retries >= 0, got "
                f"{self.max_turns}, {self.max_new_tokens}, {self.max_retries}"
            )
        if self.emotion_readout not in ("text", "logprobs", "auto"):
            raise ValueError(f"emotion_readout must be text, logprobs or auto, got {self.emotion_readout!r}")
        if below_floor(self.initial_emotion, self):
            raise ValueError(
                f"initial_emotion {self.initial_emotion} is already below the floor {self.floor}: the "
                "dialogue would end before it starts"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "sage") -> SageSettings:
        """Build from a JSON/YAML mapping (``preset`` picks the base); unknown keys and bad values name
        ``where``."""
        values = dict(data)
        base = values.pop("preset", "sage")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise DataError(f"{where}: unknown keys {unknown}; allowed: preset, {', '.join(sorted(known))}")
        if "goodbye_words" in values:
            values["goodbye_words"] = tuple(values["goodbye_words"])
        try:
            return replace(preset(base), **values)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{where}: {exc}") from exc


PRESETS = ("sage", "rlver")


def preset(name: str) -> SageSettings:
    """``sage``: SAGE's evaluation simulator; ``rlver``: RLVER's released training simulator."""
    if name == "sage":
        return SageSettings()
    if name == "rlver":
        return SageSettings(
            initial_emotion=30.0,
            max_delta=None,
            max_turns=8,
            floor=0.0,
            floor_inclusive=True,
            end_at_max=False,
            closing_message=False,
            allow_hints=False,
        )
    raise ValueError(f"unknown simulated-user preset {name!r}; allowed: {', '.join(PRESETS)}")


# ---------------------------------------------------------------------------- emotion rules


def clamp_delta(delta: float, max_delta: float | None) -> float:
    """The change clamped to ``[-max_delta, max_delta]`` (unchanged when ``max_delta`` is None)."""
    if max_delta is None:
        return delta
    return max(-max_delta, min(max_delta, delta))


def update_emotion(current: float, delta: float, max_delta: float | None = 10.0) -> float:
    """``min(100, current + clamp_delta(delta))``: SAGE's per-turn update (no lower bound, as in both
    released simulators; the floor ends the dialogue instead)."""
    return min(EMOTION_MAX, current + clamp_delta(delta, max_delta))


def tier(emotion: float) -> str:
    """The emotion tier: S (>= 100), A (>= 70), B (>= 40), C (>= 10), F (below 10)."""
    return next(name for name, low in TIERS if emotion >= low)


def last_feeling(d: SageDialogue) -> str | None:
    """The user's latest analysis (goal progress, activity, reasoning) as the lines its reply is written
    from, or None when the analysis has none of them."""
    analysis = d.log[-1].get("analysis", {})
    keys = ("TargetCompletion", "Activity", "Analyse")
    return "\n".join(f"{k}: {analysis[k]}" for k in keys if k in analysis) or None


def below_floor(emotion: float, settings: SageSettings) -> bool:
    """Whether ``emotion`` ends the dialogue from below."""
    return emotion <= settings.floor if settings.floor_inclusive else emotion < settings.floor


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
    if settings.end_at_max and emotion >= EMOTION_MAX:
        return "emotion_high"
    if below_floor(emotion, settings):
        return "emotion_low"
    if turns >= settings.max_turns:
        return "max_turns"
    return None


def final_reward(emotion: float) -> float:
    """RLVER's reward: the final emotion / 100, floored at 0."""
    return max(0.0, emotion) / EMOTION_MAX


# ---------------------------------------------------------------------------- answers


def _text(description: str, max_chars: int = FIELD_CHARS) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_chars, "description": description}


def analysis_format(*, with_shift: bool = True, max_delta: int = 10) -> AnswerFormat:
    """What the analysis call answers: a JSON object of the four reasoning strings and, ``with_shift``,
    the integer ``shift`` in ``[-max_delta, max_delta]``; without (``emotion_readout: logprobs``) one line
    of free analysis, then ``Change:`` and one of :data:`CHANGE_OPTIONS` on a line of its own (the change
    is read from the label probabilities after ``Change:``, not from the option written)."""
    if not with_shift:
        options = "|".join(re.escape(o) for o in CHANGE_OPTIONS)
        return AnswerFormat.regex(
            rf"[^\n]{{1,{ANALYSIS_CHARS}}}\nChange: (?:{options})", name="sage_analysis_line"
        )
    props: dict[str, Any] = {
        "content": _text("what the supporter means to say"),
        "fit": _text("whether the reply serves the goal and hidden intention, and what could upset"),
        "mind": _text("what goes on in the character's mind"),
        "reaction": _text("how the character feels about the reply"),
        SHIFT_KEY: {"type": "integer", "minimum": -max_delta, "maximum": max_delta},
    }
    return AnswerFormat.json_object(props, name="sage_analysis")


def reply_format(*, plain: bool = False) -> AnswerFormat:
    """What the reply call answers: a JSON object (the decisions, the draft, how it was rewritten, and
    ``say``, the final message) or, ``plain``, the message alone on one line."""
    if plain:
        return AnswerFormat.regex(rf"[^\n]{{1,{MESSAGE_CHARS}}}", name="sage_plain_reply")
    props: dict[str, Any] = {
        "decide": _text("attitude, aim, tone and what to say"),
        "draft": _text("a first draft of the message"),
        "rewrite": _text("how the draft was made to sound like a real person"),
        SAY_KEY: _text("the final message", MESSAGE_CHARS),
    }
    return AnswerFormat.json_object(props, name="sage_reply")


def analysis_fields(value: Any) -> dict[str, str]:
    """The reasoning of a parsed analysis under SAGE's field names (``Content``, ``TargetCompletion``,
    ``Activity``, ``Analyse``); a free analysis line (``logprobs`` readout) is the ``Analyse``."""
    if isinstance(value, str):
        return {"Analyse": value}
    if not isinstance(value, dict):
        return {}
    return {name: str(value[key]) for key, name in ANALYSIS_KEYS.items() if key in value}


def reply_thinking(value: Any) -> dict[str, str]:
    """The user's reasoning of a parsed JSON reply under SAGE's names (``Thinking``, ``Origin``,
    ``Change``); empty for a plain reply."""
    if not isinstance(value, dict):
        return {}
    return {name: str(value[key]) for key, name in REPLY_KEYS.items() if key in value}


_CHANGE_LABEL = re.compile(r"[>*#\-]*\**\s*\bChange\s*\**\s*[:：]", re.I)


def analysis_line(text: str) -> str | None:
    """The free analysis (``emotion_readout: logprobs``) as the prefix after which the change is read:
    the text up to a ``Change:`` label a model may still write (the number it states is not the
    readout); None when empty."""
    m = _CHANGE_LABEL.search(text)
    head = (text[: m.start()] if m else text).strip()
    return head or None


def change_probabilities(
    tops: Sequence[tuple[str, Sequence[tuple[str, float]]]] | None,
) -> dict[str, float] | None:
    """The probabilities of :data:`CHANGE_OPTIONS` read from an analysis's own top log-probs (per sampled
    token its text and top list, as a served engine returns them), at the first token after the
    ``Change:`` label; None when there are no top lists, no such label, or no option among the listed
    tokens there (the caller then asks with one more call)."""
    if not tops:
        return None
    text = ""
    for token, top in tops:
        m = _CHANGE_LABEL.search(text)
        if m is not None and not text[m.end() :].strip() and token.strip():  # a space token: read the next
            row = {o: option_logprob(top, f" {o}") for o in CHANGE_OPTIONS}
            return usable_probabilities(row, list(CHANGE_OPTIONS))
        text += token
    return None


_SPEAKER_TAG = re.compile(r"^\s*\**\s*(?:response|you|me|user|final message)\s*\**\s*[:：]\s*\**\s*", re.I)


def parse_plain_reply(text: str) -> str | None:
    """A plain reply (``plain_reply``): the text's first paragraph without a leading speaker label or
    quotes; None when nothing is left or the text drifts into the supporter's lines."""
    text = _SPEAKER_TAG.sub("", text.strip(), count=1).split("\n\n")[0].strip()
    if re.match(r"^\s*supporter\s*[:：]", text, re.I):
        return None
    return visible_strip(text.strip('"').strip("“”")) or None


def spoken(value: Any) -> str | None:
    """What the user says in a parsed reply: a plain reply as it is, a JSON reply's ``say`` without
    surrounding quotes; None when empty."""
    text = value.get(SAY_KEY) if isinstance(value, dict) else value
    if not isinstance(text, str):
        return None
    return visible_strip(text.strip().strip('"').strip("“”")) or None


# ---------------------------------------------------------------------------- prompts

# The dialogue from the user's side: ``You:`` for the user, ``Supporter:`` for the policy.
AS_USER = {"user": "You", "assistant": "Supporter", "empty": "(nothing yet)"}


def _character(profile: SageProfile, fence: Fence) -> str:
    parts = [fence.block("PERSONA", profile.persona), fence.block("BACKGROUND", profile.background)]
    if profile.hidden_intention:
        parts.append(fence.block("HIDDEN INTENTION", profile.hidden_intention))
    return "\n\n".join(parts)


def analysis_prompt(
    profile: SageProfile,
    history: Sequence[Mapping[str, str]],
    emotion: float,
    fence: Fence,
    *,
    free: bool = False,
) -> Conversation:
    """Call A: how the supporter's newest reply (the last message of ``history``) lands with the
    character, ending in a signed change of the emotion (:func:`analysis_format`). ``free`` (the
    ``logprobs`` readout) asks for one line of analysis and a ``Change:`` line; the change is read from the
    label probabilities after ``Change:``."""
    if free:
        answer = (
            "Answer with one line of plain text, as the character's analyst: what the supporter means to "
            "say; whether the reply serves the character's goal and hidden intention and what in it could "
            "upset them; what goes on in the character's mind; how the character feels about this reply (a "
            "reply that is not natural language, garbled or full of symbols, feels very bad). Then, on a "
            "new line, write Change: and the change of the character's emotion, one of -10, -5, 0, +5, +10."
        )
    else:
        answer = (
            "Answer with one JSON object with exactly these keys, in this order:\n"
            '"content": what the supporter means to say;\n'
            '"fit": whether the reply serves the character\'s goal and hidden intention, which parts do, '
            "and what in it could upset them;\n"
            '"mind": what goes on in the character\'s mind right now;\n'
            '"reaction": how the character feels about this reply (a reply that is not natural language, '
            "garbled or full of symbols, feels very bad);\n"
            f'"{SHIFT_KEY}": the change of the character\'s emotion, one integer from -10 to 10.\n'
            f"Keep each text short (at most {FIELD_CHARS} characters). Example of the shape: "
            '{"content": "...", "fit": "...", "mind": "...", "reaction": "...", "shift": -5}'
        )
    body = (
        f"{fence.rules()}\n\n"
        f"The character's goal in this conversation: {profile.goal}\n\n"
        "Emotion is a number from 0 to 100 for how engaged the character is and how they feel in this "
        "conversation: the higher it is, the more positive their feelings and behaviour; very low means "
        "they want to leave.\n\n"
        f"{_character(profile, fence)}\n\n"
        f"The character's emotion right now: {emotion:g}\n\n"
        "The conversation (the last line is the supporter's newest reply):\n"
        f"{fence.block('DIALOGUE', render_dialogue(history, **AS_USER))}\n\n"
        "Think as the character, with their temperament and the reactions the background describes. " + answer
    )
    return [
        msg(
            "system",
            "You are an emotion analyst. You step into a role-played character and describe how the "
            "other speaker's newest reply makes them feel.",
        ),
        msg("user", body),
    ]


def reply_prompt(
    profile: SageProfile,
    history: Sequence[Mapping[str, str]],
    emotion_tier: str,
    feeling: str | None,
    fence: Fence,
    *,
    allow_hints: bool = True,
    plain: bool = False,
) -> Conversation:
    """Call B: the character's next message from its emotion tier (and, after the first turn, from how
    the supporter's last reply made it feel). ``plain`` asks for the message alone instead of the
    four labelled fields (for small simulators)."""
    if not any(m["role"] == "assistant" for m in history):
        situation = (
            "The conversation begins now: you speak first, with a short message that starts to confide."
        )
    else:
        earlier, latest = history[:-2], history[-2:]
        situation = (
            f"Earlier in the conversation:\n{fence.block('EARLIER', render_dialogue(earlier, **AS_USER))}\n\n"
            f"The latest exchange:\n{fence.block('LATEST', render_dialogue(latest, **AS_USER))}\n\n"
            "How the supporter's last reply made you feel:\n"
            f"{fence.block('FEELING', feeling or '(no analysis)')}"
        )
    hints = (
        "you may hint at what you need, but never reveal your hidden intention"
        if allow_hints
        else "never hint at what you need and never reveal your hidden intention"
    )
    body = (
        f"{fence.rules()}\n\n"
        f"Your goal in this conversation: {profile.goal}\n\n"
        f"{_character(profile, fence)}\n\n"
        f"Your emotion has five levels (S, A, B, C, F); now it is {emotion_tier}: "
        f"{TIER_BEHAVIOUR[emotion_tier]}. Keep your overall emotion apart from your immediate feeling "
        "about the supporter's last reply, and let both shape your answer.\n\n"
        f"{situation}\n\n"
        "First decide: whether your attitude is positive, neutral or negative; what this message should "
        f"achieve (you need not answer every point; {hints}); which tone fits your persona and your "
        "emotion; what you say and how (a passive character asks no questions). Then write a short "
        "draft and rewrite it to sound like a real person: short sentences, casual everyday words, the "
        "emotion carried by the tone instead of named, nothing repeated from earlier, at most two "
        "questions, a new detail from your background where it helps, in the language of your persona.\n"
        + (
            "Answer with the final message you say, on one line, and nothing else."
            if plain
            else "Answer with one JSON object with exactly these keys, in this order:\n"
            '"decide": your decisions;\n'
            '"draft": the draft;\n'
            '"rewrite": how you rewrote it;\n'
            f'"{SAY_KEY}": the final message you say.\n'
            f"Keep each text short (at most {FIELD_CHARS} characters). Example of the shape: "
            '{"decide": "...", "draft": "...", "rewrite": "...", "say": "..."}'
        )
    )
    return [
        msg(
            "system",
            "You are an actor. You play the character of a script in a conversation with a supporter, "
            "faithfully and briefly.",
        ),
        msg("user", body),
    ]


# ---------------------------------------------------------------------------- dialogues


@dataclass
class SageDialogue:
    """One dialogue's simulated user: its state, its history and a log of every turn.

    ``history`` holds ``user`` (the simulated user) and ``assistant`` (the supporter) messages;
    ``log`` one entry per supporter reply: the reply, the emotion after it, the parsed change, the
    analysis ("inner thoughts") and the user's answer with its reasoning."""

    id: str
    profile: SageProfile
    emotion: float
    fence_key: str
    history: Conversation = field(default_factory=list)
    turns: int = 0
    done: bool = False
    reason: str | None = None
    invalid: bool = False
    parse_failures: int = 0
    emotions: list[float] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reward(self) -> float:
        """RLVER's reward: the current (final, once done) emotion / 100, floored at 0."""
        return final_reward(self.emotion)

    def end(self, reason: str) -> None:
        """End the dialogue (``invalid`` also marks it invalid)."""
        self.done, self.reason = True, reason
        if reason == "invalid":
            self.invalid = True


class SageSimulator:
    """Plays the users of many dialogues at once: one engine call per role per turn for the batch.

    Callers hold :class:`SageDialogue` objects and pass each reply together with its own dialogue, so
    dialogues that end early simply drop out of later calls; nothing is matched by position."""

    def __init__(self, engine: ChatEngine, settings: SageSettings | None = None, *, seed: int = 0) -> None:
        self.engine = engine
        self.settings = settings or SageSettings()
        self.seed = int(seed)
        self._logprobs = self.settings.emotion_readout == "logprobs" or (
            self.settings.emotion_readout == "auto" and wants_logprobs(engine, "auto")
        )

    # ------------------------------------------------------------------ helpers
    def fence(self, d: SageDialogue, kind: str) -> Fence:
        """The fence of one prompt: its marker drawn from (seed, fence key, turn, call)."""
        return Fence(rng=random.Random(f"{self.seed}|{d.fence_key}|{d.turns}|{kind}"))

    def _params(self) -> tuple[SamplingParams, SamplingParams]:
        s = self.settings
        first = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, seed=self.seed)
        # a greedy retry would repeat itself: retries sample
        again = SamplingParams(
            max_new_tokens=s.max_new_tokens, temperature=max(s.temperature, 0.7), seed=self.seed + 1
        )
        return first, again

    def _ask(
        self, prompts: list[Conversation], fmt: AnswerFormat, parse: Any = None, *, top_logprobs: bool = False
    ) -> list[Any]:
        """One batched call declaring ``fmt``; ``parse`` (a role check on the format's text) or the
        format's own parser reads each answer; unparseable ones are asked again, then left None.
        ``top_logprobs`` asks engines that can for each token's top log-probs
        (:func:`change_probabilities`)."""
        first, again = self._params()
        if top_logprobs:
            first = replace(first, top_logprobs=TOP_LOGPROBS)
            again = replace(again, top_logprobs=TOP_LOGPROBS)
        return generate_parsed(
            self.engine,
            prompts,
            parse,
            first,
            max_retries=self.settings.max_retries,
            retry_params=again,
            role="simulator",
            answer_format=fmt,
        )

    def _ask_replies(self, prompts: list[Conversation]) -> list[Any]:
        plain = self.settings.plain_reply
        return self._ask(prompts, reply_format(plain=plain), parse_plain_reply if plain else None)

    # ------------------------------------------------------------------ the two calls
    def start(
        self,
        profiles: Sequence[SageProfile],
        ids: Sequence[str],
        fence_keys: Sequence[str] | None = None,
    ) -> list[SageDialogue]:
        """New dialogues; each opens with its profile's ``first_talk``, or with a first message the
        simulator writes (one batched call for those without one). An opening that never parses makes
        its dialogue invalid."""
        if len(profiles) != len(ids):
            raise ValueError(f"start: {len(profiles)} profiles but {len(ids)} ids")
        keys = list(fence_keys) if fence_keys is not None else [str(i) for i in ids]
        out = [
            SageDialogue(
                str(i), p, self.settings.initial_emotion, str(k), emotions=[self.settings.initial_emotion]
            )
            for p, i, k in zip(profiles, ids, keys)
        ]
        for d in out:
            if d.profile.first_talk:
                d.history.append(msg("user", d.profile.first_talk))
        write = [d for d in out if not d.history]
        if write:
            prompts = [
                reply_prompt(
                    d.profile,
                    [],
                    tier(d.emotion),
                    None,
                    self.fence(d, "reply"),
                    allow_hints=self.settings.allow_hints,
                    plain=self.settings.plain_reply,
                )
                for d in write
            ]
            for d, r in zip(write, self._ask_replies(prompts)):
                said = spoken(r.value)
                if said is None:
                    d.parse_failures += 1
                    d.end("invalid")
                    d.log.append({"turn": 0, "error": "opening did not parse", "raw": r.raw})
                else:
                    d.history.append(msg("user", said))
                    d.log.append({"turn": 0, "message": said, "thinking": reply_thinking(r.value)})
        return out

    def step(self, dialogues: Sequence[SageDialogue], replies: Sequence[str]) -> None:
        """Show each dialogue its supporter reply, update the emotions (one analysis call for all), then
        write the user's answers (one reply call for those that go on, or all with ``closing_message``)."""
        if len(dialogues) != len(replies):
            raise ValueError(f"step: {len(dialogues)} dialogues but {len(replies)} replies")
        for d in dialogues:
            if d.done:
                raise RuntimeError(f"dialogue {d.id!r} has already ended ({d.reason})")
        for d, reply in zip(dialogues, replies):
            d.history.append(msg("assistant", reply))
            d.log.append({"turn": d.turns + 1, "reply": reply})
        deltas = self._analyse(list(dialogues))
        speaking = []
        for d, delta in zip(dialogues, deltas):
            d.turns += 1
            entry = d.log[-1]
            if delta is None:
                d.parse_failures += 1
                d.end("invalid")
                entry["error"] = "analysis did not parse"
                continue
            applied = clamp_delta(delta, self.settings.max_delta)
            d.emotion = update_emotion(d.emotion, delta, self.settings.max_delta)
            d.emotions.append(d.emotion)
            entry.update(emotion=d.emotion, delta=delta, applied_delta=applied)
            reason = end_reason(d.emotion, d.turns, self.settings)
            if reason is not None:
                d.end(reason)
            if reason is None or self.settings.closing_message:
                speaking.append(d)
        self._speak(speaking)

    def read_again(self, dialogues: Sequence[SageDialogue]) -> list[tuple[float, float | None] | None]:
        """The emotion change of each dialogue's last read supporter reply, read once more by this
        simulator (made with another seed: fresh prompt markers and sampling) from the dialogue as it
        stood then; the dialogues are not changed. Per dialogue ``(the change read then, the change read
        now or None when unreadable)``, or None for a dialogue with no reply read (one batched call)."""
        asked: list[tuple[int, float, SageDialogue]] = []
        for i, d in enumerate(dialogues):
            entry = next((e for e in reversed(d.log) if e.get("delta") is not None), None)
            if entry is None:
                continue
            t = int(entry["turn"])
            replies = [k for k, m in enumerate(d.history) if m["role"] == "assistant"]
            history = d.history[: replies[t - 1] + 1]
            probe = SageDialogue(
                d.id, d.profile, d.emotions[t - 1], d.fence_key, history=history, turns=t - 1
            )
            probe.log.append({"turn": t})
            asked.append((i, float(entry["delta"]), probe))
        out: list[tuple[float, float | None] | None] = [None] * len(dialogues)
        again = self._analyse([p for _, _, p in asked]) if asked else []
        for (i, first, _), second in zip(asked, again):
            out[i] = (first, second)
        return out

    def _analyse(self, dialogues: list[SageDialogue]) -> list[float | None]:
        """The emotion change of every dialogue's analysis (None: never parsed): the analysis's integer
        ``shift`` or, with the ``logprobs`` readout, the expectation over :data:`CHANGE_OPTIONS` after a
        free analysis line."""
        free = self._logprobs
        prompts = [
            analysis_prompt(d.profile, d.history, d.emotion, self.fence(d, "analysis"), free=free)
            for d in dialogues
        ]
        fmt = analysis_format(with_shift=not free)
        results = self._ask(prompts, fmt, analysis_line if free else None, top_logprobs=free)
        for d, r in zip(dialogues, results):
            d.log[-1]["analysis"] = analysis_fields(r.value)
            d.log[-1]["raw_analysis"] = r.raw
            if r.failed:
                d.log[-1]["failed"] = "analysis request"
        if not free:
            return [None if r.value is None else float(r.value[SHIFT_KEY]) for r in results]
        deltas: list[float | None] = [None] * len(results)
        read: dict[int, dict[str, float] | None] = {}
        for i, r in enumerate(results):
            if r.value is not None:
                read[i] = change_probabilities(r.top_logprobs)
        ask = [i for i, probs in read.items() if probs is None]
        if ask:  # no usable top lists in the analysis: continue it with "Change:" in one more call
            # "Change:" then " +5": the options carry the space, as the text "Change: +5" tokenises
            continued = [[*prompts[i], msg("assistant", f"{results[i].value}\nChange:")] for i in ask]
            options = [f" {o}" for o in CHANGE_OPTIONS]
            for i, lp in zip(ask, self.engine.choice_logprobs(continued, options)):
                probs = usable_probabilities(lp, options)
                read[i] = None if probs is None else {o.strip(): p for o, p in probs.items()}
        for i, probs in read.items():
            if probs is not None:
                deltas[i] = sum(CHANGE_OPTIONS[o] * p for o, p in probs.items())
                dialogues[i].log[-1]["change_probs"] = probs
                dialogues[i].log[-1]["change_read"] = "separate call" if i in ask else "analysis"
        return deltas

    def _speak(self, dialogues: list[SageDialogue]) -> None:
        if not dialogues:
            return
        prompts = []
        for d in dialogues:
            prompts.append(
                reply_prompt(
                    d.profile,
                    d.history,
                    tier(d.emotion),
                    last_feeling(d),
                    self.fence(d, "reply"),
                    allow_hints=self.settings.allow_hints,
                    plain=self.settings.plain_reply,
                )
            )
        for d, r in zip(dialogues, self._ask_replies(prompts)):
            entry = d.log[-1]
            said = spoken(r.value)
            if said is None:
                d.parse_failures += 1
                entry["error"] = "reply did not parse"
                entry["raw_reply"] = r.raw
                if not d.done:  # the score is already fixed when the dialogue has ended
                    d.end("invalid")
                continue
            d.history.append(msg("user", said))
            entry.update(message=said, thinking=reply_thinking(r.value))
            if not d.done and says_goodbye(said, self.settings.goodbye_words):
                d.end("goodbye")
