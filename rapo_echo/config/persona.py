"""The ``persona`` section: persona inference on the fly."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rapo_echo.config.base import Strict


class PersonaConfig(Strict):
    """Persona inference (rapo_echo/rewards/persona.py, a step hook): a summary of the person (traits,
    needs, preferred style) inferred once per scenario, shown to the judges (fenced) and, with
    ``to_policy``, appended to the policy's system prompt."""

    enabled: bool = Field(False, description="Infer a persona for each scenario before the rollout.")
    engine: Literal["simulator", "judge"] = Field("simulator", description="The role whose engine infers it.")
    to_policy: bool = Field(True, description="Append the persona to the policy's system prompt.")
    max_new_tokens: int = Field(40, ge=4, description="Tokens per inferred field.")
    max_retries: int = Field(1, ge=0, le=10, description="Retries of an unparseable field.")
