"""The ``data`` section: training scenarios and hindsight selection of pivotal turns."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rapo_echo.config.base import ScenarioFormat, Strict


class SelectionConfig(Strict):
    """Hindsight selection of pivotal supporter turns (RAPO; used where a signal exists)."""

    signal: Literal["feedback", "none"] = Field(
        "feedback",
        description="`feedback`: score a turn by |seeker rating after - before| (ESConv); `none`: every "
        "turn with enough history.",
    )
    threshold: float = Field(1.0, ge=0.0, description="Turns scoring at least this are kept.")
    top_k_per_dialogue: int | None = Field(None, ge=1, description="At most this many turns per dialogue.")
    min_history_turns: int = Field(
        1, ge=0, description="Seeker turns a kept turn needs before it (at least 1)."
    )
    max_history_messages: int = Field(12, ge=1, description="Messages of history kept in a context.")


class DataConfig(Strict):
    """Where training scenarios come from."""

    path: str | None = Field(
        None,
        description="Scenario file (JSON/JSONL, ESConv, PPDPP, SAGE profiles) or `bundled:NAME`; None: the"
        " bundled scenarios.",
    )
    format: ScenarioFormat = Field("auto", description="The file's format (`auto`: detected).")
    shuffle: bool = Field(True, description="Shuffle scenarios (seeded by `train.seed`).")
    limit: int | None = Field(None, ge=1, description="Use only the first this many scenarios.")
    selection: SelectionConfig = Field(default_factory=SelectionConfig, description="Pivotal-turn selection.")
