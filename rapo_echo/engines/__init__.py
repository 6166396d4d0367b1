"""Chat engines and the factory that builds one from an :class:`~rapo_echo.config.EngineConfig`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rapo_echo.engines.base import ChatEngine, generate_texts, normalize_choices
from rapo_echo.errors import ConfigError

if TYPE_CHECKING:
    from rapo_echo.config import EngineConfig

__all__ = ["ChatEngine", "engine_from_spec", "generate_texts", "make_engine", "normalize_choices"]


def make_engine(
    cfg: EngineConfig, *, policy_engine: ChatEngine | None = None, role: str = "engine"
) -> ChatEngine:
    """Build the engine a role's config asks for. ``engine: policy`` returns ``policy_engine``."""
    if cfg.engine == "policy":
        if policy_engine is None:
            raise ConfigError(f"{role}.engine: 'policy' needs a policy model, and there is none here")
        return policy_engine
    if cfg.engine == "hf":
        from rapo_echo.engines.hf import HFEngine
        from rapo_echo.models import autocast_dtype, pick_device

        return HFEngine.from_spec(
            cfg.model,
            dtype=cfg.dtype,
            device=cfg.device,
            trust_remote_code=cfg.trust_remote_code,
            name=f"{role}:hf",
            max_batch_size=cfg.max_batch_size,
            autocast=autocast_dtype(cfg.autocast, pick_device(cfg.device)),
        )
    if cfg.engine == "openai":
        from rapo_echo.engines.openai_engine import OpenAIEngine

        return OpenAIEngine(
            base_url=cfg.base_url or "",
            model=None if cfg.model == "default" else cfg.model,
            api_key_env=cfg.api_key_env,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            name=f"{role}:openai",
            structured=cfg.structured,
        )
    if cfg.engine == "scripted":
        from rapo_echo.engines.scripted import ScriptedEngine

        return ScriptedEngine.from_config(cfg.script)
    if cfg.engine == "vllm":
        from rapo_echo.engines.vllm_engine import VLLMEngine

        return VLLMEngine(
            cfg.model,
            dtype=cfg.dtype,
            trust_remote_code=cfg.trust_remote_code,
            name=f"{role}:vllm",
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            max_model_len=cfg.vllm_max_model_len,
            tensor_parallel_size=cfg.vllm_tensor_parallel_size,
        )
    raise ConfigError(f"{role}.engine: got {cfg.engine!r}; allowed: policy, hf, openai, scripted, vllm")


def engine_from_spec(spec: str, **kw: Any) -> ChatEngine:
    """An engine from a command-line spec: an ``http(s)://`` URL is an OpenAI-compatible endpoint,
    anything else a model spec (``default``, folder, ``.gguf``, hub id) for the ``hf`` engine."""
    from rapo_echo.config import EngineConfig, engine_settings

    return make_engine(EngineConfig(**engine_settings(spec), **kw), role="cli")
