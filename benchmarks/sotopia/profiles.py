"""Load SOTOPIA scenarios: sotopia's own JSON objects, and our bundled English set.

A path is a JSON file (one object or a list of objects) or a folder of such files (sotopia's local JSON
storage keeps one object per file). Objects are recognised by their fields:

* ``EnvironmentProfile``: ``scenario`` + ``agent_goals`` (two goals), ``codename``, ``relationship``
  (sotopia's integer 0..5 or its name), ``pk``; optional ``hard`` (bool). With an inline ``agents`` list
  of two agent profiles it is a complete pair by itself (the format of our bundled set).
* ``AgentProfile``: ``first_name``, ``last_name``, ``age``, ``occupation``, ``gender``,
  ``gender_pronoun`` (or ``pronouns``), ``public_info``, ``personality_and_values``, ``secret``, ``pk``, ...
* ``EnvAgentComboStorage``: ``env_id`` + ``agent_ids`` (two agent pks): pairs an environment with agents.
* a sotopia ``ScriptBackground``-style background: ``scenario``, ``p1_name``, ``p2_name``,
  ``p1_background``, ``p2_background``, ``p1_goal``, ``p2_goal``.

An environment whose ``pk`` is in SOTOPIA-hard (:data:`SOTOPIA_HARD_ENV_IDS`) is marked hard.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rapo_echo.benchmarks.sotopia.agent import RELATIONSHIPS, AgentProfile, EnvironmentProfile
from rapo_echo.errors import DataError
from rapo_echo.jsonl import loads, read_utf8
from rapo_echo.text import is_blank

log = logging.getLogger(__name__)

# SOTOPIA-hard environment ids (sotopia-lab/sotopia-rl data/env_ids.txt; same set in sotopia-pi).
SOTOPIA_HARD_ENV_IDS = frozenset(
    {
        "01H7VFHNV13MHN97GAH73E3KM8",
        "01H7VFHN5WVC5HKKVBHZBA553R",
        "01H7VFHN9W0WAFZCBT09PKJJNK",
        "01H7VFHPDZVVCDZR3AARA547CY",
        "01H7VFHPQQQY6H4DNC6NBQ8XTG",
        "01H7VFHN7WJK7VWVRZZTQ6DX9T",
        "01H7VFHPS5WJW2694R1MNC8JFY",
        "01H7VFHNN7XTR99319DS8KZCQM",
        "01H7VFHQ11NAMZS4A2RDGDB01V",
        "01H7VFHPSWGDGEYRP63H2DJKV0",
        "01H7VFHNF4G18PC9JHGRC8A1R6",
        "01H7VFHNNYH3W0VRWVY178K2TK",
        "01H7VFHP8AN5643B0NR0NP00VE",
        "01H7VFHN7A1ZX5KSMT2YN9RXC4",
    }
)
_RELATION_ALIASES = {
    "romantic": "romantic_relationship",
    "family": "family_member",
    "acquaintances": "acquaintance",
    "friends": "friend",
    "strangers": "stranger",
}


@dataclass(frozen=True)
class SotopiaPair:
    """A scenario and the two agents who play it."""

    env: EnvironmentProfile
    agents: tuple[AgentProfile, AgentProfile]


def bundled_scenarios_path() -> Path:
    """Our English SOTOPIA-style scenarios shipped with the package."""
    return Path(__file__).resolve().parent / "sotopia_en.json"


def load_sotopia(path: str | Path | None = None) -> list[SotopiaPair]:
    """Every scenario/agent pair in ``path`` (default: the bundled English set), in file order."""
    path = Path(path) if path is not None else bundled_scenarios_path()
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise DataError(f"{path}: folder holds no .json files")
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"{path}: SOTOPIA data file or folder not found")
    objects: list[tuple[str, Any]] = []
    for file in files:
        data = loads(read_utf8(file, "SOTOPIA data file"), str(file))
        items = data if isinstance(data, list) else [data]
        objects.extend(
            (f"{file}: item {i}" if isinstance(data, list) else str(file), obj) for i, obj in enumerate(items)
        )
    return pairs_from_objects(objects, str(path))


def pairs_from_objects(objects: Sequence[tuple[str, Any]], source: str) -> list[SotopiaPair]:
    """Pairs from ``(where, object)`` items of any accepted kind (see the module docstring)."""
    envs: dict[str, tuple[EnvironmentProfile, str]] = {}
    agents: dict[str, AgentProfile] = {}
    combos: list[tuple[str, str, list[str]]] = []
    pairs: list[SotopiaPair] = []
    for where, obj in objects:
        if not isinstance(obj, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if "p1_name" in obj:
            pairs.append(_background_pair(obj, where))
        elif "agent_goals" in obj:
            env = environment_from_json(obj, where)
            if "agents" in obj:
                inline = obj["agents"]
                if not isinstance(inline, list) or len(inline) != 2:
                    raise DataError(f"{where}: field 'agents' must list exactly two agent profiles")
                a, b = (agent_from_json(x, f"{where} agents[{k}]") for k, x in enumerate(inline))
                pairs.append(SotopiaPair(env, (a, b)))
            else:
                envs[env.pk or env.codename] = (env, where)
        elif "first_name" in obj:
            agent = agent_from_json(obj, where)
            if not agent.pk:
                raise DataError(f"{where}: an agent profile outside a scenario needs a 'pk' to be referenced")
            agents[agent.pk] = agent
        elif "env_id" in obj and "agent_ids" in obj:
            combos.append((where, str(obj["env_id"]), [str(x) for x in obj["agent_ids"]]))
        else:
            raise DataError(
                f"{where}: not a SOTOPIA object: expected an EnvironmentProfile (scenario, agent_goals), "
                "an AgentProfile (first_name, ...), an EnvAgentComboStorage (env_id, agent_ids) "
                "or a background (p1_name, ...)"
            )
    used: set[str] = set()
    for where, env_id, agent_ids in combos:
        if env_id not in envs:
            raise DataError(f"{where}: env_id {env_id!r} names no environment profile in {source}")
        missing = [a for a in agent_ids if a not in agents]
        if len(agent_ids) != 2 or missing:
            raise DataError(
                f"{where}: agent_ids must name two loaded agent profiles; missing: {missing or agent_ids}"
            )
        pairs.append(SotopiaPair(envs[env_id][0], (agents[agent_ids[0]], agents[agent_ids[1]])))
        used.add(env_id)
    unpaired = [where for key, (_, where) in envs.items() if key not in used]
    if unpaired:
        log.warning(
            "%d environment profile(s) in %s have no agents (no inline 'agents' and no EnvAgentComboStorage "
            "{env_id, agent_ids}) and are skipped, first: %s",
            len(unpaired),
            source,
            unpaired[0],
        )
    if not pairs:
        raise DataError(
            f"{source}: no SOTOPIA scenario with two agents found: give environments an 'agents' list of two "
            "profiles, or add EnvAgentComboStorage objects {env_id, agent_ids}"
        )
    return pairs


def _text(obj: dict[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = obj.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{key}' must be a string, got {type(value).__name__}")
    if required and is_blank(value):
        raise DataError(f"{where}: field '{key}' is missing or empty")
    return value.strip()


def relationship_name(value: Any, where: str) -> str:
    """sotopia's relationship as a name; accepts its integer (0..5) or name."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(RELATIONSHIPS):
        return RELATIONSHIPS[value]
    if isinstance(value, str):
        key = "_".join(value.strip().lower().replace("-", " ").split())
        key = _RELATION_ALIASES.get(key, key)
        if key in RELATIONSHIPS:
            return key
    raise DataError(
        f"{where}: field 'relationship' is {value!r}; expected 0..5 or one of {', '.join(RELATIONSHIPS)}"
    )


def environment_from_json(obj: dict[str, Any], where: str) -> EnvironmentProfile:
    """An :class:`EnvironmentProfile` from sotopia's JSON fields."""
    goals = obj.get("agent_goals")
    if (
        not isinstance(goals, list)
        or len(goals) != 2
        or not all(isinstance(g, str) and not is_blank(g) for g in goals)
    ):
        raise DataError(f"{where}: field 'agent_goals' must be a list of two non-empty strings")
    hard = obj.get("hard", False)
    if not isinstance(hard, bool):
        raise DataError(f"{where}: field 'hard' must be true or false")
    pk = _text(obj, "pk", where)
    codename = _text(obj, "codename", where) or pk
    if not codename:
        raise DataError(f"{where}: an environment needs a 'codename' or a 'pk'")
    return EnvironmentProfile(
        codename=codename,
        scenario=_text(obj, "scenario", where, required=True),
        agent_goals=(goals[0].strip(), goals[1].strip()),
        relationship=relationship_name(obj.get("relationship", 0), where),
        pk=pk,
        source=_text(obj, "source", where),
        hard=hard or pk in SOTOPIA_HARD_ENV_IDS,
    )


def agent_from_json(obj: Any, where: str) -> AgentProfile:
    """An :class:`AgentProfile` from sotopia's JSON fields."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: an agent profile must be a JSON object")
    age = obj.get("age")
    if age is not None and not (isinstance(age, int) and not isinstance(age, bool)):
        if isinstance(age, str) and age.strip().isdigit():
            age = int(age)
        else:
            raise DataError(f"{where}: field 'age' must be an integer, got {age!r}")
    pronouns = _text(obj, "gender_pronoun", where) or _text(obj, "pronouns", where)
    return AgentProfile(
        first_name=_text(obj, "first_name", where, required=True),
        last_name=_text(obj, "last_name", where),
        age=age,
        occupation=_text(obj, "occupation", where),
        gender=_text(obj, "gender", where),
        pronouns=pronouns,
        public_info=_text(obj, "public_info", where),
        personality_and_values=_text(obj, "personality_and_values", where),
        secret=_text(obj, "secret", where),
        decision_making_style=_text(obj, "decision_making_style", where),
        pk=_text(obj, "pk", where),
    )


def _background_pair(obj: dict[str, Any], where: str) -> SotopiaPair:
    names = [_text(obj, f"p{k}_name", where, required=True) for k in (1, 2)]
    people = []
    for k, name in zip((1, 2), names):
        first, _, last = name.partition(" ")
        people.append(
            AgentProfile(first_name=first, last_name=last, public_info=_text(obj, f"p{k}_background", where))
        )
    env = EnvironmentProfile(
        codename=_text(obj, "codename", where) or f"{names[0]}-{names[1]}".lower().replace(" ", "_"),
        scenario=_text(obj, "scenario", where, required=True),
        agent_goals=(
            _text(obj, "p1_goal", where, required=True),
            _text(obj, "p2_goal", where, required=True),
        ),
        relationship=relationship_name(obj.get("relationship", "acquaintance"), where),
    )
    return SotopiaPair(env, (people[0], people[1]))
