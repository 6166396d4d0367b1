"""The ``logging`` section: where metrics and samples go."""

from __future__ import annotations

from pydantic import Field

from rapo_echo.config.base import Strict


class LoggingConfig(Strict):
    """Metric sinks and how often samples are written."""

    tensorboard: bool = Field(True, description="Write TensorBoard events to the run directory.")
    wandb: bool = Field(False, description="Also log to Weights & Biases.")
    wandb_project: str = Field("rapo-echo", description="The Weights & Biases project.")
    samples_every: int = Field(1, ge=1, description="Write samples.jsonl every this many steps.")
    progress: bool = Field(True, description="Show a progress bar.")
