"""The ``simulator`` and ``judge`` sections: which chat engine backs each role."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rapo_echo.config.base import Autocast, Dtype, Strict


class EngineConfig(Strict):
    """A simulator or judge role: which engine backs it.

    ``engine: policy`` shares the policy's weights (no second model in memory); ``hf`` loads
    ``model``; both run their forwards under ``autocast``. ``openai`` calls ``base_url`` with the key read
    from the environment variable ``api_key_env``; ``scripted`` replies from ``script``; ``vllm`` runs
    in-process on GPUs.
    """

    engine: Literal["policy", "hf", "openai", "scripted", "vllm"] = Field(
        "policy",
        description="`policy` (share the policy's weights), `hf` (load `model`), `openai` (an "
        "OpenAI-compatible server), `scripted` (replies from `script`, for tests), `vllm` (in-process, GPU).",
    )
    model: str = Field(
        "default",
        description="Model for `hf`/`vllm` (a spec as `model.name`); the served model's name for `openai`.",
    )
    base_url: str | None = Field(
        None, description="`openai`: the server's URL, e.g. `http://127.0.0.1:8000/v1`."
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="`openai`: the environment variable holding the API key (never the key).",
    )
    timeout_s: float = Field(120.0, gt=0, description="`openai`: seconds before a request times out.")
    max_retries: int = Field(
        3, ge=0, le=20, description="`openai`: retries of a failed request, with backoff."
    )
    temperature: float = Field(
        0.7,
        ge=0.0,
        le=5.0,
        description="Role-level sampling temperature (the algorithms' calls set their own).",
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Role-level nucleus sampling bound.")
    max_new_tokens: int = Field(256, ge=1, le=32768, description="Role-level reply length bound.")
    dtype: Dtype = Field("float32", description="`hf`/`vllm`: the weights' dtype.")
    autocast: Autocast = Field(
        "auto",
        description="`policy`/`hf`: forwards in lower precision (`auto`: bfloat16 where the hardware has it; "
        "`none`: the weights' dtype).",
    )
    device: str = Field("auto", description="`hf`: `auto`, `cpu`, `cuda`, `cuda:N` or `mps`.")
    trust_remote_code: bool = Field(False, description="`hf`/`vllm`: allow the model's own code.")
    max_batch_size: int = Field(64, ge=1, description="`policy`/`hf`: sequences decoded at once.")
    script: dict[str, Any] = Field(default_factory=dict, description="`scripted`: the canned replies.")

    @model_validator(mode="after")
    def _needs(self) -> EngineConfig:
        if self.engine == "openai" and not self.base_url:
            raise ValueError("engine 'openai' needs base_url (e.g. http://127.0.0.1:8000/v1)")
        return self
