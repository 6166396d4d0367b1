"""The settings of ``rapo-echo eval``: the benchmark, its roles' engines, data and output, over the
evaluation's own settings (:class:`~rapo_echo.benchmarks.base.EvalSettings`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from rapo_echo.benchmarks.base import EvalSettings
from rapo_echo.benchmarks.runner import BENCHMARKS
from rapo_echo.config import Device, Dtype, Flag

SPEC = "a model spec (default, a folder, a run folder, a .gguf file, a hub id) or an http(s):// endpoint"


class EvalCommand(EvalSettings):
    """`rapo-echo eval`: the benchmark, its roles' engines, data and output, and the evaluation's
    settings (`EvalSettings`, recorded in the output's `config.json`)."""

    benchmark: Literal[tuple(BENCHMARKS)] = Field(description="The benchmark to run.")  # type: ignore[valid-type]  # the registry's names
    policy: str | None = Field(None, description=f"The policy: {SPEC} (required but for fidelity).")
    transcripts: str | None = Field(
        None,
        description="sage: score dialogues already run, in SAGE's released result format (a "
        "*_result.jsonl file or a folder of them; one output folder per file); no model is loaded.",
    )
    data: str | None = Field(
        None,
        description="Data in the benchmark's format (ESConv JSON/JSONL; SOTOPIA JSON file or folder; EPM "
        "persona cards or EMPA's case folder; SAGE / RLVER profile JSONL; fidelity: ESConv with in-dialogue "
        "ratings); unset: our bundled English sets (esconv, esconv-ref); fidelity needs it.",
    )
    simulator: str = Field(
        "default", description=f"Seeker / partner / EPM user and director: {SPEC}, or `policy`."
    )
    judge: str = Field("default", description=f"Critic / evaluator / EPM rater: {SPEC}, or `policy`.")
    user: Annotated[list[str], Flag(metavar="NAME")] = Field(
        default_factory=list,
        description="fidelity: a simulated user to test on the simulator engine: reaction (RAPO), sage "
        "(RLVER's SAGE-style user) or a simulator plugin (module:Class); repeatable.",
    )
    reward: Annotated[list[str], Flag(metavar="NAME")] = Field(
        default_factory=list,
        description="fidelity: a reward plugin to test (empathy, humanlike, judge, length, module:attr, ...; "
        "judge rewards use the judge engine); repeatable.",
    )
    limit: int | None = Field(None, ge=1, description="Only the first N cases (fidelity: conversations).")
    output: str = Field(description="Output folder (results.jsonl, summary.json); resumes if it exists.")
    max_concurrency: int | None = Field(
        None, ge=1, le=4096, description="http(s) endpoints: requests in flight at once per endpoint (256)."
    )
    max_rpm: float | None = Field(None, gt=0, description="http(s) endpoints: requests per minute.")
    max_tpm: float | None = Field(None, gt=0, description="http(s) endpoints: tokens per minute.")
    recompute: Annotated[str | None, Flag(metavar="DIR")] = Field(
        None,
        description="epm: recompute success and EPM-Q from published per-case result files in DIR (no "
        "models).",
    )
    dtype: Dtype = Field("float32", description="Local models' weights' dtype.")
    device: Device = Field("auto", description="Local models' device: auto, cpu, cuda, cuda:N or mps.")

    def settings(self) -> EvalSettings:
        """The evaluation's settings alone (what ``config.json`` records)."""
        return EvalSettings.model_validate(self.model_dump(include=set(EvalSettings.model_fields)))

    def engine_args(self) -> dict[str, Any]:
        """The engines' settings (the request limits only where given: the engine's defaults apply)."""
        limits = self.model_dump(include={"max_concurrency", "max_rpm", "max_tpm"}, exclude_none=True)
        return {"dtype": self.dtype, "device": self.device, **limits}
