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
        description="Scenario source: a JSON / JSONL / parquet / arrow / csv file, a `save_to_disk` folder, "
        "a Hugging Face Hub dataset id or `bundled:NAME`; None: the bundled scenarios (docs/data.md).",
    )
    format: ScenarioFormat = Field(
        "auto",
        description="The rows' format (`auto`: detected): `scenarios` (ours and TRL's `prompt` / "
        "`messages` rows), `esconv`, `ppdpp`, `hf_esconv`, `sage`.",
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Renames the source's columns to the names the format reads, e.g. `{question: prompt}`.",
    )
    split: str = Field("train", description="The split of a Hub dataset or a saved `DatasetDict`.")
    subset: str | None = Field(None, description="A Hub dataset's subset (configuration) name.")
    shuffle: bool = Field(True, description="Shuffle scenarios (seeded by `train.seed`).")
    limit: int | None = Field(None, ge=1, description="Use only the first this many scenarios.")
    selection: SelectionConfig = Field(default_factory=SelectionConfig, description="Pivotal-turn selection.")
