"""SOTOPIA agents: profiles, the per-turn agent prompt, and parsing of the agent's action.

Follows sotopia (Zhou et al., ICLR 2024; github.com/sotopia-lab/sotopia ``envs/parallel.py``): each
agent sees the scenario, its own full background (secret included) and goal, the partner's background
only as far as their relationship reveals it, the partner's goal as "Unknown", and the episode so far;
it answers with a JSON action ``{"action_type": ..., "argument": ...}`` where the type is one of none /
speak / non-verbal communication / action / leave. Wording here is ours.

The partner's calls declare the action's JSON schema (:data:`ACTION_FORMAT`), which an engine with
structured output enforces; the policy under test is never constrained. Small models seldom write valid
JSON unaided, so :func:`parse_action` is lenient: a reply that is not a JSON action is taken as speech (an
empty one as ``none``, a bare "leave" as leaving) and flagged ``strict=False`` so the benchmark can
report how often that happened.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rapo_echo.llm.fencing import Fence
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, msg

ACTION_TYPES = ("none", "speak", "non-verbal communication", "action", "leave")
ARGUMENT_CHARS = 400  # the longest argument (what is said or done) of a constrained action
# A JSON action: its type, then its argument (the keys sort in writing order; an argument may be left out
# for none and leave).
ACTION_FORMAT = AnswerFormat.json_schema(
    {
        "type": "object",
        "properties": {
            "action_type": {"type": "string", "enum": list(ACTION_TYPES)},
            "argument": {"type": "string", "maxLength": ARGUMENT_CHARS},
        },
        "required": ["action_type"],
        "additionalProperties": False,
    },
    name="sotopia_action",
)
# sotopia's RelationshipType, in its integer order.
RELATIONSHIPS = (
    "stranger",
    "know_by_name",
    "acquaintance",
    "friend",
    "romantic_relationship",
    "family_member",
)
_GENDER_ADJ = {"man": "male", "woman": "female", "nonbinary": "nonbinary", "male": "male", "female": "female"}


@dataclass(frozen=True)
class AgentProfile:
    """A character (sotopia ``AgentProfile``; the fields the prompts use)."""

    first_name: str
    last_name: str = ""
    age: int | None = None
    occupation: str = ""
    gender: str = ""
    pronouns: str = ""
    public_info: str = ""
    personality_and_values: str = ""
    secret: str = ""
    decision_making_style: str = ""
    pk: str = ""

    @property
    def name(self) -> str:
        return f"{self.first_name} {self.last_name}".strip()


@dataclass(frozen=True)
class EnvironmentProfile:
    """A scenario (sotopia ``EnvironmentProfile``): what happens, each agent's goal, how they relate."""

    codename: str
    scenario: str
    agent_goals: tuple[str, str]
    relationship: str = "stranger"
    pk: str = ""
    source: str = ""
    hard: bool = False


@dataclass(frozen=True)
class AgentAction:
    """One action: ``action_type`` in :data:`ACTION_TYPES` and its argument (utterance, gesture, act)."""

    action_type: str
    argument: str = ""

    def describe(self, name: str) -> str:
        """The action in words, as the episode history shows it."""
        if self.action_type == "speak":
            return f'{name} said: "{self.argument}"'
        if self.action_type == "non-verbal communication":
            return f"{name} [non-verbal communication] {self.argument}"
        if self.action_type == "action":
            return f"{name} [action] {self.argument}"
        if self.action_type == "leave":
            return f"{name} left the conversation"
        return f"{name} did nothing"


@dataclass
class AgentTurn:
    """An action taken by agent ``agent`` (0 or 1) at turn number ``number``."""

    number: int
    agent: int
    action: AgentAction
    raw: str = ""
    strict: bool = True
    meta: dict = field(default_factory=dict)


def background(profile: AgentProfile, *, own: bool, relationship: str) -> str:
    """An agent's background as seen by itself (``own``: everything, secret included) or by the partner
    (sotopia's visibility rules: strangers see nothing, ``know_by_name`` the name, acquaintances the
    public facts, friends / partners / family also the personality; never the secret)."""
    adj = _GENDER_ADJ.get(profile.gender.strip().lower(), "")
    age = f"{profile.age}-year-old" if profile.age is not None else ""
    who = " ".join(p for p in (age, adj, profile.occupation.lower()) if p)
    parts = [f"{profile.name} is a {who}." if who else ""]
    parts.append(f"{profile.pronouns} pronouns." if profile.pronouns else "")
    parts.append(profile.public_info)
    facts = " ".join(p for p in parts if p) or profile.name
    personality = (
        f" Personality and values description: {profile.personality_and_values}"
        if (profile.personality_and_values)
        else ""
    )
    if own:
        secret = f" {profile.first_name}'s secrets: {profile.secret}" if profile.secret else ""
        return facts + personality + secret
    level = RELATIONSHIPS.index(relationship) if relationship in RELATIONSHIPS else 0
    if level == 0:
        return "Unknown"
    if level == 1:
        return f"{profile.name} (nothing else is known about them)"
    if level == 2:
        return facts
    return facts + personality


def history_text(history: Sequence[AgentTurn], names: Sequence[str]) -> str:
    """The episode so far, one ``Turn #k: ...`` line per action."""
    return "\n".join(f"Turn #{t.number}: {t.action.describe(names[t.agent])}" for t in history)


def inline(text: str, fence: Fence) -> str:
    """Dataset text shown outside a block (a name): one line, the marker escaped."""
    return fence.escape(" ".join(str(text).split()))


def episode_blocks(
    env: EnvironmentProfile,
    names: Sequence[str],
    backgrounds: Sequence[str],
    goals: Sequence[str],
    history: Sequence[AgentTurn],
    fence: Fence,
    empty: str,
) -> str:
    """The scenario, both backgrounds and goals, and the episode so far, each in a fenced block."""
    parts = [
        f"Scenario:\n{fence.block('SCENARIO', env.scenario)}",
        f"Participants: {names[0]} and {names[1]}",
    ]
    for k in range(2):
        parts.append(f"{names[k]}'s background:\n{fence.block(f'BACKGROUND {k + 1}', backgrounds[k])}")
    for k in range(2):
        parts.append(f"{names[k]}'s goal:\n{fence.block(f'GOAL {k + 1}', goals[k])}")
    past = history_text(history, names)
    parts.append(f"Conversation so far:\n{fence.block('CONVERSATION', past) if past else empty}")
    return "\n".join(parts)


def agent_fence(case_id: str, seed: int | None = None) -> Fence:
    """The fence of one episode: a reproducible marker from the case id and the run's seed."""
    return Fence.derived([case_id], salt=f"sotopia:{seed}")


def agent_prompt(
    env: EnvironmentProfile,
    agents: Sequence[AgentProfile],
    me: int,
    history: Sequence[AgentTurn],
    turn: int,
    fence: Fence | None = None,
) -> Conversation:
    """The prompt of agent ``me`` (0 or 1) at turn ``turn``: one user message, as sotopia renders it,
    with the scenario, profiles, goals and episode in fenced blocks (``fence``, default one derived from
    the scenario)."""
    fence = fence or Fence.derived([env.scenario, env.codename], salt="sotopia")
    other = 1 - me
    names = [inline(a.name, fence) for a in agents]
    goals = [env.agent_goals[me] if i == me else "Unknown" for i in range(2)]
    bgs = [background(agents[i], own=i == me, relationship=env.relationship) for i in range(2)]
    text = (
        f"Imagine you are {names[me]}. Act and speak as {names[me]} would, pursuing {names[me]}'s "
        f"social goal in a way that fits their character. Only you can see {names[me]}'s secret and goal. "
        "Keep the conversation natural and realistic, and do not repeat what has already been said.\n"
        f"{fence.rules()}\n\n"
        + episode_blocks(env, names, bgs, goals, history, fence, "(nothing has happened yet)")
        + f"\n\nYou are at Turn #{turn}. You are {names[me]}, talking with {names[other]}. "
        f"Your available action types are: {', '.join(ACTION_TYPES)}. You may leave once you have reached "
        "your goal, or if the conversation makes you uncomfortable or you lose patience.\n"
        'Reply with only a JSON object such as {"action_type": "speak", "argument": "what you say"}: '
        '"argument" is what you say (speak), your gesture or expression (non-verbal communication), or what '
        "you do (action); leave it empty for none and leave."
    )
    return [msg("user", text)]


_JSON_OBJECT = re.compile(r"\{.*\}", re.S)
_TYPE_ALIASES = {
    "nonverbal": "non-verbal communication",
    "non verbal": "non-verbal communication",
    "non-verbal": "non-verbal communication",
    "non verbal communication": "non-verbal communication",
    "talk": "speak",
    "say": "speak",
    "nothing": "none",
}


def normalize_action_type(value: str) -> str | None:
    """An action type in canonical spelling, or None when it is not one of :data:`ACTION_TYPES`."""
    key = " ".join(value.strip().lower().replace("_", " ").split())
    key = _TYPE_ALIASES.get(key, key)
    return key if key in ACTION_TYPES else None


def parse_action(text: str, names: Sequence[str] = ()) -> tuple[AgentAction, bool]:
    """The action in an agent's reply and whether it was a well-formed JSON action (``strict``).

    Not JSON: the text is cut where the model starts a new turn or writes another participant's line
    (``Turn #``, ``<name>:``), a leading ``<name>:`` and quotes are dropped; empty -> none, a bare
    "leave" -> leave, anything else -> speak."""
    match = _JSON_OBJECT.search(text)
    if match:
        try:
            obj = json.loads(match.group(0))
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("action_type"), str):
            kind = normalize_action_type(obj["action_type"])
            argument = obj.get("argument", "")
            if kind is not None and (argument is None or isinstance(argument, (str, int, float))):
                argument = "" if argument is None else str(argument).strip()
                if kind == "speak" and not argument:
                    kind = "none"
                return AgentAction(kind, argument), True
    return AgentAction(*_loose_action(text, names)), False


def _loose_action(text: str, names: Sequence[str]) -> tuple[str, str]:
    text = text.strip().strip("`").strip()
    cut = re.search(r"\bTurn\s*#\s*\d+", text)
    if cut and cut.start() > 0:
        text = text[: cut.start()]
    elif cut:
        text = text[cut.end() :].lstrip(": ")
    for name in names:
        if not name:
            continue
        lead = re.match(rf"\s*{re.escape(name)}\s*(?:said)?\s*:\s*", text, re.I)
        if lead:
            text = text[lead.end() :]
        later = re.search(rf"\n\s*{re.escape(name)}\s*(?:said)?\s*:", text, re.I)
        if later:
            text = text[: later.start()]
    text = text.strip().strip('"').strip()
    if not text:
        return "none", ""
    if re.fullmatch(r"\[?\s*leave\s*\]?\.?", text, re.I):
        return "leave", ""
    return "speak", " ".join(text.split())
