"""What the data commands' settings share: sampling, seed and chunking (:class:`DataSettings`), the
policy's prompt for sampled replies (:class:`ReplySettings`) and grading (:class:`GradingSettings`). Each
command's own section (its pipeline's module) adds its switches, documented with their sources in
docs/algorithms/echo_n1.md; a run records them in its ``config.json``."""

from __future__ import annotations

from pydantic import Field, model_validator

from rapo_echo.config import DEFAULT_SYSTEM_PROMPT, LogprobMode, OptionalText, Strict


class DataSettings(Strict):
    """Sampling, seed and chunking of a data command."""

    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature of the written replies.")
    max_new_tokens: int = Field(96, ge=1, description="A reply's token budget.")
    seed: int = Field(0, ge=0, description="Seed of every sampled reply.")
    batch_size: int = Field(16, ge=1, description="Contexts per chunk of batched calls.")


class ReplySettings(DataSettings):
    """A data command whose replies are sampled with the policy's prompt."""

    system_prompt: OptionalText = Field(
        DEFAULT_SYSTEM_PROMPT, description="The policy's system prompt for sampled replies (`''`: none)."
    )


class GradingSettings(ReplySettings):
    """A data command whose sampled replies, and the context's own reference reply, are graded
    (rapo_echo.datagen.grading)."""

    candidates: int = Field(2, ge=0, description="Replies sampled per context.")
    include_reference: bool = Field(
        True, description="Grade the context's own reference reply too (e.g. the ESConv supporter turn)."
    )

    grade_tokens: int = Field(96, ge=1, description="The critique's token budget.")
    use_logprobs: LogprobMode = Field(
        "auto",
        description="Read verdicts and grades from label probabilities (`auto`: where the engine has them).",
    )
    max_retries: int = Field(2, ge=0, le=20, description="Retries of an unreadable answer.")

    @model_validator(mode="after")
    def _something_to_grade(self) -> GradingSettings:
        if self.candidates == 0 and not self.include_reference:
            raise ValueError("candidates 0 needs include_reference")
        return self
