"""Chat engines and the factory that builds one from an :class:`~rapo_echo.config.EngineConfig`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rapo_echo.engines.base import ChatEngine, generate_texts, normalize_choices
from rapo_echo.errors import ConfigError

if TYPE_CHECKING:
    from rapo_echo.config import EngineConfig

__all__ = [
    "ChatEngine",
    "engine_from_spec",
    "engines_for_roles",
    "failed_items",
    "generate_texts",
    "make_engine",
    "normalize_choices",
]

# the ``openai`` engine's settings that an EngineConfig passes on by name
OPENAI_SETTINGS = ("api_key_env", "timeout_s", "max_retries", "structured", "max_concurrency", "max_rpm",
                   "max_tpm")  # fmt: skip


def make_engine(
    cfg: EngineConfig,
    *,
    policy_engine: ChatEngine | None = None,
    role: str = "engine",
    shared: dict[Any, ChatEngine] | None = None,
) -> ChatEngine:
    """Build the engine a role's config asks for. ``engine: policy`` returns ``policy_engine``. With
    ``shared`` (a dict the caller keeps for its roles), roles whose ``openai`` settings are the same endpoint
    with the same settings get one engine: one setup, one set of request limits."""
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

        key = openai_key(cfg)
        if shared is not None and key in shared:
            engine = shared[key]
            engine.name = f"{engine.name.rsplit(':', 1)[0]}+{role}:openai"
            return engine
        engine = OpenAIEngine(
            base_url=cfg.base_url or "",
            model=None if cfg.model == "default" else cfg.model,
            name=f"{role}:openai",
            **{k: getattr(cfg, k) for k in OPENAI_SETTINGS},
        )
        if shared is not None:
            shared[key] = engine
        return engine
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


def openai_key(cfg: EngineConfig) -> tuple[Any, ...]:
    """What makes two ``openai`` role configs one engine: the endpoint (its URL as the engine completes it),
    the model, the key's variable and every request setting."""
    from urllib.parse import urlsplit

    url = (cfg.base_url or "").strip().rstrip("/")
    url = url if urlsplit(url).path else url + "/v1"  # as the engine completes it
    return (url, cfg.model, *(getattr(cfg, k) for k in OPENAI_SETTINGS))


def failed_items(*engines: Any) -> int:
    """Requests the given engines (None and repeats ignored) have seen fail for good so far (``openai``
    engines count them; others have none)."""
    seen = {id(e): e for e in engines if e is not None}
    return sum(int(getattr(e, "failed_items", 0) or 0) for e in seen.values())


def engine_from_spec(spec: str, *, role: str = "cli", **kw: Any) -> ChatEngine:
    """An engine from a command-line spec: an ``http(s)://`` URL is an OpenAI-compatible endpoint,
    anything else a model spec (``default``, folder, ``.gguf``, hub id) for the ``hf`` engine. ``role``
    names it (``judge:hf``: its progress bars say ``judging``; roles sharing it are joined by ``+``)."""
    from rapo_echo.config import EngineConfig, engine_settings

    return make_engine(EngineConfig(**{**engine_settings(spec), **kw}), role=role)


def engines_for_roles(specs: dict[str, str], **kw: Any) -> dict[str, ChatEngine]:
    """The engine of each role (role -> model spec): one engine per spec, shared by the roles that name it
    and named by them (``simulator+judge:hf``), so its progress bars say what it is doing."""
    roles_of: dict[str, list[str]] = {}
    for role, spec in specs.items():
        roles_of.setdefault(spec, []).append(role)
    built = {spec: engine_from_spec(spec, role="+".join(roles), **kw) for spec, roles in roles_of.items()}
    return {role: built[spec] for role, spec in specs.items()}
