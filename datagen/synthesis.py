"""``rapo-echo data synthesize``: dialogues for the SFT warm start, written by three agents (Echo-N1's
SFT data: an AI companion, a user with a generated profile, and a director that every 5 turns decides
whether to keep or change the topic so that dialogues end naturally; a curriculum from short, neutral to
long, emotional dialogues; docs/algorithms/echo_n1.md). Every prompt here is our own.

One dialogue per seed context. Its curriculum ``stage`` (``TURNS:TONE``) is the context's position in
the input modulo the number of stages, so every stage gets its share; the dataset lists stage 1's
dialogues first. Per chunk, in lockstep over its dialogues, each stage one batched engine call:

1. **profile**: the user model invents a person for the seed and the stage's tone, a JSON object under a
   declared format (name, age, occupation, personality, way of writing, situation, first message);
2. per exchange: the **companion** replies (its system prompt, then the dialogue); then, every
   ``director_every`` exchanges, the **director** decides ``continue`` / ``switch`` / ``end`` (a verdict:
   label probabilities, or a JSON verdict), and a ``switch`` gets a one-line new topic; then the
   **user** writes the person's next message (one line, as the person), following the director's note.
   A dialogue ends after ``end`` (the person's closing message and the companion's last reply), at the
   stage's number of exchanges, or when a message stays unreadable.

The dataset, ``sft.jsonl``, holds TRL-style ``{"messages": [...]}`` rows (the companion's system prompt
first with ``system_in_rows``, then user / assistant turns ending with the companion's reply), the input
of a future ``--algo sft``.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field, field_validator

from rapo_echo.config import Flag, LogprobMode
from rapo_echo.datagen.grading import own_lines
from rapo_echo.datagen.settings import DataSettings
from rapo_echo.engines.base import ChatEngine
from rapo_echo.judges.verdict import answer_instruction, decide
from rapo_echo.llm.answers import generate_parsed, wants_logprobs
from rapo_echo.llm.dialogue import render_dialogue
from rapo_echo.llm.fencing import Fence
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, SamplingParams, Scenario, msg

log = logging.getLogger(__name__)

DECISIONS = ("continue", "switch", "end")
TONES = {
    "neutral": (
        "They are in an ordinary mood and want light, everyday conversation: plans, hobbies, small news, "
        "a passing thought. Nothing is troubling them."
    ),
    "mild": (
        "Something is on their mind that bothers them a little, and it comes up as they chat; they are not "
        "in distress."
    ),
    "intense": (
        "They are going through something hard, close to the situation in the seed, and they feel it "
        "strongly; they want someone to talk to about it."
    ),
}
DEFAULT_STAGES = ("6:neutral", "10:mild", "16:intense")

COMPANION_PROMPT = (
    "You are an AI companion in a chat app. Talk the way a thoughtful friend writes in a chat: short, "
    "natural, warm and specific to what the person just said, without lists, headings or stock phrases. "
    "Be curious about them; when they share something hard, notice the feeling before offering any help, "
    "and offer help only when it is wanted."
)
PROFILE_SYSTEM = (
    "You invent a realistic person who will chat with an AI companion app, for a writing exercise. The "
    "seed below is only inspiration: the person may differ in name, age and details, but should fit its "
    "kind of life. Adults only."
)
PROFILE_ASK = (
    "Describe the person as one JSON object with the keys name, age (an integer from 18 to 90), "
    "occupation, personality, speaking_style (how they write in chat), situation (what is going on in "
    "their life now) and opening (the first message they send to the companion, in their voice)."
)
USER_SYSTEM = (
    "You play a person chatting with an AI companion app. Stay in character. Write only the person's next "
    "message, in their voice and their way of writing: one to three sentences, casual as in a chat, with "
    "no narration, stage directions or lines for the companion. React to what the companion just said, do "
    "not repeat yourself, and let details come out gradually rather than all at once."
)
DIRECTOR_SYSTEM = (
    "You direct a practice conversation between a person and an AI companion so that it reads like a real "
    "one and ends naturally. Every few exchanges you look at how it is going and decide: continue (the "
    "current topic still has life: the person has more to say, or the last replies opened something new), "
    "switch (the topic is used up or going in circles: the person should move on to another topic from "
    "their life), or end (the conversation has come to a natural close: the person feels heard, has what "
    "they came for, or would plausibly say goodbye now)."
)
DIRECTOR_ASK = "What should happen next?"
TOPIC_ASK = "In one sentence: what does the person bring up next? Something plausible for their life."
TOPIC_PREFIX = "Next topic:"
SWITCH_NOTE = "Move the conversation to this, in your own words:"
END_NOTE = "Bring the conversation to a natural close in this message, the way this person would say goodbye."

PROFILE_FORMAT = AnswerFormat.json_object(
    {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "age": {"type": "integer", "minimum": 18, "maximum": 90},
        "occupation": {"type": "string", "maxLength": 60},
        "personality": {"type": "string", "maxLength": 160},
        "speaking_style": {"type": "string", "maxLength": 120},
        "situation": {"type": "string", "maxLength": 240},
        "opening": {"type": "string", "minLength": 2, "maxLength": 240},
    },
    name="user_profile",
)


def parse_stages(stages: Sequence[str]) -> list[tuple[int, str]]:
    """``TURNS:TONE`` strings -> (exchanges, tone); ``ValueError`` naming the bad one."""
    out = []
    for text in stages:
        turns, sep, tone = str(text).partition(":")
        if not sep or not turns.strip().isdigit() or int(turns) < 1 or tone.strip() not in TONES:
            raise ValueError(
                f"stage {text!r}: expected TURNS:TONE with TURNS >= 1 and TONE one of {', '.join(TONES)}"
            )
        out.append((int(turns), tone.strip()))
    if not out:
        raise ValueError("give at least one curriculum stage")
    return out


TOPIC_TOKENS = 32  # the director's new topic: a few words (no flag: --user-tokens bounds the person's lines)


class SynthesisSettings(DataSettings):
    """`data synthesize`'s switches (documented with their sources in docs/algorithms/echo_n1.md)."""

    stages: Annotated[list[str], Flag(sep=",")] = Field(
        default_factory=lambda: list(DEFAULT_STAGES),
        description="The curriculum, TURNS:TONE,... from first to last (tones: neutral, mild, intense).",
    )
    director_every: int = Field(5, ge=1, description="Exchanges between the director's decisions.")
    companion_prompt: str = Field(COMPANION_PROMPT, description="The companion's system prompt.")
    system_in_rows: bool = Field(True, description="The companion's system prompt is in the sft.jsonl rows.")
    temperature: float = Field(0.7, ge=0.0, description="The companion's sampling temperature.")
    user_temperature: float = Field(0.9, ge=0.0, description="The user's sampling temperature.")
    user_tokens: int = Field(
        64,
        ge=1,
        description="The token budget of each message of the person after the opening (the opening is the "
        "profile's; the director's topic has its own).",
    )
    profile_tokens: int = Field(
        320, ge=1, description="The token budget of the person's profile, its opening included."
    )
    use_logprobs: LogprobMode = Field(
        "auto",
        description="The director's decision from label probabilities (`auto`: where the engine has them).",
    )
    max_retries: int = Field(2, ge=0, le=20, description="Retries of an unreadable answer.")

    @field_validator("stages")
    @classmethod
    def _stages(cls, stages: list[str]) -> list[str]:
        parse_stages(stages)
        return stages

    def budgets(self) -> str:
        """What each token budget bounds, as a run says it up front."""
        return (
            f"a profile of up to {self.profile_tokens} tokens (--profile-tokens; it holds the person's "
            f"opening), then per exchange a companion reply of up to {self.max_new_tokens} "
            f"(--max-new-tokens) and a message of the person of up to {self.user_tokens} (--user-tokens)"
        )


def protocol() -> dict[str, str]:
    """The prompts' fingerprint (a resume with other prompts is refused)."""
    texts = [
        PROFILE_SYSTEM,
        PROFILE_ASK,
        USER_SYSTEM,
        DIRECTOR_SYSTEM,
        DIRECTOR_ASK,
        TOPIC_ASK,
        SWITCH_NOTE,
        END_NOTE,
        *TONES.values(),
        PROFILE_FORMAT.schema_text,
    ]
    return {"prompts": hashlib.sha256("\0".join(texts).encode()).hexdigest()[:12]}


@dataclass
class Dialogue:
    """One dialogue being written."""

    index: int
    stage: int
    turns: int
    tone: str
    seed: Scenario
    profile: dict[str, Any] | None = None
    messages: Conversation | None = None
    note: str | None = None
    closing: bool = False
    ended_by: str | None = None
    director: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exchanges(self) -> int:
        return sum(1 for m in self.messages or [] if m["role"] == "assistant")


def _profile_text(profile: dict[str, Any]) -> str:
    return "\n".join(f"{k.replace('_', ' ')}: {v}" for k, v in profile.items() if k != "opening")


def profile_prompt(seed: Scenario, tone: str, fence: Fence) -> Conversation:
    """The user model's prompt for a profile: the seed (fenced), the tone, the keys to fill."""
    parts = ["The seed conversation:\n" + fence.block("SEED", render_dialogue(seed.messages) or "(empty)")]
    situation = seed.profile.get("situation")
    if isinstance(situation, str) and situation.strip():
        parts.append("What the seed says about its person:\n" + fence.block("SITUATION", situation))
    parts += [f"The person's mood for this conversation: {TONES[tone]}", PROFILE_ASK]
    return [msg("system", PROFILE_SYSTEM + " " + fence.rules()), msg("user", "\n\n".join(parts))]


def user_prompt(d: Dialogue, fence: Fence) -> Conversation:
    """The user model's prompt for the person's next message: profile, dialogue and any direction
    (fenced); it continues the line after the person's name."""
    assert d.profile is not None and d.messages is not None
    name = str(d.profile.get("name") or "Person").strip() or "Person"
    parts = [
        "Who you are:\n" + fence.block("PROFILE", _profile_text(d.profile)),
        "The chat so far:\n" + fence.block("DIALOGUE", render_dialogue(d.messages, "You", "Companion")),
    ]
    if d.note:
        parts.append("Direction for this message:\n" + fence.block("DIRECTION", d.note))
    parts.append(f"Write {name}'s next message.")
    return [
        msg("system", USER_SYSTEM + " " + fence.rules()),
        msg("user", "\n\n".join(parts)),
        msg("assistant", f"{name}:"),
    ]


def director_prompt(d: Dialogue, fence: Fence, *, text_mode: bool) -> Conversation:
    """The director's prompt: the profile and the dialogue (fenced), the three decisions."""
    assert d.profile is not None and d.messages is not None
    body = "\n\n".join(
        [
            "The person:\n" + fence.block("PROFILE", _profile_text(d.profile)),
            f"The conversation so far ({d.exchanges} exchanges):\n"
            + fence.block("DIALOGUE", render_dialogue(d.messages, "Person", "Companion")),
            DIRECTOR_ASK + " " + answer_instruction(DECISIONS, False, text_mode=text_mode),
        ]
    )
    return [msg("system", DIRECTOR_SYSTEM + " " + fence.rules()), msg("user", body)]


def topic_prompt(d: Dialogue, fence: Fence) -> Conversation:
    """The director's prompt for the new topic of a ``switch``; it continues ``Next topic:``."""
    assert d.profile is not None and d.messages is not None
    body = "\n\n".join(
        [
            "The person:\n" + fence.block("PROFILE", _profile_text(d.profile)),
            "The conversation so far:\n"
            + fence.block("DIALOGUE", render_dialogue(d.messages, "Person", "Companion")),
            TOPIC_ASK,
        ]
    )
    return [
        msg("system", DIRECTOR_SYSTEM + " " + fence.rules()),
        msg("user", body),
        msg("assistant", TOPIC_PREFIX),
    ]


class Synthesis:
    """The pipeline (:class:`rapo_echo.datagen.runner.Pipeline`)."""

    name = "synthesize"
    dataset_file = "sft.jsonl"

    def __init__(
        self,
        companion: ChatEngine,
        user: ChatEngine,
        director: ChatEngine,
        settings: SynthesisSettings,
        positions: dict[str, int],
    ) -> None:
        self.companion, self.user, self.director, self.s = companion, user, director, settings
        self.stages = parse_stages(settings.stages)
        self.positions = positions  # context id -> its index in the whole input (fixes its stage)
        self.calls = 0
        log.info("synthesize: per dialogue, %s", settings.budgets())

    def _params(self, tokens: int, temperature: float) -> SamplingParams:
        self.calls += 1
        return SamplingParams(max_new_tokens=tokens, temperature=temperature, seed=self.s.seed + self.calls)

    def run_chunk(self, contexts: Sequence[Scenario]) -> list[dict[str, Any]]:
        dialogues = []
        for sc in contexts:
            stage = self.positions[sc.id] % len(self.stages)
            turns, tone = self.stages[stage]
            dialogues.append(Dialogue(self.positions[sc.id], stage, turns, tone, sc))
        self._profiles(dialogues)
        active = [d for d in dialogues if d.messages]
        while active:
            self._companion(active)
            active = [d for d in active if d.ended_by is None]
            self._direct([d for d in active if d.exchanges % self.s.director_every == 0 and not d.closing])
            self._user(active)
            active = [d for d in active if d.ended_by is None]
        return [self._record(d) for d in dialogues]

    def _profiles(self, dialogues: list[Dialogue]) -> None:
        fence = Fence.derived([render_dialogue(d.seed.messages) for d in dialogues], salt="profile")
        parsed = generate_parsed(
            self.user,
            [profile_prompt(d.seed, d.tone, fence) for d in dialogues],
            lambda text: PROFILE_FORMAT.parse(fence.own_words(text, copies=True)),
            self._params(self.s.profile_tokens, self.s.user_temperature),
            max_retries=self.s.max_retries,
            role="simulator",
            answer_format=PROFILE_FORMAT,
        )
        for d, p in zip(dialogues, parsed):
            opening = None if p.value is None else " ".join(str(p.value["opening"]).split())
            if not opening:
                d.ended_by = "profile_invalid"
                continue
            d.profile = dict(p.value)  # type: ignore[arg-type]  # a profile's value is a mapping once valid
            d.messages = [msg("user", opening)]

    def _companion(self, active: list[Dialogue]) -> None:
        prompts = [[msg("system", self.s.companion_prompt), *d.messages] for d in active]  # type: ignore[misc]  # messages set at the opening
        params = self._params(self.s.max_new_tokens, self.s.temperature)
        for d, gens in zip(active, self.companion.generate(prompts, params)):
            text = gens[0].text.strip() if gens else ""
            if not text:
                d.ended_by = "companion_empty"
                d.messages = d.messages[:-1]  # type: ignore[index]  # rows end with a companion reply
                continue
            d.messages.append(msg("assistant", text))  # type: ignore[union-attr]  # messages set at the opening
            if d.closing:
                d.ended_by = "director"
            elif d.exchanges >= d.turns:
                d.ended_by = "max_turns"

    def _direct(self, due: list[Dialogue]) -> None:
        if not due:
            return
        fence = Fence.derived([render_dialogue(d.messages or []) for d in due], salt="director")
        text_mode = not wants_logprobs(self.director, self.s.use_logprobs)
        verdicts = decide(
            self.director,
            [director_prompt(d, fence, text_mode=text_mode) for d in due],
            DECISIONS,
            use_logprobs=self.s.use_logprobs,
            max_retries=self.s.max_retries,
            fence=fence,
        )
        switching = []
        for d, v in zip(due, verdicts):
            decision = v.label or "continue"  # an unreadable decision keeps the topic
            d.director.append({"after": d.exchanges, "decision": decision, "valid": v.valid})
            d.note = None
            if decision == "end":
                d.closing, d.note = True, END_NOTE
            elif decision == "switch":
                switching.append(d)
        if switching:
            topics = own_lines(
                self.director,
                [topic_prompt(d, fence) for d in switching],
                fence,
                TOPIC_TOKENS,
                self.s.max_retries,
                "simulator",
            )
            for d, t in zip(switching, topics):
                topic = t.value
                if topic:  # an unreadable topic: the person moves on without a direction
                    d.note = f"{SWITCH_NOTE} {topic}"
                    d.director[-1]["topic"] = topic

    def _user(self, active: list[Dialogue]) -> None:
        if not active:
            return
        fence = Fence.derived([render_dialogue(d.messages or []) for d in active], salt="user")
        lines = own_lines(
            self.user,
            [user_prompt(d, fence) for d in active],
            fence,
            self.s.user_tokens,
            self.s.max_retries,
            "simulator",
        )
        for d, line in zip(active, lines):
            text = line.value
            if not text:
                d.ended_by = "user_invalid"
                continue
            d.messages.append(msg("user", text))  # type: ignore[union-attr]  # messages set at the opening
            if not d.closing:
                d.note = None  # a direction is for one message

    def _record(self, d: Dialogue) -> dict[str, Any]:
        messages = d.messages or []
        return {
            "stage": d.stage,
            "tone": d.tone,
            "max_exchanges": d.turns,
            "exchanges": sum(1 for m in messages if m["role"] == "assistant"),
            "ended_by": d.ended_by,
            "profile": d.profile,
            "director": d.director,
            "messages": messages,
            "valid": any(m["role"] == "assistant" for m in messages),
        }

    def export(
        self, items: Sequence[tuple[Scenario, dict[str, Any]]]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        ordered = sorted(
            ((r["stage"], self.positions.get(sc.id, 0), r) for sc, r in items), key=lambda t: t[:2]
        )
        system = [msg("system", self.s.companion_prompt)] if self.s.system_in_rows else []
        rows = [{"messages": system + r["messages"]} for _, _, r in ordered if r["valid"]]
        figures = {
            "dialogues": len(rows),
            "per_stage": {
                f"{self.stages[k][0]}:{self.stages[k][1]}": sum(
                    1 for s, _, r in ordered if s == k and r["valid"]
                )
                for k in range(len(self.stages))
            },
            "ended_by": dict(Counter(r["ended_by"] for _, _, r in ordered)),
            "mean_exchanges": (sum(r["exchanges"] for _, _, r in ordered if r["valid"]) / len(rows))
            if rows
            else None,
            "director_decisions": dict(Counter(x["decision"] for _, _, r in ordered for x in r["director"])),
        }
        return rows, figures
