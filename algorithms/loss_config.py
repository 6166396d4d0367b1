"""The ``loss`` section: the GRPO core every algorithm shares, its names checked against the registries
of :mod:`rapo_echo.algorithms.core`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rapo_echo.config import Strict

from .core import ADVANTAGE_ESTIMATORS, DEFAULT_AGGREGATION, POLICY_LOSSES


class LossConfig(Strict):
    """The GRPO core: advantage estimator, policy loss, KL to the reference, aggregation."""

    advantage: str = Field(
        "grpo",
        description=f"Advantage estimator: {', '.join(f'`{n}`' for n in sorted(ADVANTAGE_ESTIMATORS))}.",
    )
    policy_loss: str = Field(
        "clip", description=f"Policy loss: {', '.join(f'`{n}`' for n in sorted(POLICY_LOSSES))}."
    )
    eps_low: float | None = Field(
        None, ge=0.0, le=10.0, description="Lower clip range (None: the loss's own; clip 0.2, gspo 3e-4)."
    )
    eps_high: float | None = Field(
        None, ge=0.0, le=10.0, description="Upper clip range (None: the loss's own; clip 0.2, gspo 4e-4)."
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="Estimator of the KL to the reference.")
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

    @field_validator("advantage")
    @classmethod
    def _advantage(cls, v: str) -> str:
        if v not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"unknown advantage estimator; allowed: {', '.join(sorted(ADVANTAGE_ESTIMATORS))}"
            )
        return v

    @field_validator("policy_loss")
    @classmethod
    def _policy_loss(cls, v: str) -> str:
        if v not in POLICY_LOSSES:
            raise ValueError(f"unknown policy loss; allowed: {', '.join(sorted(POLICY_LOSSES))}")
        return v

    @model_validator(mode="after")
    def _resolve_agg(self) -> LossConfig:
        if self.agg == "auto":
            self.agg = DEFAULT_AGGREGATION.get(self.policy_loss, "token-mean")
        return self
