"""The run config: the shared sections of :mod:`rapo_echo.config` composed with each algorithm's own
(``loss``, ``rapo``, ``rlver``), and :func:`load_config`, which builds it with the chosen algorithm's
defaults under the user's file, flags and ``--set`` overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from rapo_echo import algorithms
from rapo_echo.algorithms.loss_config import LossConfig
from rapo_echo.algorithms.rapo_config import RapoConfig
from rapo_echo.algorithms.rlver_config import RlverConfig
from rapo_echo.config import (
    BUILTIN_CHECKS,
    CHECK_ENTRY_POINTS,
    ConfigTree,
    DataConfig,
    EngineConfig,
    FidelityCheckConfig,
    LoggingConfig,
    ModelConfig,
    MonitorConfig,
    PersonaConfig,
    RewardSpec,
    RolloutConfig,
    Strict,
    TrainConfig,
    ValidationConfig,
    check_device,
)
from rapo_echo.errors import ConfigError
from rapo_echo.plugins import resolve_object


class RunConfig(Strict):
    """Everything one training run needs."""

    algo: str = Field(
        "grpo", description=f"The algorithm: {', '.join(f'`{n}`' for n in algorithms.names())}."
    )
    output: str | None = Field(None, description="Run directory (None: `runs/ALGO-TIMESTAMP`).")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The trainable policy.")
    simulator: EngineConfig = Field(default_factory=EngineConfig, description="The simulated user's engine.")
    judge: EngineConfig = Field(
        default_factory=lambda: EngineConfig(temperature=0.0),
        description="The judge's engine (its `temperature` defaults to 0).",
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="How the policy samples.")
    loss: LossConfig = Field(default_factory=LossConfig, description="The GRPO core.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation and checkpoints.")
    rewards: list[RewardSpec] = Field(default_factory=list, description="Reward plugins, summed by weight.")
    data: DataConfig = Field(default_factory=DataConfig, description="Training scenarios.")
    rapo: RapoConfig = Field(default_factory=RapoConfig, description="RAPO's own switches.")
    persona: PersonaConfig = Field(default_factory=PersonaConfig, description="Persona inference.")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Reward-hacking monitor.")
    rlver: RlverConfig = Field(default_factory=RlverConfig, description="RLVER's own switches.")
    validation: ValidationConfig = Field(
        default_factory=ValidationConfig, description="Held-out validation and the best model."
    )
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metric sinks.")
    fidelity: FidelityCheckConfig | None = Field(
        None,
        description="A fidelity check of the simulator and judge against real seekers' ratings, run once "
        "before training by `rapo-echo train` (None: none).",
    )

    @field_validator("algo")
    @classmethod
    def _algo(cls, v: str) -> str:
        if v not in algorithms.names():
            raise ValueError(f"unknown algorithm; allowed: {', '.join(algorithms.names())}")
        return v


def load_config(
    path: str | Path | None = None,
    *,
    algo: str | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> RunConfig:
    """Build and validate a :class:`RunConfig`. ``flags`` maps dotted keys to values from CLI flags.
    Precedence, lowest first: built-in defaults, the algorithm's ``defaults()``, the file, the flags,
    then ``--set`` overrides."""
    given = ConfigTree.read(path)
    chosen = algo or given.tree.get("algo") or "grpo"
    if not isinstance(chosen, str) or chosen not in algorithms.names():
        where = "--algo" if algo else given.sources.get(("algo",), "algo")
        raise ConfigError(f"{where}: algo: got {chosen!r}; allowed: {', '.join(algorithms.names())}")
    tree = given.under(algorithms.get(chosen).defaults())
    tree.tree["algo"] = chosen
    tree.apply(flags, overrides)
    tree.refuse_secrets()
    tree.refuse_nonfinite()
    cfg = tree.validate(RunConfig)
    check_group_size(cfg, tree.where("rollout.group_size"))
    check_rewards(cfg, tree.where("rewards"))
    resolve_plugins(cfg, tree.where)
    for role in ("model", "simulator", "judge"):
        if role == "model" or getattr(cfg, role).engine in ("hf", "vllm"):
            check_device(getattr(cfg, role).device, f"{role}.device", tree.where(f"{role}.device"))
    return cfg


def resolve_plugins(cfg: RunConfig, where: Any = None) -> None:
    """Import every plugin the config names and check that it is one, before any model loads: the reward
    plugins, RAPO's simulated user and the validation checks of your own. ``where(key)`` gives a key's
    ``file:line: `` prefix. A module named by path is found in the working folder too
    (:func:`rapo_echo.plugins.cwd_importable`)."""
    from rapo_echo.rewards import resolve_reward
    from rapo_echo.simulators.base import resolve_simulator

    def at(key: str) -> str:
        return (where(key) if where is not None else "") + key

    try:
        for i, spec in enumerate(cfg.rewards):
            resolve_reward(spec.name, at(f"rewards.{i}.name"))
        if cfg.algo == "rapo":
            resolve_simulator(cfg.rapo.simulator.name, at("rapo.simulator.name"))
        for i, check in enumerate(cfg.validation.checks):
            if check.name not in BUILTIN_CHECKS:
                key = at(f"validation.checks.{i}.name")
                resolve_object(check.name, group=CHECK_ENTRY_POINTS, builtins={}, kind="check", where=key)
    except ConfigError as exc:
        raise ConfigError(f"invalid config:\n  {exc}") from None


def check_rewards(cfg: RunConfig, where: str = "") -> None:
    """An algorithm whose only learning signal is its reward plugins (GRPO) needs one with a weight."""
    if not getattr(algorithms.get(cfg.algo), "needs_rewards", False):
        return
    if not any(r.weight != 0 for r in cfg.rewards):
        got = "no rewards (an empty list)" if not cfg.rewards else "only rewards of weight 0"
        raise ConfigError(
            f"invalid config:\n  {where}rewards: got {got}; {cfg.algo} learns only from its rewards, so "
            "there is nothing to train with (every reward would be 0): name at least one with a weight, "
            "e.g. rewards: [{name: judge}] or --reward judge=1"
        )


def check_group_size(cfg: RunConfig, where: str = "") -> None:
    """Every algorithm here compares the replies of a group (group-relative advantages, ranks), so a
    group of one has no signal: refuse it unless the algorithm declares a smaller ``min_group_size``
    (an int, or ``min_group_size_for(cfg)`` when it depends on the config, as RLVER's PPO does)."""
    algo = algorithms.get(cfg.algo)
    by_config = getattr(algo, "min_group_size_for", None)
    need = int(by_config(cfg)) if by_config is not None else int(getattr(algo, "min_group_size", 2))
    if cfg.rollout.group_size < need:
        raise ConfigError(
            f"invalid config:\n  {where}rollout.group_size: got {cfg.rollout.group_size}; {cfg.algo} learns "
            f"from differences between the replies of a group, so a group of {cfg.rollout.group_size} "
            f"trains nothing; use {need} or more"
        )
