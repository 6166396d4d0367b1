"""The fidelity check a run config can name (:mod:`rapo_echo.config.fidelity`): run once before
training on the run's simulator and judge, cached by their specs, recorded as ``fidelity.json`` in the
run directory. Called by ``rapo-echo train`` (the CLI layer), never by the trainer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Protocol

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.fidelity.bench import Fidelity
from rapo_echo.benchmarks.fidelity.cli import ENGINE_FREE_REWARDS
from rapo_echo.benchmarks.results import SUMMARY_FILE, write_json_atomic
from rapo_echo.config import EngineConfig, FidelityCheckConfig, ModelConfig, redacted

RUN_FILE = "fidelity.json"
# engine settings that change how requests go out, not what they answer: not part of the cache key
REQUEST_SETTINGS = {"max_batch_size", "timeout_s", "max_retries", "max_concurrency", "max_rpm", "max_tpm"}


class RunConfig(Protocol):
    """What the check reads of a run's config: the check itself, the simulator's and the judge's engines,
    and the policy model a role may share."""

    fidelity: FidelityCheckConfig | None
    simulator: EngineConfig
    judge: EngineConfig
    model: ModelConfig


def check_key(cfg: RunConfig) -> dict[str, Any]:
    """What the check's result depends on: the check itself and the simulator's / judge's engine specs
    (with the policy model's name where a role shares the policy's weights)."""
    check = cfg.fidelity
    assert check is not None
    key: dict[str, Any] = {"check": check.model_dump(exclude={"cache"})}
    for role in ("simulator", "judge"):
        engine = getattr(cfg, role)
        key[role] = engine.model_dump(exclude=REQUEST_SETTINGS)
        if engine.engine == "policy":
            key[role]["policy_model"] = cfg.model.name
    return redacted(key)


def cache_folder(cfg: RunConfig) -> Path:
    """``<cache>/fidelity/<hash of the check key>``."""
    from rapo_echo.models import cache_dir

    check = cfg.fidelity
    assert check is not None
    root = Path(check.cache) if check.cache else cache_dir() / "fidelity"
    digest = hashlib.sha256(json.dumps(check_key(cfg), sort_keys=True).encode()).hexdigest()[:16]
    return root / digest


def run_fidelity_check(cfg: RunConfig) -> dict[str, Any]:
    """The check's record (``key``, ``cache`` folder, ``summary``): from the cache when a finished one is
    there, else run now (resumable in the cache folder) with engines built from the run config."""
    check = cfg.fidelity
    assert check is not None
    out = cache_folder(cfg)
    summary_path = out / SUMMARY_FILE
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        if summary.get("complete"):
            return {"key": check_key(cfg), "cache": str(out), "cached": True, "summary": summary}
    from rapo_echo.benchmarks.runner import run_eval
    from rapo_echo.engines import make_engine

    need_judge = any(r not in ENGINE_FREE_REWARDS for r in check.rewards)
    policy = None
    if any(getattr(cfg, r).engine == "policy" for r in ("simulator", "judge")):
        from rapo_echo.engines.hf import HFEngine

        policy = HFEngine.from_spec(cfg.model.name, name="fidelity-policy")
    shared: dict[Any, Any] = {}  # one engine per endpoint for the roles that share it
    simulator = judge = None
    if check.users:
        simulator = make_engine(cfg.simulator, policy_engine=policy, role="simulator", shared=shared)
    if need_judge:
        judge = make_engine(cfg.judge, policy_engine=policy, role="judge", shared=shared)
    settings = EvalSettings(
        max_new_tokens=check.max_new_tokens,
        simulator_temperature=0.0,
        seed=check.seed,
    )
    bench = Fidelity(users=check.users, rewards=check.rewards)
    models = {
        "simulator": cfg.simulator.engine + ":" + cfg.simulator.model,
        "judge": cfg.judge.engine + ":" + cfg.judge.model,
    }
    summary = run_eval(
        bench,
        Roles(policy=None, simulator=simulator, judge=judge),  # type: ignore[arg-type]  # the fidelity check runs no policy
        settings,
        out,
        data=check.data,
        limit=check.limit,
        models=models,
    )
    return {"key": check_key(cfg), "cache": str(out), "cached": False, "summary": summary}


def record_check(run_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write the check's record into the run directory."""
    path = Path(run_dir) / RUN_FILE
    write_json_atomic(path, record)
    return path
