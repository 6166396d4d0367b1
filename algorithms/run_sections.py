"""The sections every training run has: :class:`RunConfig`. The chosen algorithm's own section is added
to it by :func:`.run_config.run_config_class`, and :func:`.run_config.load_config` builds it."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, Field

from rapo_echo.config import (
    DataConfig,
    EngineConfig,
    FidelityCheckConfig,
    LoggingConfig,
    ModelConfig,
    MonitorConfig,
    PersonaConfig,
    RewardSpec,
    RolloutConfig,
    Strict,
    TrainConfig,
    ValidationConfig,
)

from .loss_config import LossConfig

S = TypeVar("S", bound=BaseModel)


class RunConfig(Strict):
    """Everything one training run needs (and the chosen algorithm's own section, at its name)."""

    algo: str = Field(
        "grpo",
        description="The algorithm: a name of the `rapo_echo.algorithms` entry-point group (the built-ins' "
        "defaults are listed at the end of this page) or `module:Class`.",
    )
    output: str | None = Field(None, description="Run directory (None: `runs/ALGO-TIMESTAMP`).")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The trainable policy.")
    simulator: EngineConfig = Field(
        default_factory=EngineConfig,
        description="The engine the simulated user runs on (who the user is, and how the algorithm samples "
        "it, is the algorithm's own section, e.g. `rapo.simulator`).",
    )
    judge: EngineConfig = Field(default_factory=EngineConfig, description="The judge's engine.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="How the policy samples.")
    loss: LossConfig = Field(default_factory=LossConfig, description="The GRPO core.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation and checkpoints.")
    rewards: list[RewardSpec] = Field(default_factory=list, description="Reward plugins, summed by weight.")
    data: DataConfig = Field(default_factory=DataConfig, description="Training scenarios.")
    persona: PersonaConfig = Field(default_factory=PersonaConfig, description="Persona inference.")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Reward-hacking monitor.")
    validation: ValidationConfig = Field(
        default_factory=ValidationConfig, description="Held-out validation and the best model."
    )
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metric sinks.")
    fidelity: FidelityCheckConfig | None = Field(
        None,
        description="A fidelity check of the simulator and judge against real seekers' ratings, run once "
        "before training by `rapo-echo train` (None: none).",
    )

    def section(self, name: str, kind: type[S]) -> S:
        """The algorithm's own section ``name`` (added by :func:`.run_config.run_config_class`), typed as
        ``kind``: a hook that takes the shared :class:`RunConfig` reads its section so."""
        found = getattr(self, name, None)
        if not isinstance(found, kind):
            raise TypeError(f"the run config (algo: {self.algo}) has no {name!r} section of {kind.__name__}")
        return found
