"""The Python API: :func:`train` and :func:`evaluate`, the ``train`` and ``eval`` commands as functions
(re-exported lazily as ``rapo_echo.train`` and ``rapo_echo.evaluate``; docs/python-api.md).

Overrides are one mapping of the dotted keys the config files, ``--set`` and the reference use
(``{"rollout.group_size": 4, "rewards.0.weight": 0.5}``), with Python values: the same names everywhere,
including keys no Python keyword could spell. They are validated as the command line's are: an error is a
:class:`~rapo_echo.errors.ConfigError` naming ``overrides['key']``.

What a TRL user passes is taken too (:func:`config_values`): a ``datasets.Dataset`` (or ``DatasetDict``)
is saved once in rapo-echo's cache and named by that folder, and a reward function or class (in ``rewards``,
alone or as an item's ``name``) by its import path, since the run's ``config.yaml`` holds names, not
objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapo_echo.algorithms.run_sections import RunConfig
from rapo_echo.benchmarks.base import EvalSettings
from rapo_echo.config import ConfigTree
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
    # a RunConfig is checked again as a file would be (as config.yaml is on --resume)
    source = config.model_dump(mode="json") if isinstance(config, RunConfig) else config
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(
            f"train: overrides must be a mapping of dotted keys to values, e.g. "
            f"{{'rollout.group_size': 4}}; got {type(overrides).__name__}"
        )
    if overrides is not None:
        overrides = {k: config_values(v, f"overrides[{k!r}]", k) for k, v in overrides.items()}
    if isinstance(source, Mapping):
        source = config_values(source, "config", "")
    cfg = run_config_for(source, algo=algo, output=output, resume=run_dir, overrides=overrides)
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


def config_values(value: Any, where: str, key: str) -> Any:
    """``value`` (at dotted ``key``) with the Python objects a TRL user passes turned into what a config
    holds: a ``datasets`` dataset into the folder it is saved in, a reward function or class (a ``rewards``
    item, or its ``name``) into its import path. Mappings and lists are walked."""
    if _is_dataset(value):
        return _saved_dataset(value, where)
    if isinstance(value, Mapping):
        return {k: config_values(v, f"{where}[{k!r}]", f"{key}.{k}".lstrip(".")) for k, v in value.items()}
    if isinstance(value, list):
        bare = key.rsplit(".", 1)[-1] == "rewards"  # a function or class there is an item's name
        return [
            {"name": import_path(v, f"{where}[{i}]")}
            if bare and callable_item(v)
            else config_values(v, f"{where}[{i}]", f"{key}.{i}")
            for i, v in enumerate(value)
        ]
    if callable_item(value):
        return import_path(value, where)
    return value


def callable_item(value: Any) -> bool:
    import inspect

    return inspect.isfunction(value) or inspect.isclass(value)


def import_path(obj: Any, where: str) -> str:
    """``module:qualname`` of a function or class that importing it by that name gives back (the run's
    config.yaml names it, and a resume imports it again); anything else is refused saying what to pass."""
    import importlib

    name = f"{obj.__module__}:{obj.__qualname__}"
    found: Any = None
    if "<" not in obj.__qualname__:
        try:
            found = importlib.import_module(obj.__module__)
            for part in obj.__qualname__.split("."):
                found = getattr(found, part)
        except (ImportError, AttributeError):
            found = None
    if found is not obj:
        raise ConfigError(
            f"{where}: {name} cannot be named in the run's config.yaml (saved with the run and imported "
            "again on resume): define it with def (or class) at the top level of a module or of your "
            "script, and pass it, or its name 'module:function'"
        )
    return name


def _is_dataset(value: Any) -> bool:
    module = type(value).__module__ or ""
    return module.startswith("datasets.") and hasattr(value, "save_to_disk")


def _saved_dataset(value: Any, where: str) -> str:
    """The folder a ``datasets`` dataset is saved in, in rapo-echo's cache and named by its fingerprint
    (saved once; ``data.path`` reads a ``save_to_disk`` folder)."""
    import hashlib
    import logging

    from rapo_echo.atomic import replace_dir
    from rapo_echo.models import cache_dir

    prints = getattr(value, "_fingerprint", None) or {k: v._fingerprint for k, v in value.items()}
    digest = hashlib.sha256(json.dumps(prints, sort_keys=True).encode()).hexdigest()[:16]
    folder = cache_dir() / "datasets" / digest
    if not folder.is_dir():
        staged = folder.with_name(folder.name + ".tmp")
        value.save_to_disk(str(staged))
        replace_dir(staged, folder)
    logging.getLogger(__name__).info("%s: the dataset is saved in %s (config.yaml names it)", where, folder)
    return str(folder)


def _resume_dir(resume: bool | str | Path, output: str | Path | None) -> Path | None:
    if resume is True:
        if output is None:
            raise ConfigError("train: resume=True continues output; name the run directory as output")
        return Path(output)
    return Path(resume) if resume else None


def _last_metrics(path: Path) -> dict[str, Any]:
    lines = path.read_text().splitlines() if path.is_file() else []
    return json.loads(lines[-1]) if lines else {}


SETTING_NAMES = tuple(EvalSettings.model_fields)


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
    from rapo_echo.benchmarks.cli import build_roles
    from rapo_echo.benchmarks.runner import (
        BENCHMARKS,
        check_output,
        data_or_default,
        eval_config,
        get_benchmark,
        run_eval,
    )
    from rapo_echo.rundir import check_writable

    if benchmark == "fidelity" or benchmark not in BENCHMARKS:
        allowed = ", ".join(sorted(b for b in BENCHMARKS if b != "fidelity"))
        raise ConfigError(f"evaluate: benchmark {benchmark!r}; allowed: {allowed}")
    unknown = sorted(set(settings) - set(SETTING_NAMES))
    if unknown:
        raise ConfigError(
            f"evaluate: unknown setting {', '.join(unknown)}; allowed: {', '.join(SETTING_NAMES)}"
        )
    eval_settings = ConfigTree(dict(settings)).validate(EvalSettings)
    bench = get_benchmark(benchmark)
    given = {"policy": policy, "simulator": simulator, "judge": judge}
    needed = {r: v for r, v in given.items() if r in bench.roles}
    models = {r: _spec_name(v) for r, v in needed.items()}
    data = data_or_default(bench, data)  # the bundled set where a benchmark has one, as `eval` reads it
    cases = bench.load_cases(data, eval_settings)  # bad data fails before any model loads
    if not cases:
        raise ConfigError(f"evaluate: {benchmark}: no cases in {data or 'the bundled data'}")
    config = eval_config(bench.name, models, data, eval_settings, getattr(bench, "protocol", None))
    check_output(check_writable(str(output)), config)
    roles = build_roles(bench.roles, given, dtype=dtype, device=device)
    return run_eval(bench, roles, eval_settings, output, data=data, limit=limit, models=models)


def _spec_name(role: str | ChatEngine) -> str:
    """How the evaluation records a role: its spec, or an engine object's class and model name."""
    if isinstance(role, str):
        return role
    return f"{type(role).__name__}:{getattr(role, 'name', '') or 'engine'}"
