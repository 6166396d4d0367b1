"""The ``validation`` section: held-out scenarios, the best model, and the checks a step must pass to
replace it (``training/validation/checks.py``)."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from rapo_echo.config.base import ScenarioFormat, Strict

CHECK_ENTRY_POINTS = "rapo_echo.validation_checks"


class MinGainCheck(Strict):
    """A step replaces the best only when its paired gain over it exceeds ``se`` standard errors."""

    name: Literal["min_gain"] = Field(description="`min_gain`.")
    se: float = Field(
        ge=0, description="Standard errors of the paired gain a step must exceed (0: gain >= 0)."
    )


class SubsetFloorCheck(Strict):
    """With ``validation.data`` a list of files: a step that loses more than ``se`` standard errors on
    any one file does not replace the best."""

    name: Literal["subset_floor"] = Field(description="`subset_floor`.")
    se: float = Field(
        ge=0, description="Standard errors of the paired difference a step may lose on one file."
    )


class RuleFloorCheck(Strict):
    """A step under which a negative rule of the simulated person fires more often than under the best,
    by more than ``se`` standard errors, does not replace the best."""

    name: Literal["rule_floor"] = Field(description="`rule_floor`.")
    se: float = Field(ge=0, description="Standard errors by which a rule's firing rate may rise.")
    rules: list[str] | None = Field(
        None, description="The negative rules watched (None: every negative rule of the person)."
    )


class VarietyFloorCheck(Strict):
    """A step whose held-out replies' Distinct-2 is below the best's by more than ``se`` (jackknife)
    standard errors does not replace the best."""

    name: Literal["variety_floor"] = Field(description="`variety_floor`.")
    se: float = Field(ge=0, description="Jackknife standard errors by which Distinct-2 may fall.")


BUILTIN_CHECKS: dict[str, type[Strict]] = {
    "min_gain": MinGainCheck,
    "subset_floor": SubsetFloorCheck,
    "rule_floor": RuleFloorCheck,
    "variety_floor": VarietyFloorCheck,
}


class PluginCheck(BaseModel):
    """A check of your own: an entry point of the ``rapo_echo.validation_checks`` group or
    ``module:Class``; the other keys go to its constructor."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="An entry point of `rapo_echo.validation_checks`, or `module:Class`.")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if ":" in v or v in {ep.name for ep in entry_points(group=CHECK_ENTRY_POINTS)}:
            return v
        raise ValueError(
            f"unknown check; built-in: {', '.join(BUILTIN_CHECKS)} (or an entry point of "
            f"{CHECK_ENTRY_POINTS}, or module:Class)"
        )


def _check_kind(value: Any) -> str:
    name = value.get("name") if isinstance(value, dict) else getattr(value, "name", None)
    return name if name in BUILTIN_CHECKS else "plugin"


CheckSpec = Annotated[
    Annotated[MinGainCheck, Tag("min_gain")]
    | Annotated[SubsetFloorCheck, Tag("subset_floor")]
    | Annotated[RuleFloorCheck, Tag("rule_floor")]
    | Annotated[VarietyFloorCheck, Tag("variety_floor")]
    | Annotated[PluginCheck, Tag("plugin")],
    Discriminator(_check_kind),
]


class ValidationConfig(Strict):
    """Held-out validation (``training/validation``): greedy replies to ``data`` scored the way the run
    is rewarded (RAPO: the simulated person's emotion change; GRPO: the reward plugins), before the first
    step and after every checkpoint; with ``keep_best``, ``final/`` is the best-validated model (the
    base included). A step replaces the best when its paired gain is >= 0 and it passes every check."""

    # old keys -> the new spelling (format_validation_error names it when an old config uses one)
    renamed: ClassVar[dict[str, str]] = {
        "min_gain": "validation.checks: [{{name: min_gain, se: {value}}}]",
        "subset_floor": "validation.checks: [{{name: subset_floor, se: {value}}}]",
        "rule_floor": "validation.checks: [{{name: rule_floor, se: {value}, rules: [...]}}]",
        "floor_rules": "validation.checks: [{{name: rule_floor, se: F, rules: {value}}}]",
        "variety_floor": "validation.checks: [{{name: variety_floor, se: {value}}}]",
    }

    data: str | list[str] | None = Field(
        None,
        description="Held-out scenarios: a path or `bundled:NAME`, or a list of them (each file a subset); "
        "None: no validation.",
    )
    format: ScenarioFormat = Field("auto", description="The files' format (`auto`: detected).")
    limit: int | None = Field(
        None, ge=1, description="Validate on the first this many scenarios over all files."
    )
    max_new_tokens: int | None = Field(
        None, ge=1, description="Tokens per reply (None: `rollout.max_new_tokens`)."
    )
    keep_best: bool = Field(
        False, description="`final/` is the best-validated model, the base (step 0) included."
    )
    turns: int = Field(
        1,
        ge=1,
        description="Replies per held-out dialogue (> 1: RAPO only; the reaction is the next message).",
    )
    checks: list[CheckSpec] = Field(
        default_factory=list,
        description="Checks a step must pass to replace the best: `min_gain`, `subset_floor`, `rule_floor`, "
        "`variety_floor`, or your own.",
    )

    @model_validator(mode="after")
    def _best_needs_data(self) -> ValidationConfig:
        if self.keep_best and not self.data:
            raise ValueError("keep_best needs validation.data (held-out scenarios to validate on)")
        return self
