"""``sage``: the SAGE-style user (:mod:`.sage`) reacting to one supporter reply, as a single-reply simulator.

The ``emotion_change`` reward with ``simulator: sage`` scores a reply by the emotion change SAGE's analysis
call gives it (``delta / scale``), in our trainer (``--algo grpo``) and, through
:mod:`rapo_echo.integrations.trl_rewards`, as a TRL reward function; RAPO can react with it too.

Per ``(scenario, reply)`` the user is the scenario's profile read as a SAGE profile
(:meth:`~rapo_echo.data.sage_profiles.SageProfile.from_scenario`: ours or an RLVER / SAGE row), at the
preset's starting emotion, with the scenario's visible dialogue (system messages left out) as what was said
so far. One analysis call for the batch gives each reply's change (clamped to the preset's ``max_delta``,
then to ``[-scale, scale]``) and one reply call what the person says next. A reply whose analysis never
parses is invalid (``None``); a person whose answer never parses still gives the change, with an empty
message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rapo_echo.data.sage_profiles import SageProfile
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.llm.reaction import Reaction
from rapo_echo.simulators.base import UserSimulator
from rapo_echo.simulators.sage import SageDialogue, SageSettings, SageSimulator
from rapo_echo.types import Scenario


class SageReactionUser(UserSimulator):
    """The SAGE-style user's reaction to one reply (module doc). ``preset`` (``sage`` or ``rlver``) and
    ``settings`` (:class:`~rapo_echo.simulators.sage.SageSettings` fields) shape the user."""

    def __init__(
        self, engine: Any, scale: float = 10.0, seed: int = 0, preset: str = "sage", **settings: Any
    ) -> None:
        if engine is None:
            raise ConfigError("simulator 'sage' needs a simulator engine (config section 'simulator')")
        try:
            self.settings = SageSettings.from_mapping({"preset": preset, **settings}, "simulator 'sage' args")
        except DataError as exc:
            raise ConfigError(str(exc)) from None
        self.sim = SageSimulator(engine, self.settings, seed=seed)
        self.scale = float(scale)

    def dialogue(self, scenario: Scenario) -> SageDialogue:
        """The user of ``scenario`` with what was said so far, at the starting emotion."""
        start = self.settings.initial_emotion
        history = [dict(m) for m in scenario.messages if m.get("role") in ("user", "assistant")]
        return SageDialogue(
            id=scenario.id,
            profile=SageProfile.from_scenario(scenario),
            emotion=start,
            fence_key=scenario.id,
            history=history,  # type: ignore[arg-type]  # copies of the scenario's Message dicts
            emotions=[start],
        )

    def react(self, pairs: Sequence[tuple[Scenario, str]]) -> list[Reaction | None]:
        dialogues = [self.dialogue(scenario) for scenario, _ in pairs]
        if dialogues:
            self.sim.step(dialogues, [reply for _, reply in pairs])
        out: list[Reaction | None] = []
        for d in dialogues:
            entry = d.log[-1] if d.log else {}
            if "applied_delta" not in entry:  # the analysis never parsed
                out.append(None)
                continue
            delta = max(-self.scale, min(self.scale, float(entry["applied_delta"])))
            thought = " ".join(str(v) for v in entry.get("analysis", {}).values())
            raw = str(entry.get("raw_analysis", ""))
            out.append(Reaction(entry.get("message", ""), delta, thought, raw=raw, scale=self.scale))
        return out
