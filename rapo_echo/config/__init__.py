"""Typed configuration: the shared sections of a run's config, YAML loading with ``file:line`` errors,
``--set`` overrides, flags generated from a section, secrets refused, and the Markdown reference.

The lowest layer: each algorithm's section lives beside its code, and the run config that composes
them (``load_config``) in :mod:`rapo_echo.training.run_config`.
"""

from rapo_echo.config.base import Autocast, Device, Dtype, LogprobMode, OptionalText, ScenarioFormat, Strict
from rapo_echo.config.data import DataConfig, SelectionConfig
from rapo_echo.config.engine import SAMPLING_KEYS, EngineConfig, engine_settings
from rapo_echo.config.fidelity import FidelityCheckConfig
from rapo_echo.config.flags import Flag, add_flags, section_from_args
from rapo_echo.config.judge import GroupJudgeConfig
from rapo_echo.config.loader import ConfigTree
from rapo_echo.config.logs import LoggingConfig
from rapo_echo.config.model import LoraConfig, ModelConfig, check_device
from rapo_echo.config.monitor import MonitorConfig
from rapo_echo.config.overrides import parse_override
from rapo_echo.config.persona import PersonaConfig
from rapo_echo.config.rewards import RewardSpec, parse_reward_flag
from rapo_echo.config.rollout import DEFAULT_SYSTEM_PROMPT, RolloutConfig
from rapo_echo.config.secrets import literal_secrets, redacted, url_secret
from rapo_echo.config.train import TrainConfig
from rapo_echo.config.validation import BUILTIN_CHECKS, CHECK_ENTRY_POINTS, ValidationConfig
from rapo_echo.config.yaml_files import dump_config

__all__ = [
    "BUILTIN_CHECKS",
    "CHECK_ENTRY_POINTS",
    "DEFAULT_SYSTEM_PROMPT",
    "SAMPLING_KEYS",
    "Autocast",
    "ConfigTree",
    "DataConfig",
    "Device",
    "Dtype",
    "EngineConfig",
    "FidelityCheckConfig",
    "Flag",
    "GroupJudgeConfig",
    "LoggingConfig",
    "LogprobMode",
    "LoraConfig",
    "ModelConfig",
    "MonitorConfig",
    "OptionalText",
    "PersonaConfig",
    "RewardSpec",
    "RolloutConfig",
    "ScenarioFormat",
    "SelectionConfig",
    "Strict",
    "TrainConfig",
    "ValidationConfig",
    "add_flags",
    "check_device",
    "dump_config",
    "engine_settings",
    "literal_secrets",
    "parse_override",
    "parse_reward_flag",
    "redacted",
    "section_from_args",
    "url_secret",
]
