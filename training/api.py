"""The Python API: :func:`train` and :func:`evaluate`, the ``train`` and ``eval`` commands as functions
(re-exported lazily as ``rapo_echo.train`` and ``rapo_echo.evaluate``; docs/python-api.md).

Overrides are one mapping of the dotted keys the config files, ``--set`` and the reference use
(``{"rollout.group_size": 4, "rewards.0.weight": 0.5}``), with Python values: the same names everywhere,
including keys no Python keyword could spell. They are validated as the command line's are: an error is a
:class:`~rapo_echo.errors.ConfigError` naming ``overrides['key']``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rapo_echo.algorithms.run_sections import RunConfig
from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.engines.base import ChatEngine
from rapo_echo.errors import ConfigError

from .train_cli import run_config_for, train_with


@dataclass
class TrainResult:
    """What :func:`train` returns: the run directory, the steps done, the last step's metrics (the last
    line of ``metrics.jsonl``), the config the run used, and why it stopped early, if it did (a signal's
    name, or a step hook's reason)."""

    run_dir: Path
    step: int
    metrics: dict[str, Any]
    config: RunConfig
    stopped_by: str = ""
    final_model: Path | None = field(default=None)


def train(
    config: str | Path | Mapping[str, Any] | RunConfig | None = None,
    *,
    algo: str | None = None,
    output: str | Path | None = None,
    resume: bool | str | Path = False,
    overrides: Mapping[str, Any] | None = None,
) -> TrainResult:
    """Train a policy, as ``rapo-echo train`` does. ``config``: a YAML file, the same tree as a mapping,
    a :class:`RunConfig` (validated again as a file is), or None (the algorithm's defaults).
    ``resume``: True continues ``output``; a path continues that run directory from its last
    checkpoint, with its own ``config.yaml``. Precedence: algorithm defaults < ``config`` <
    ``overrides``. Bad settings raise :class:`ConfigError` before any model loads."""
    run_dir = _resume_dir(resume, output)
    if isinstance(config, RunConfig):  # checked again as a file would be (as config.yaml is on --resume)
        config = config.model_dump(mode="json")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(
            f"train: overrides must be a mapping of dotted keys to values, e.g. "
            f"{{'rollout.group_size': 4}}; got {type(overrides).__name__}"
        )
    cfg = run_config_for(config, algo=algo, output=output, resume=run_dir, overrides=overrides)
    run = train_with(cfg, resume=run_dir is not None)
    final = run.run_dir / "final"
    return TrainResult(
        run_dir=run.run_dir,
        step=run.step,
        metrics=_last_metrics(run.run_dir / "metrics.jsonl"),
        config=cfg,
        stopped_by=run.stopped_by,
        final_model=final if final.is_dir() else None,
    )


def _resume_dir(resume: bool | str | Path, output: str | Path | None) -> Path | None:
    if resume is True:
        if output is None:
            raise ConfigError("train: resume=True continues output; name the run directory as output")
        return Path(output)
    return Path(resume) if resume else None


def _last_metrics(path: Path) -> dict[str, Any]:
    lines = path.read_text().splitlines() if path.is_file() else []
    return json.loads(lines[-1]) if lines else {}


SETTING_NAMES = tuple(f.name for f in fields(EvalSettings))


def evaluate(
    benchmark: str,
    *,
    policy: str | ChatEngine,
    output: str | Path,
    simulator: str | ChatEngine = "default",
    judge: str | ChatEngine = "default",
    data: str | None = None,
    limit: int | None = None,
    dtype: str = "float32",
    device: str = "auto",
    **settings: Any,
) -> dict[str, Any]:
    """Run a benchmark on a policy, as ``rapo-echo eval`` does; returns the summary (also written to
    ``output/summary.json``, beside ``results.jsonl``; an existing ``output`` of the same evaluation is
    resumed). A role is a model spec (``default``, a folder, a run folder, a ``.gguf`` file, a hub id, an
    ``http(s)://`` endpoint; ``policy`` for the simulator or judge shares the policy's engine) or an
    engine object. ``settings`` are :class:`~rapo_echo.benchmarks.base.EvalSettings` fields
    (``max_turns=2``, ``max_new_tokens=32``, ``batch_size=4``, ...)."""
    from rapo_echo.benchmarks.runner import BENCHMARKS, check_output, eval_config, get_benchmark, run_eval
    from rapo_echo.rundir import check_writable

    if benchmark == "fidelity" or benchmark not in BENCHMARKS:
        allowed = ", ".join(sorted(b for b in BENCHMARKS if b != "fidelity"))
        raise ConfigError(f"evaluate: benchmark {benchmark!r}; allowed: {allowed}")
    unknown = sorted(set(settings) - set(SETTING_NAMES))
    if unknown:
        raise ConfigError(
            f"evaluate: unknown setting {', '.join(unknown)}; allowed: {', '.join(SETTING_NAMES)}"
        )
    try:
        eval_settings = EvalSettings(**settings)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"evaluate: {exc}") from exc
    bench = get_benchmark(benchmark)
    given = {"policy": policy, "simulator": simulator, "judge": judge}
    needed = {r: v for r, v in given.items() if r in bench.roles}
    models = {r: _spec_name(v) for r, v in needed.items()}
    cases = bench.load_cases(data, eval_settings)  # bad data fails before any model loads
    if not cases:
        raise ConfigError(f"evaluate: {benchmark}: no cases in {data or 'the bundled data'}")
    config = eval_config(bench.name, models, data, eval_settings, getattr(bench, "protocol", None))
    check_output(check_writable(str(output)), config)
    roles = _roles(bench.roles, needed, dtype=dtype, device=device)
    return run_eval(bench, roles, eval_settings, output, data=data, limit=limit, models=models)


def _spec_name(role: str | ChatEngine) -> str:
    """How the evaluation records a role: its spec, or an engine object's class and model name."""
    if isinstance(role, str):
        return role
    return f"{type(role).__name__}:{getattr(role, 'name', '') or 'engine'}"


def _roles(needed: tuple[str, ...], given: dict[str, str | ChatEngine], **engine_kw: Any) -> Roles:
    """The benchmark's :class:`Roles`: engine objects as given, specs loaded as ``eval`` loads them (one
    engine per spec; ``policy`` shares the policy's engine)."""
    from rapo_echo.benchmarks.cli import build_roles

    if all(isinstance(v, str) for v in given.values()):
        return build_roles(needed, given, **engine_kw)  # type: ignore[arg-type]
    from rapo_echo.engines import engine_from_spec

    cache: dict[str, ChatEngine] = {}

    def load(value: str | ChatEngine) -> ChatEngine:
        if not isinstance(value, str):
            return value
        if value not in cache:
            cache[value] = engine_from_spec(value, **engine_kw)
        return cache[value]

    policy = load(given["policy"])
    others = {
        r: policy if given[r] == "policy" else load(given[r]) for r in ("simulator", "judge") if r in needed
    }
    return Roles(policy=policy, **others)
