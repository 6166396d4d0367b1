"""The ``simulator`` and ``judge`` sections: which chat engine backs each role."""

from __future__ import annotations

import re
import string
from typing import Any, Literal

from pydantic import Field, model_validator

from rapo_echo.config.base import Autocast, Dtype, OpenShare, Strict


class EngineConfig(Strict):
    """A simulator or judge role: which engine backs it.

    ``engine: policy`` shares the policy's weights (no second model in memory); ``hf`` loads
    ``model``; both run their forwards under ``autocast``. ``openai`` calls ``base_url`` with the key read
    from the environment variable ``api_key_env``; ``scripted`` replies from ``script``; ``vllm`` runs
    in-process on GPUs. How each call samples (temperature, length) is set by its caller: the
    algorithm's own section for the simulated person, the judges' own settings (they decode greedily).
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
    max_concurrency: int = Field(
        256,
        ge=1,
        le=4096,
        description="`openai`: requests in flight at once for this endpoint, shared by every role and stage "
        "that uses it (a vLLM server batches hundreds; lower it for a hosted API's concurrency cap).",
    )
    max_rpm: float | None = Field(
        None,
        gt=0,
        description="`openai`: requests per minute (null: no limit), e.g. a hosted API's rate limit.",
    )
    max_tpm: float | None = Field(
        None,
        gt=0,
        description="`openai`: tokens per minute (null: no limit); a request is charged its prompt's "
        "characters / 4 plus `max_tokens` x n, corrected by the response's `usage`.",
    )
    structured: Literal["auto", "json_schema", "vllm", "none"] = Field(
        "auto",
        description="`openai`: how a simulator's or judge's answer format is sent for the server to enforce. "
        "`vllm`: JSON as `response_format`, a choice / integer / regex as vLLM's `structured_outputs` "
        "(`guided_*` before vLLM 0.10.2); `json_schema`: everything as `response_format` json_schema (a "
        'label, integer or regex asked for as `{"answer": ...}` and unwrapped); `none`: nothing, replies '
        "are parsed and retried; `auto`: `vllm` for vLLM and rapo-echo servers, else `json_schema`, and "
        "`none` (one warning) once the server refuses or ignores the fields. See docs/structured-output.md.",
    )
    dtype: Dtype = Field(
        "auto",
        description="`hf`/`vllm`: the weights' dtype (`hf` `auto`: bfloat16 on a CUDA GPU that has it, else "
        "float32; `vllm` `auto`: vLLM's own choice).",
    )
    autocast: Autocast = Field(
        "auto",
        description="`policy`/`hf`: forwards in lower precision (`auto`: bfloat16 where the hardware has it; "
        "`none`: the weights' dtype).",
    )
    device: str = Field("auto", description="`hf`: `auto`, `cpu`, `cuda`, `cuda:N` or `mps`.")
    trust_remote_code: bool = Field(False, description="`hf`/`vllm`: allow the model's own code.")
    max_batch_size: int = Field(64, ge=1, description="`policy`/`hf`: sequences decoded at once.")
    vllm_gpu_memory_utilization: OpenShare = Field(
        0.3, description="`vllm`: share of GPU memory the role's vLLM may take."
    )
    vllm_max_model_len: int | None = Field(
        None, ge=16, description="`vllm`: longest prompt + reply in tokens (unset: the model's context)."
    )
    vllm_tensor_parallel_size: int = Field(
        1, ge=1, description="`vllm`: GPUs the role's model is split over."
    )
    script: dict[str, Any] = Field(default_factory=dict, description="`scripted`: the canned replies.")

    @model_validator(mode="after")
    def _needs(self) -> EngineConfig:
        if self.engine == "openai" and not self.base_url:
            raise ValueError("engine 'openai' needs base_url (e.g. http://127.0.0.1:8000/v1)")
        problem = script_problem(self.script)
        if problem:
            raise ValueError(f"script: {problem}")
        return self


# Keys older versions accepted in an engine section and never read: each call's sampling is its caller's.
SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens")


def engine_settings(spec: str) -> dict[str, Any]:
    """The engine section a ``--simulator`` / ``--judge`` SPEC names: ``policy``, an ``http(s)://`` URL (an
    OpenAI-compatible endpoint), else a model spec for the ``hf`` engine."""
    if spec == "policy":
        return {"engine": "policy"}
    if spec.startswith(("http://", "https://")):
        return {"engine": "openai", "base_url": spec, "model": "default"}
    return {"engine": "hf", "model": spec}


def script_problem(script: dict[str, Any]) -> str | None:
    """What is wrong with a scripted engine's ``script``, else None (caught at load, not at first use)."""
    rules = script.get("rules", [])
    if not isinstance(rules, list):
        return f"rules must be a list of [regex, reply] pairs, got {type(rules).__name__}"
    for i, rule in enumerate(rules):
        if not (isinstance(rule, list) and len(rule) == 2 and all(isinstance(x, str) for x in rule)):
            return f"rules[{i}]: got {rule!r}; each rule is a pair [regex, reply] of two texts"
        try:
            groups = re.compile(rule[0]).groups
        except re.error as exc:
            return f"rules[{i}]: the regex {rule[0]!r} does not compile ({exc})"
        try:
            string.Formatter().vformat(rule[1], tuple("x" * groups), {})
        except (IndexError, KeyError, ValueError) as exc:
            return (
                f"rules[{i}]: the reply {rule[1]!r} cannot be filled from the regex's {groups} group(s) "
                f"({type(exc).__name__}: {exc}); use {{0}}..{{{max(groups - 1, 0)}}} for groups, and write "
                "a literal brace as {{ or }}"
            )
    replies = script.get("replies", [])
    if replies is not None and not (isinstance(replies, list) and all(isinstance(r, str) for r in replies)):
        return f"replies must be a list of texts, got {replies!r}"
    if not isinstance(script.get("default", ""), str):
        return f"default must be a text, got {script['default']!r}"
    if not isinstance(script.get("structured", True), bool):
        return f"structured must be true or false, got {script['structured']!r}"
    return None
