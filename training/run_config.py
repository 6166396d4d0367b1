"""The run config: the shared sections of :mod:`rapo_echo.config` (and the ``loss`` section of the GRPO
core) composed with the chosen algorithm's own section, and :func:`load_config`, which builds it with
that algorithm's defaults under the user's file, flags and ``--set`` overrides.

An algorithm registers its section by naming its class (``Algorithm.config``); the run config of
``--algo rapo`` is :class:`RunConfig` plus a ``rapo`` section, so a saved config holds the chosen
algorithm's section only. A file that holds another algorithm's section is refused (a saved config of
an older version, which held every section, is read by ``--resume`` with the others dropped)."""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, create_model

from rapo_echo.algorithms import get as algorithm_class
from rapo_echo.algorithms import names as algorithm_names
from rapo_echo.algorithms.run_sections import RunConfig
from rapo_echo.config import BUILTIN_CHECKS, CHECK_ENTRY_POINTS, SAMPLING_KEYS, ConfigTree, check_device
from rapo_echo.errors import ConfigError
from rapo_echo.plugins import resolve_object

if TYPE_CHECKING:
    from rapo_echo.algorithms.base import Algorithm

log = logging.getLogger(__name__)


@functools.cache
def run_config_class(algo: type[Algorithm]) -> type[RunConfig]:
    """:class:`RunConfig` with ``algo``'s own section (``algo.config``) at the key ``algo.name``."""
    section = algo.config
    if section is None:
        return RunConfig
    key = algo.name
    if not key.isidentifier() or key in RunConfig.model_fields:
        raise ConfigError(
            f"algo: {algo.__module__}.{algo.__qualname__} names its section {key!r}, which is not a name a "
            f"section can have or is a shared section of every run ({', '.join(RunConfig.model_fields)})"
        )
    description = " ".join((section.__doc__ or f"{key}'s own switches.").split())
    # mypy matches a **dict's values against create_model's own keywords (__doc__, ...) too
    model = create_model(  # type: ignore[call-overload]
        f"RunConfig_{key}",
        __base__=RunConfig,
        __doc__=RunConfig.__doc__,
        **{key: (section, Field(default_factory=section, description=description))},
    )
    model.__module__ = __name__  # picklable by name, as a class written here
    globals()[model.__name__] = model
    return model


def load_config(
    path: str | Path | Mapping[str, Any] | None = None,
    *,
    algo: str | None = None,
    overrides: list[str] | Mapping[str, Any] | None = None,
    flags: dict[str, Any] | None = None,
    saved: bool = False,
    check_devices: bool = True,
) -> RunConfig:
    """Build and validate the run config of the chosen algorithm. ``flags`` maps dotted keys to values
    from CLI flags. Precedence, lowest first: built-in defaults, the algorithm's ``defaults()``, the file,
    the flags, then the overrides: ``--set`` texts, or a mapping of dotted keys to Python values (the
    Python API; ``path`` may also be the file's tree as a mapping). ``saved``: the file is a run's own
    ``config.yaml`` (``--resume``), which an older version wrote with every algorithm's section: the
    others are dropped, not refused.
    ``check_devices=False`` accepts devices this machine lacks (a plan made on a login node for GPUs)."""
    given = ConfigTree.read(path)
    named = ConfigTree(copy.deepcopy(given.tree), dict(given.sources))
    named.apply(flags, overrides)  # a flag's or --set's algo is the run's, as the file's is
    chosen = algo or named.tree.get("algo") or "grpo"
    where = "--algo" if algo else named.sources.get(("algo",), "algo")
    if not isinstance(chosen, str):
        raise ConfigError(f"{where}: algo: got {chosen!r}; allowed: {', '.join(algorithm_names())}")
    algo_cls = algorithm_class(chosen, where=f"{where}: algo")
    tree = given.under(algo_cls.defaults())
    tree.tree["algo"] = chosen
    tree.apply(flags, overrides)
    if tree.tree.get("algo") != chosen:  # --algo and `--set algo=` (or the API's overrides) name two
        raise ConfigError(f"--algo {algo} and algo: {tree.tree.get('algo')!r} (--set / overrides) disagree")
    drop_other_sections(tree, algo_cls, saved)
    refuse_engine_sampling(tree, saved)
    tree.refuse_secrets()
    tree.refuse_nonfinite()
    cfg = tree.validate(run_config_class(algo_cls))
    check_group_size(cfg, tree.where("rollout.group_size"))
    check_rewards(cfg, tree.where("rewards"))
    resolve_plugins(cfg, tree.where)
    for role in ("model", "simulator", "judge") if check_devices else ():
        if role == "model" or getattr(cfg, role).engine in ("hf", "vllm"):
            check_device(getattr(cfg, role).device, f"{role}.device", tree.where(f"{role}.device"))
    return cfg


def drop_other_sections(tree: ConfigTree, algo: type[Algorithm], saved: bool) -> None:
    """Another algorithm's section in the config: refused with the way on (it would be ignored), or, in a
    run's saved config (``saved``), dropped with one line in the log."""
    others = sorted(k for k in tree.tree if k in algorithm_names() and k != algo.name)
    if not others:
        return
    if saved:
        for key in others:
            del tree.tree[key]
        log.info("the saved config holds the sections of other algorithms (%s): dropped", ", ".join(others))
        return
    lines = [
        f"{tree.where(k)}{k}: the section of --algo {k}, and this run is --algo {tree.tree['algo']} (its "
        f"settings would be ignored): remove it, or run --algo {k}"
        for k in others
    ]
    raise ConfigError("invalid config:\n  " + "\n  ".join(lines))


def refuse_engine_sampling(tree: ConfigTree, saved: bool) -> None:
    """``simulator`` / ``judge`` name an engine; how each call samples is set by its caller. Older versions
    accepted ``temperature``, ``top_p`` and ``max_new_tokens`` there and never read them (the algorithm's
    own settings were used): refused with the way on, or dropped from a saved config (``saved``)."""
    found = [
        (role, key)
        for role in ("simulator", "judge")
        if isinstance(section := tree.tree.get(role), dict)
        for key in SAMPLING_KEYS
        if key in section
    ]
    if saved:
        for role, key in found:
            del tree.tree[role][key]
        return
    if found:
        lines = [f"{tree.where(f'{r}.{k}')}{r}.{k}: an engine section names an engine" for r, k in found]
        raise ConfigError(
            "invalid config:\n  "
            + "\n  ".join(lines)
            + "\n  How a call samples is set by its caller: the simulated person's temperature and lengths "
            "in the algorithm's own section (rapo.simulator, rlver.simulator) or a reward's args; judges "
            "decode greedily with their own lengths (rapo.judge.max_new_tokens, critique_tokens). Older "
            "versions accepted this key and ignored it: remove it."
        )


def resolve_plugins(cfg: RunConfig, where: Any = None) -> None:
    """Import every plugin the config names and check that it is one, before any model loads: the reward
    plugins, those of the algorithm's own section (:meth:`Algorithm.check_plugins`: RAPO's simulated user)
    and the validation checks of your own. ``where(key)`` gives a key's ``file:line: `` prefix. A module
    named by path is found in the working folder too (:func:`rapo_echo.plugins.cwd_importable`)."""
    from rapo_echo.rewards import resolve_reward

    def at(key: str) -> str:
        return (where(key) if where is not None else "") + key

    try:
        for i, spec in enumerate(cfg.rewards):
            resolve_reward(spec.name, at(f"rewards.{i}.name"))
        algorithm_class(cfg.algo).check_plugins(cfg, at)
        for i, check in enumerate(cfg.validation.checks):
            if check.name not in BUILTIN_CHECKS:
                key = at(f"validation.checks.{i}.name")
                resolve_object(check.name, group=CHECK_ENTRY_POINTS, builtins={}, kind="check", where=key)
    except ConfigError as exc:
        raise ConfigError(f"invalid config:\n  {exc}") from None


def check_rewards(cfg: RunConfig, where: str = "") -> None:
    """An algorithm whose only learning signal is its reward plugins (GRPO) needs one with a weight."""
    if not algorithm_class(cfg.algo).needs(cfg).rewards:
        return
    if not any(r.weight != 0 for r in cfg.rewards):
        got = "no rewards (an empty list)" if not cfg.rewards else "only rewards of weight 0"
        raise ConfigError(
            f"invalid config:\n  {where}rewards: got {got}; {cfg.algo} learns only from its rewards, so "
            "there is nothing to train with (every reward would be 0): name at least one with a weight, "
            "e.g. rewards: [{name: judge}] or --reward judge=1"
        )


def check_group_size(cfg: RunConfig, where: str = "") -> None:
    """A group-relative algorithm compares the replies of a group (advantages, ranks), so a group of one
    has no signal: refuse a group smaller than the algorithm's ``Needs.min_group_size`` (RLVER's PPO,
    whose value head is its baseline, declares 1)."""
    need = algorithm_class(cfg.algo).needs(cfg).min_group_size
    if cfg.rollout.group_size < need:
        raise ConfigError(
            f"invalid config:\n  {where}rollout.group_size: got {cfg.rollout.group_size}; {cfg.algo} learns "
            f"from differences between the replies of a group, so a group of {cfg.rollout.group_size} "
            f"trains nothing; use {need} or more"
        )
