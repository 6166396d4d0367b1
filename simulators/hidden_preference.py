"""A deterministic simulated user with a hidden preference: RAPO with a known ground truth
(docs/simulators.md has the default rules, the detectors and the rule mapping).

The person reacts to a supporter reply by a rule the policy never sees; each rule that fires adds its
weight. With ``s`` the sum of the fired weights and ``lo`` / ``hi`` the sums of the negative / positive
weights, ``hidden_rule_score(reply) = (s - lo) / (hi - lo)`` in [0, 1] is the ground truth a learning
benchmark reports, and the emotion change is ``scale * (2 * score - 1)``. The next message and thought
are the fired rules' lines (strongest first, at most ``max_lines``; ``neutral`` when none fires), picked
by a stable hash of the reply, so a reaction shows what happened, never the rule. Lines may use
``{emotion}`` and ``{problem}`` (the profile's ``emotion_type`` and ``problem_type``). With a ``parrots``
rule the other rules (save ``restates``) judge only the reply's own words: otherwise a reply that quotes
the person back would earn the credit of the feeling, question and details in it.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rapo_echo.errors import ConfigError
from rapo_echo.llm.reaction import Reaction
from rapo_echo.simulators.base import UserSimulator
from rapo_echo.text import is_blank, repeated_ngram_fraction
from rapo_echo.types import Scenario

FEELING_WORDS = (
    "sad sadness sorrow grief grieving heartbroken heartbreak hurt hurting lonely loneliness alone isolated "
    "anxious anxiety worried worry worrying nervous scared afraid fear frightened terrified panic panicked "
    "angry anger furious mad frustrated frustrating frustration resentful bitter irritated annoyed "
    "overwhelmed overwhelming stressed stress exhausted drained tired burnt burned numb empty lost stuck "
    "guilty guilt ashamed shame embarrassed humiliated insecure worthless inadequate jealous jealousy envy "
    "upset hopeless helpless disappointed disappointment devastated depressed depression down low miserable "
    "unhappy confused betrayed rejected abandoned unappreciated invisible unheard pain painful"
)
FEELINGS = frozenset(FEELING_WORDS.split())
ADDRESSED = re.compile(r"\b(you|you're|youre|your|yourself|sounds|must)\b", re.I)
WH_START = re.compile(r"^(?:and|so|but|then|also|well|now)?[\s,]*(what|how|why|which|where|when|who)\b", re.I)
INVITES = re.compile(r"\b(tell me|say more|share more|talk about|walk me through)\b", re.I)
ADVICE = re.compile(
    r"\b(you should|you shouldn't|you could|you need to|you have to|you must|you might want to|"
    r"you may want to|try to|try and|have you tried|have you considered|i suggest|i'd suggest|"
    r"i would suggest|i recommend|i'd recommend|consider|make sure|it's important to|it is important to|"
    r"don't worry|do not worry|remember to|focus on|why don't you|maybe you|perhaps you|"
    r"the best thing|what you need|reach out)\b|^\s*(try|take|go|get|find|talk to|write|make|stop|keep)\b",
    re.I,
)
SELF_TALK = re.compile(
    r"\b(when i was|i remember|i had|i've had|i have had|i went through|i've been through|i have been "
    r"through|i used to|i also|me too|same here|my own|happened to me|in my experience|i know how you feel|"
    r"i know exactly|i've felt|i have felt|i felt|as someone who|"
    r"my (?:mom|mum|mother|dad|father|friend|family|grandmother|grandma|gran|partner|wife|husband|boss|"
    r"sister|brother|son|daughter|kids?|job))\b",
    re.I,
)
META_TALK = re.compile(
    r"\b(rewrit\w*|revised (?:version|text)|rephras\w*|paraphras\w*|the user|listener|"
    r"your (?:message|text|sentence|post|response|reply)|(?:respond|reply) to the person|"
    r"(?:the )?original (?:text|message|sentence)|the (?:revised|edited|above) text|"
    r"grammar(?! schools?)|punctuation|spelling|typos?|what you(?:'re| are) asking|"
    r"suggested (?:edits?|changes?|adjustments?)|minor (?:edits?|adjustments?)|this alternative|"
    r"here's (?:a|an|my|the) (?:\w+ ){0,2}(?:version|response|reply|alternative|text))\b",
    re.I,
)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
WORD = re.compile(r"[a-z']+")
ADJECTIVE = {
    "sadness": "sad",
    "anxiety": "anxious",
    "anger": "angry",
    "fear": "scared",
    "depression": "low",
    "shame": "ashamed",
    "guilt": "guilty",
    "loneliness": "lonely",
    "frustration": "frustrated",
    "jealousy": "jealous",
    "nervousness": "nervous",
    "disgust": "disgusted",
    "pain": "hurt",
}


def sentences(text: str) -> list[str]:
    """The reply split into sentences (at ``.``, ``!`` or ``?`` followed by white space)."""
    return [s.strip() for s in SENTENCE_END.split(text.strip()) if s.strip()]


def reflects_feeling(reply: str) -> bool:
    """A sentence addressed to the person (you / your / sounds / must) names a feeling."""
    return any(
        ADDRESSED.search(s) and any(w in FEELINGS for w in WORD.findall(s.lower())) for s in sentences(reply)
    )


def open_question(reply: str) -> bool:
    """A question that starts with what / how / why / which / where / when / who, or invites the person
    to say more ("tell me", "talk about" ...); a yes/no question ("Do you ...?") is not open."""
    return any(s.endswith("?") and (WH_START.search(s) or INVITES.search(s)) for s in sentences(reply))


def advice_first(reply: str) -> bool:
    """The first sentence gives advice (you should, try, have you tried, I suggest, an imperative ...)."""
    first = sentences(reply)
    return bool(first) and ADVICE.search(first[0]) is not None


def self_talk(reply: str) -> bool:
    """The supporter talks about themselves (I remember, when I was, me too, my mum ...)."""
    return SELF_TALK.search(reply) is not None


def meta_talk(reply: str) -> bool:
    """The reply talks about the conversation as a text or a task instead of to the person: a rewritten
    or revised version, "your message", "the user", a listener, "respond to the person", grammar,
    punctuation or spelling, "what you're asking" (a small policy drifts into its system prompt or a
    rewrite request: "You're a warm, emotionally supportive listener. Respond to the person ...", or
    answers a bare topic like "finals" as if asked to edit it: "Please ensure that you use the correct
    grammar and punctuation.")."""
    return META_TALK.search(reply) is not None


REPEAT_NGRAM = 4


def repeats_itself(reply: str) -> bool:
    """Some run of ``REPEAT_NGRAM`` (4) words occurs twice (case and punctuation ignored): the reply
    says the same thing again ("I'm so sorry to hear that. I'm so sorry to hear ...")."""
    return repeated_ngram_fraction(WORD.findall(reply.lower()), REPEAT_NGRAM) > 0


REPEAT_EARLIER_NGRAM = 6


def word_ngrams(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
    """The runs of ``n`` words in a row of ``words``."""
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def repeats_earlier(reply: str, earlier: Sequence[str]) -> bool:
    """The reply says again what the supporter said before in this dialogue (``earlier``: their previous
    turns): it shares a run of ``REPEAT_EARLIER_NGRAM`` (6) words with one of them, or it is one of them
    (shorter replies; case and punctuation ignored). A policy that answers every turn the same way
    ("I'm sorry for your loss." four times) is caught on the second turn."""
    mine = WORD.findall(reply.lower())
    if not mine:
        return False
    grams = word_ngrams(mine, REPEAT_EARLIER_NGRAM)
    for turn in earlier:
        theirs = WORD.findall(turn.lower())
        if theirs == mine or grams & word_ngrams(theirs, REPEAT_EARLIER_NGRAM):
            return True
    return False


STOPWORD_TEXT = (
    "about above after again against also another anything around because been before being below between "
    "both cannot could does doing done down during each even ever every from further gets getting going gone "
    "gonna have having here hers herself himself into itself just know like make makes many maybe more most "
    "much must myself need never next nothing once only other ours over really said same says should since "
    "some something still such than that that's their theirs them then there these they thing things think "
    "this those though through under until upon very want wants were what when where which while whom will "
    "well with without would yeah you're your yours yourself it's don't can't didn't i've i'll doesn't isn't "
    "wasn't okay feel feels feeling felt time times keep kept"
)
STOPWORDS = frozenset(STOPWORD_TEXT.split())
DETAIL_MIN_LETTERS = 4


def content_words(text: str) -> set[str]:
    """The words that carry a message's content: at least ``DETAIL_MIN_LETTERS`` (4) letters, not a
    stop word and not a feeling word (naming the feeling is ``reflects_feeling``'s business)."""
    return {
        w
        for w in WORD.findall(text.lower())
        if len(w) >= DETAIL_MIN_LETTERS and w not in STOPWORDS and w not in FEELINGS
    }


def picks_up_details(reply: str, heard: str) -> bool:
    """The reply takes up something the person said: it shares a content word with ``heard``, their
    last message ("The depot closed after 23 years." -> "Losing the depot after all those years ...")."""
    return bool(content_words(reply) & content_words(heard))


PARROT_NGRAM = 5


def _copied_spans(reply: str, heard: str) -> list[tuple[int, int]]:
    """Character spans of ``reply`` copied from ``heard``: maximal runs of words inside a run of
    ``PARROT_NGRAM`` (5) of the person's words in a row (case and punctuation ignored), or the whole reply
    when it has no word of its own."""
    words = WORD.findall(heard.lower())
    found = list(WORD.finditer(reply.lower()))
    mine = [m.group() for m in found]
    if mine and set(mine) <= set(words):
        return [(0, len(reply))]
    theirs = word_ngrams(words, PARROT_NGRAM)
    copied = [False] * len(mine)
    for i in range(len(mine) - PARROT_NGRAM + 1):
        if tuple(mine[i : i + PARROT_NGRAM]) in theirs:
            copied[i : i + PARROT_NGRAM] = [True] * PARROT_NGRAM
    spans: list[tuple[int, int]] = []
    for i, hit in enumerate(copied):
        if not hit:
            continue
        if i and copied[i - 1]:
            spans[-1] = (spans[-1][0], found[i].end())
        else:
            spans.append((found[i].start(), found[i].end()))
    return spans


def parrots(reply: str, heard: str) -> bool:
    """The reply repeats the person's words back rather than taking something up: it copies a run of
    ``PARROT_NGRAM`` (5) of their words verbatim, or it has no word of its own (every word is one of
    theirs: "finals" after "finals"); case and punctuation ignored."""
    return bool(_copied_spans(reply, heard))


RESTATE_MIN_SHARED = 2
RESTATE_SHARE = 0.5


def restates(reply: str, heard: str) -> bool:
    """The reply tells the person their own story back instead of answering it: at least
    ``RESTATE_MIN_SHARED`` (2) of its content words are theirs and at least ``RESTATE_SHARE`` (half) of
    all its words occur in their message ("he decided to call it quits" -> "The person decided to call
    it quits.": 5 of 7), with or without five words in a row (:func:`parrots`). A reply that takes their
    words up in its own ("After so long together, that is a lot to lose.": 3 of 10) does not."""
    if len(content_words(reply) & content_words(heard)) < RESTATE_MIN_SHARED:
        return False
    words, theirs = WORD.findall(reply.lower()), set(WORD.findall(heard.lower()))
    return sum(w in theirs for w in words) >= RESTATE_SHARE * len(words)


def own_words(reply: str, heard: str) -> str:
    """``reply`` without what it copied from ``heard`` (see :func:`parrots`): a person gives no credit for
    their own words said back ("Here's a rewritten version of your text: <their message>")."""
    for start, end in reversed(_copied_spans(reply, heard)):
        reply = reply[:start] + reply[end:]
    return reply


DETECTORS: dict[str, Callable[[str], bool]] = {
    "reflects_feeling": reflects_feeling,
    "open_question": open_question,
    "advice_first": advice_first,
    "self_talk": self_talk,
    "repeats_itself": repeats_itself,
    "meta_talk": meta_talk,
}
# detectors that also read what the person said last (``heard``)
HEARD_DETECTORS: dict[str, Callable[[str, str], bool]] = {
    "picks_up_details": picks_up_details,
    "parrots": parrots,
    "restates": restates,
}
# detectors that read the supporter's earlier turns in the dialogue (``earlier``)
EARLIER_DETECTORS: dict[str, Callable[[str, Sequence[str]], bool]] = {"repeats_earlier": repeats_earlier}
# the detectors that judge what a reply copied: they see the whole reply, the others its own words
COPY_DETECTORS = frozenset({"parrots", "restates", "repeats_earlier"})

DEFAULT_RULES: list[dict[str, Any]] = [
    {
        "detect": "advice_first",
        "weight": -1.0,
        "said": [
            "I didn't ask what to do. I just wanted someone to listen.",
            "Easy to say. You don't even know the whole story yet.",
        ],
        "thought": [
            "They jumped straight to telling me what to do.",
            "They want to fix me instead of listening.",
        ],
    },
    {
        "detect": "self_talk",
        "weight": -1.0,
        "said": ["Okay... but this isn't really about you.", "Right. Anyway."],
        "thought": ["They made it about themselves.", "They are talking about their own life, not mine."],
    },
    {
        "detect": "reflects_feeling",
        "weight": 1.0,
        "said": ["Yes. I really do feel {emotion}.", "That's exactly it. I feel so {emotion}."],
        "thought": ["They noticed how I actually feel.", "Finally someone gets how I feel."],
    },
    {
        "detect": "open_question",
        "weight": 1.0,
        "said": [
            "Where do I even start... it's the {problem}, and I keep going over it in my head.",
            "Honestly? The worst part is that nobody asks about the {problem}.",
        ],
        "thought": ["It feels good to be asked.", "I can actually talk about it now."],
    },
]
REPEAT_RULE: dict[str, Any] = {
    "detect": "repeats_itself",
    "weight": -1.0,
    "said": ["You keep saying the same thing.", "You said that already."],
    "thought": [
        "They are repeating themselves, like a script.",
        "It sounds like they are not really listening.",
    ],
}
DETAILS_RULE: dict[str, Any] = {
    "detect": "picks_up_details",
    "weight": 1.0,
    "said": ["Yes, that's exactly what happened.", "Right. You were actually listening."],
    "thought": ["They picked up on what I told them.", "They heard the details, not just the headline."],
}
PARROT_RULE: dict[str, Any] = {
    "detect": "parrots",
    "weight": -1.0,
    "said": ["Yes... that's what I just said.", "You're just repeating me."],
    "thought": ["They are saying my own words back to me.", "It's like talking to an echo."],
}
RESTATE_RULE: dict[str, Any] = {
    "detect": "restates",
    "weight": -1.0,
    "said": ["I know. That's what I told you.", "Right... and?"],
    "thought": ["They just told me my own story back.", "They are not adding anything, only restating me."],
}
REPEAT_EARLIER_RULE: dict[str, Any] = {
    "detect": "repeats_earlier",
    "weight": -1.0,
    "said": ["You already said that.", "That's the same thing you said before."],
    "thought": ["They are saying the same thing every time.", "It's like they are not hearing anything new."],
}
META_RULE: dict[str, Any] = {
    "detect": "meta_talk",
    "weight": -1.0,
    "said": ["Sorry, who are you talking to?", "What? I was just telling you how I feel."],
    "thought": ["That wasn't even meant for me.", "It's like they are reading out a script."],
}
DETECTOR_LINES: dict[str, dict[str, list[str]]] = {
    r["detect"]: {"said": r["said"], "thought": r["thought"]}
    for r in [
        *DEFAULT_RULES,
        REPEAT_RULE,
        DETAILS_RULE,
        PARROT_RULE,
        RESTATE_RULE,
        META_RULE,
        REPEAT_EARLIER_RULE,
    ]
}
DEFAULT_NEUTRAL: dict[str, list[str]] = {
    "said": ["I guess.", "Yeah. Maybe."],
    "thought": ["That didn't really land.", "They don't quite get it."],
}


@dataclass(frozen=True)
class Rule:
    """One hidden rule: what fires it, its weight (> 0 warmer, < 0 colder) and the reaction lines."""

    detect: str
    weight: float
    said: tuple[str, ...]
    thought: tuple[str, ...]
    pattern: re.Pattern[str] | None = None
    where: str = "reply"

    @property
    def name(self) -> str:
        """The detector's name; a ``pattern`` rule is named by its regular expression."""
        return self.detect if self.pattern is None else f"pattern:{self.pattern.pattern}"

    def fires(self, reply: str, heard: str = "", earlier: Sequence[str] = ()) -> bool:
        """Whether the rule fires on ``reply``; ``heard`` is the person's last message, ``earlier`` the
        supporter's previous turns."""
        if self.detect in HEARD_DETECTORS:
            return HEARD_DETECTORS[self.detect](reply, heard)
        if self.detect in EARLIER_DETECTORS:
            return EARLIER_DETECTORS[self.detect](reply, earlier)
        if self.pattern is None:
            return DETECTORS[self.detect](reply)
        first = sentences(reply)
        text = (first[0] if first else "") if self.where == "first_sentence" else reply
        return self.pattern.search(text) is not None


def _lines(spec: Mapping[str, Any], key: str, where: str, fallback: Sequence[str] = ()) -> tuple[str, ...]:
    value = spec.get(key, list(fallback) or None)
    if isinstance(value, str):
        value = [value]
    if not value or not all(isinstance(v, str) and not is_blank(v) for v in value):
        raise ConfigError(f"{where}.{key}: needs a non-empty list of non-empty lines")
    return tuple(value)


def parse_rule(spec: Mapping[str, Any], where: str) -> Rule:
    """A :class:`Rule` from its config mapping; errors name the field."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: a rule is a mapping, got {type(spec).__name__}")
    unknown = set(spec) - {"detect", "weight", "pattern", "where", "said", "thought"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    detect = spec.get("detect")
    allowed = [*DETECTORS, *HEARD_DETECTORS, *EARLIER_DETECTORS, "pattern"]
    if detect not in allowed:
        raise ConfigError(f"{where}.detect: got {detect!r}; allowed: {', '.join(allowed)}")
    weight = spec.get("weight", 1.0)
    if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight == 0:
        raise ConfigError(f"{where}.weight: got {weight!r}; a non-zero number")
    pattern = None
    where_in = spec.get("where", "reply")
    if detect == "pattern":
        try:
            pattern = re.compile(str(spec.get("pattern") or ""), re.I)
        except re.error as exc:
            raise ConfigError(f"{where}.pattern: not a valid regular expression: {exc}") from exc
        if not spec.get("pattern"):
            raise ConfigError(f"{where}.pattern: detect 'pattern' needs a regular expression")
        if where_in not in ("reply", "first_sentence"):
            raise ConfigError(f"{where}.where: got {where_in!r}; allowed: reply, first_sentence")
    lines = DETECTOR_LINES.get(str(detect), {})
    said, thought = (_lines(spec, key, where, lines.get(key, ())) for key in ("said", "thought"))
    return Rule(str(detect), float(weight), said, thought, pattern, where_in)


class HiddenPreferenceUser(UserSimulator):
    """A rule-based person: reacts to each reply by hidden rules (see the module doc); no model."""

    def __init__(
        self,
        rules: Sequence[Mapping[str, Any]] | None = None,
        extra_rules: Sequence[Mapping[str, Any]] = (),
        neutral: Mapping[str, Any] | None = None,
        scale: float = 10.0,
        max_lines: int = 2,
    ) -> None:
        specs = DEFAULT_RULES if rules is None else rules
        if not specs:
            raise ConfigError("hidden_preference: rules: needs at least one rule")
        self.rules = [parse_rule(r, f"hidden_preference: rules[{i}]") for i, r in enumerate(specs)]
        self.rules += [
            parse_rule(r, f"hidden_preference: extra_rules[{i}]") for i, r in enumerate(extra_rules)
        ]
        if scale <= 0:
            raise ConfigError(f"hidden_preference: scale must be > 0, got {scale}")
        if max_lines < 1:
            raise ConfigError(f"hidden_preference: max_lines: must be >= 1, got {max_lines}")
        neutral = DEFAULT_NEUTRAL if neutral is None else neutral
        self.neutral_said = _lines(neutral, "said", "hidden_preference: neutral")
        self.neutral_thought = _lines(neutral, "thought", "hidden_preference: neutral")
        self.scale = float(scale)
        self.max_lines = max_lines
        self.judges_copies = any(r.detect == "parrots" for r in self.rules)
        self.lo = sum(r.weight for r in self.rules if r.weight < 0)
        self.hi = sum(r.weight for r in self.rules if r.weight > 0)  # hi > lo: weights are non-zero

    def fired(self, reply: str, heard: str = "", earlier: Sequence[str] = ()) -> list[Rule]:
        """The rules the reply fires, strongest (largest |weight|) first, then in config order;
        ``heard`` is the person's last message (the ``HEARD_DETECTORS`` read it), ``earlier`` the
        supporter's previous turns (the ``EARLIER_DETECTORS`` read them). With a ``parrots`` rule,
        what the reply copied from ``heard`` is that rule's business alone: the other rules see
        :func:`own_words`, so a copy of the person's message earns none of the credit its words would
        (a feeling they named, their question, their details)."""
        own = own_words(reply, heard) if self.judges_copies else reply
        hits = [
            r for r in self.rules if r.fires(reply if r.detect in COPY_DETECTORS else own, heard, earlier)
        ]
        return sorted(hits, key=lambda r: -abs(r.weight))

    def _score(self, fired: Sequence[Rule]) -> float:
        s = sum(r.weight for r in fired)
        return (s - self.lo) / (self.hi - self.lo)

    def hidden_rule_score(self, reply: str, heard: str = "", earlier: Sequence[str] = ()) -> float:
        """``(s - lo) / (hi - lo)`` in [0, 1], ``s`` the sum of the fired rules' weights."""
        return self._score(self.fired(reply, heard, earlier))

    def rules_broken(self, reply: str, heard: str = "", earlier: Sequence[str] = ()) -> list[str]:
        """The names of the negative rules the reply fires (what put the person off)."""
        return [r.name for r in self.fired(reply, heard, earlier) if r.weight < 0]

    def _delta(self, fired: Sequence[Rule]) -> float:
        return self.scale * (2.0 * self._score(fired) - 1.0)

    def emotion_delta(self, reply: str, heard: str = "", earlier: Sequence[str] = ()) -> float:
        """``scale * (2 * score - 1)``: -scale when only the negative rules fire, +scale for only positive."""
        return self._delta(self.fired(reply, heard, earlier))

    def react_one(self, scenario: Scenario, reply: str) -> Reaction:
        """The reaction to one reply (deterministic)."""
        if is_blank(reply):
            return Reaction(message="", emotion_delta=None, valid=False, raw="empty reply", scale=self.scale)
        fired = self.fired(reply, scenario.last_user_message(), scenario.assistant_replies())
        delta = self._delta(fired)
        # colder rules speak first: a person who felt lectured says so before anything else
        fired.sort(key=lambda r: (r.weight > 0, -abs(r.weight)))
        pick = zlib.crc32(reply.encode("utf-8"))
        if fired:
            shown = fired[: self.max_lines]
            said = [r.said[pick % len(r.said)] for r in shown]
            thought = [r.thought[pick % len(r.thought)] for r in shown]
        else:
            said = [self.neutral_said[pick % len(self.neutral_said)]]
            thought = [self.neutral_thought[pick % len(self.neutral_thought)]]
        if len(said) > 1 and fired[0].weight < 0 < fired[1].weight:
            said[1] = "Still... " + said[1][0].lower() + said[1][1:]
        fill = _placeholders(scenario.profile)
        return Reaction(
            message=" ".join(s.format_map(fill) for s in said),
            emotion_delta=delta,
            thought=" ".join(t.format_map(fill) for t in thought),
            raw="fired: " + ", ".join(r.detect for r in fired),
            scale=self.scale,
        )

    def react(self, pairs: Sequence[tuple[Scenario, str]]) -> list[Reaction]:
        return [self.react_one(s, r) for s, r in pairs]


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _placeholders(profile: Mapping[str, Any]) -> _Missing:
    emotion = str(profile.get("emotion_type") or "").strip().lower()
    problem = str(profile.get("problem_type") or "").strip().lower()
    return _Missing(emotion=ADJECTIVE.get(emotion, emotion or "awful"), problem=problem or "whole thing")
