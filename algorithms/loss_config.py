"""The ``loss`` section: the GRPO core every algorithm shares, its formulas named from the open registries
of :mod:`.registries` (the built-ins and every installed package's, or ``module:function``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rapo_echo.config import Strict
from rapo_echo.errors import ConfigError
from rapo_echo.plugins import Registry

from .registries import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES, aggregation_of

REGISTRIES: dict[str, Registry[Any]] = {
    "advantage": ADVANTAGE_ESTIMATORS,
    "policy_loss": POLICY_LOSSES,
    "kl_estimator": KL_ESTIMATORS,
}


def _named(registry: Registry[Any]) -> str:
    """The description's list of a registry's names: rapo-echo's own, and the door for more."""
    builtin = ", ".join(f"`{n}`" for n in registry.names(builtin=True))
    return f"{builtin}, one a package registers in `{registry.group}`, or `module:function`"


class LossConfig(Strict):
    """The GRPO core: advantage estimator, policy loss, KL to the reference, aggregation."""

    advantage: str = Field("grpo", description=f"Advantage estimator: {_named(ADVANTAGE_ESTIMATORS)}.")
    policy_loss: str = Field("clip", description=f"Policy loss: {_named(POLICY_LOSSES)}.")
    eps_low: float | None = Field(
        None, ge=0.0, le=10.0, description="Lower clip range (None: the loss's own; clip 0.2, gspo 3e-4)."
    )
    eps_high: float | None = Field(
        None, ge=0.0, le=10.0, description="Upper clip range (None: the loss's own; clip 0.2, gspo 4e-4)."
    )
    kl_estimator: str = Field(
        "k3", description=f"Estimator of the KL to the reference: {_named(KL_ESTIMATORS)}."
    )
    beta: float = Field(0.04, ge=0.0, description="KL coefficient (0: no reference model is kept).")
    agg: Literal["auto", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = Field(
        "auto",
        description="Loss aggregation; `auto` is resolved at load time to the policy loss's own (gspo: "
        "`seq-mean-token-mean`, else `token-mean`).",
    )
    norm_constant: int | None = Field(
        None,
        ge=1,
        description="`seq-mean-token-sum-norm` (Dr. GRPO) constant (None: `rollout.max_new_tokens`).",
    )
    std_eps: float = Field(
        1e-4, gt=0.0, description="Added to the group's standard deviation before dividing."
    )
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus coefficient.")

    @field_validator("advantage", "policy_loss", "kl_estimator")
    @classmethod
    def _registered(cls, v: str, info: ValidationInfo) -> str:
        """The name resolves in its registry to a declared formula (importing a plugin's module)."""
        try:
            REGISTRIES[str(info.field_name)].get(v, where="")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _resolve_agg(self) -> LossConfig:
        if self.agg == "auto":
            self.agg = aggregation_of(POLICY_LOSSES.get(self.policy_loss, where="loss.policy_loss"))
        return self
