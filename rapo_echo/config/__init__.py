"""Typed configuration: the shared sections of a run's config, YAML loading with ``file:line`` errors,
``--set`` overrides, every command's flags generated from its section (:mod:`rapo_echo.config.flags`),
refusing and scrubbing secrets, and the Markdown reference of a schema.

This is the lowest layer: it imports no other part of the library but its base utilities. Each
algorithm declares its own section beside its code, and the run config that composes them, with
``load_config``, lives in :mod:`rapo_echo.training.run_config`.
"""

from rapo_echo.config.base import (
    Autocast,
    AutoLR,
    AutoSize,
    Device,
    Dtype,
    LogprobMode,
    OptionalText,
    ScenarioFormat,
    Strict,
)
from rapo_echo.config.data import DataConfig, SelectionConfig
from rapo_echo.config.engine import SAMPLING_KEYS, EngineConfig, engine_settings
from rapo_echo.config.fidelity import FidelityCheckConfig
from rapo_echo.config.flags import Flag, add_flags, section_from_args
from rapo_echo.config.judge import GroupJudgeConfig
from rapo_echo.config.loader import ConfigTree
from rapo_echo.config.logs import LoggingConfig
from rapo_echo.config.messages import format_validation_error
from rapo_echo.config.model import LoraConfig, ModelConfig, check_device
from rapo_echo.config.monitor import MonitorConfig
from rapo_echo.config.overrides import deep_merge, parse_override, set_path
from rapo_echo.config.persona import PersonaConfig
from rapo_echo.config.rewards import RewardSpec, parse_reward_flag
from rapo_echo.config.rollout import DEFAULT_SYSTEM_PROMPT, RolloutConfig
from rapo_echo.config.secrets import SECRET_KEY, literal_secrets, redacted, url_secret
from rapo_echo.config.train import TrainConfig
from rapo_echo.config.validation import (
    BUILTIN_CHECKS,
    CHECK_ENTRY_POINTS,
    MinGainCheck,
    PluginCheck,
    RuleFloorCheck,
    SubsetFloorCheck,
    ValidationConfig,
    VarietyFloorCheck,
)
from rapo_echo.config.yaml_files import check_yaml_nodes, dump_config, read_yaml

__all__ = [
    "BUILTIN_CHECKS",
    "CHECK_ENTRY_POINTS",
    "DEFAULT_SYSTEM_PROMPT",
    "SAMPLING_KEYS",
    "SECRET_KEY",
    "AutoLR",
    "AutoSize",
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
    "MinGainCheck",
    "ModelConfig",
    "MonitorConfig",
    "OptionalText",
    "PersonaConfig",
    "PluginCheck",
    "RewardSpec",
    "RolloutConfig",
    "RuleFloorCheck",
    "ScenarioFormat",
    "SelectionConfig",
    "Strict",
    "SubsetFloorCheck",
    "TrainConfig",
    "ValidationConfig",
    "VarietyFloorCheck",
    "add_flags",
    "check_device",
    "check_yaml_nodes",
    "deep_merge",
    "dump_config",
    "engine_settings",
    "format_validation_error",
    "literal_secrets",
    "parse_override",
    "parse_reward_flag",
    "read_yaml",
    "redacted",
    "section_from_args",
    "set_path",
    "url_secret",
]
