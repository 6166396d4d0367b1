"""Persona inference on the fly: from the dialogue so far, a short summary of who the person seems to be
(traits), what they need, and the style of reply they would welcome (docs/config.md, ``persona``).

The summary goes into ``scenario.meta["persona"]`` (the judges show it, fenced) and, with ``to_policy``,
into the policy's system prompt (:func:`rapo_echo.prompting.persona_note`). It is cached by
:func:`~rapo_echo.rewards.references.scenario_key`, so a group's replies and later steps on the same
context share one inference and a dialogue that grew gets a new one. Each field is one bounded line
(:data:`~rapo_echo.llm.answers.FIELD_LINE`), retried, then the scenario gets no persona this step
(counted, tried again next step). A step hook (:mod:`rapo_echo.step_hooks`) that annotates each step's
scenarios before the rollout; it lives above the judges and the simulators, so it may use either.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rapo_echo.engines.base import ChatEngine
from rapo_echo.errors import ConfigError
from rapo_echo.llm.answers import generate_field_lines
from rapo_echo.llm.dialogue import render_dialogue
from rapo_echo.llm.fencing import Fence
from rapo_echo.prompting import PERSONA_KEY, PERSONA_PROMPT_KEY
from rapo_echo.rewards.references import uncached
from rapo_echo.step_hooks import StepHook
from rapo_echo.types import Conversation, Scenario, msg

FIELDS = {
    "traits": "Traits",
    "needs": "Needs",
    "style": "Preferred style",
}
SYSTEM = (
    "You read a conversation and describe the person who is talking to the supporter, from what they "
    "said and how they said it: their traits (temperament, situation, how open they are), what they "
    "need right now, and the style of reply they would welcome (length, tone, directness). You write one "
    "short line about the field you are asked for, and you say nothing you cannot infer."
)


@dataclass
class PersonaSummary:
    """What the person seems like, one line per field."""

    traits: str
    needs: str
    style: str

    def text(self) -> str:
        return "\n".join(f"{label}: {getattr(self, key)}" for key, label in FIELDS.items())


class PersonaInference(StepHook):
    """Infers persona summaries with ``engine``, cached per scenario and dialogue."""

    name = "persona"

    def __init__(
        self,
        engine: ChatEngine,
        *,
        to_policy: bool = True,
        max_new_tokens: int = 40,
        max_retries: int = 1,
        rng: random.Random | None = None,
    ) -> None:
        if max_new_tokens < 1 or max_retries < 0:
            raise ValueError("PersonaInference: max_new_tokens must be >= 1 and max_retries >= 0")
        self.engine = engine
        self.to_policy = to_policy
        self.max_new_tokens = max_new_tokens
        self.max_retries = max_retries
        self.rng = rng if rng is not None else random.Random(0)
        self.cache: dict[str, PersonaSummary] = {}
        self.stats: Counter[str] = Counter()
        self._reported: Counter[str] = Counter()  # stats at the last step_metrics()

    @classmethod
    def from_config(cls, cfg: Any, engines: Mapping[str, ChatEngine | None]) -> PersonaInference:
        """From a ``persona`` config section; ``engines`` maps role names to the run's engines."""
        engine = engines.get(cfg.engine)
        if engine is None:
            raise ConfigError(f"persona.engine: the run has no {cfg.engine!r} engine")
        return cls(
            engine, to_policy=cfg.to_policy, max_new_tokens=cfg.max_new_tokens, max_retries=cfg.max_retries
        )

    def prompt(self, scenario: Scenario, field: str, fence: Fence) -> Conversation:
        """The prompt that continues one field's line (``Traits:`` ...)."""
        dialogue = render_dialogue(scenario.messages) or "(nothing yet)"
        user = (
            "The conversation so far:\n"
            + fence.block("DIALOGUE", dialogue)
            + f"\n\nDescribe the person's {FIELDS[field].lower()} in one line."
        )
        return [
            msg("system", SYSTEM + " " + fence.rules()),
            msg("user", user),
            msg("assistant", FIELDS[field] + ":"),
        ]

    def infer(self, scenarios: Sequence[Scenario]) -> list[PersonaSummary | None]:
        """The persona of each scenario: cached, or inferred now (one batched call per attempt for the
        distinct uncached dialogues); None where a field stayed unparseable."""
        keys, todo = uncached(scenarios, self.cache)
        if todo:
            fence = Fence(rng=self.rng)
            prompts = [self.prompt(sc, field, fence) for sc in todo.values() for field in FIELDS]
            parsed = generate_field_lines(
                self.engine, prompts, self.max_new_tokens, self.max_retries, role="judge"
            )
            n = len(FIELDS)
            for i, key in enumerate(todo):
                values = [p.value for p in parsed[n * i : n * (i + 1)]]
                self.stats["inferred"] += 1
                if any(v is None for v in values):
                    self.stats["invalid"] += 1
                else:
                    self.cache[key] = PersonaSummary(*values)  # type: ignore[arg-type]  # no None: checked above
        return [self.cache.get(key) for key in keys]

    def before_rollout(self, scenarios: Sequence[Scenario], step: int) -> dict[str, float]:
        """The step hook: annotate this step's scenarios; their :meth:`step_metrics`."""
        self.annotate(scenarios)
        return self.step_metrics()

    def step_metrics(self) -> dict[str, float]:
        """Dialogues inferred and failed (a field unparseable after retries) since the last call: the
        run logs them every step as ``persona/inferred`` and ``persona/invalid``."""
        out = {f"persona/{k}": float(self.stats[k] - self._reported[k]) for k in ("inferred", "invalid")}
        self._reported = Counter(self.stats)
        return out

    def annotate(self, scenarios: Sequence[Scenario]) -> None:
        """Write each scenario's persona into its ``meta`` (and mark it for the policy's prompt)."""
        for sc, persona in zip(scenarios, self.infer(scenarios)):
            if persona is None:
                sc.meta.pop(PERSONA_KEY, None)
                sc.meta.pop(PERSONA_PROMPT_KEY, None)
                continue
            sc.meta[PERSONA_KEY] = persona.text()
            if self.to_policy:
                sc.meta[PERSONA_PROMPT_KEY] = True
