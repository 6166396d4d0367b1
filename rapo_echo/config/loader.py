"""Building a config tree from its layers and validating it against a schema. Precedence, lowest first:
defaults, an overlay (the algorithm's defaults), the YAML file, the CLI flags, then ``--set``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from rapo_echo.config.messages import Sources, format_validation_error, where
from rapo_echo.config.overrides import check_key, deep_merge, parse_override, set_path
from rapo_echo.config.secrets import literal_secrets
from rapo_echo.config.yaml_files import read_yaml
from rapo_echo.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


@dataclass
class ConfigTree:
    """A config as plain data, and where each key came from (``file:line``, a flag, ``--set``)."""

    tree: dict[str, Any] = field(default_factory=dict)
    sources: Sources = field(default_factory=dict)

    @classmethod
    def read(cls, path: str | Path | Mapping[str, Any] | None) -> ConfigTree:
        """The YAML file's tree with the line of each key (empty without a file); a mapping (a config
        given as Python data) is taken as the file's tree, copied."""
        if path is None:
            return cls()
        if isinstance(path, Mapping):
            return cls(copy.deepcopy(dict(path)))
        tree, lines = read_yaml(path)
        return cls(tree, {k: f"{path}:{v}" for k, v in lines.items()})

    def under(self, overlay: dict[str, Any]) -> ConfigTree:
        """This tree merged over ``overlay`` (defaults the file's keys replace)."""
        return ConfigTree(deep_merge(overlay, self.tree), dict(self.sources))

    def apply(
        self, flags: dict[str, Any] | None = None, overrides: list[str] | Mapping[str, Any] | None = None
    ) -> None:
        """Set dotted keys from CLI flags (None values skipped), then the overrides: ``--set key=value``
        texts, or a mapping of dotted keys to Python values (the Python API's ``overrides``; an error
        names the key as ``overrides['key']``)."""
        for key, value in (flags or {}).items():
            if value is None:
                continue
            parts = key.split(".")
            flag = f"--{parts[-1].replace('_', '-')}"
            # a section's flag (``simulator``: --simulator SPEC) sets its keys, the others stay
            for sub, v in value.items() if isinstance(value, dict) else [(None, value)]:
                path = [*parts, sub] if sub is not None else parts
                set_path(self.tree, path, v, flag)
                self.sources[tuple(path)] = f"flag {flag}"
        if isinstance(overrides, Mapping):
            for key, value in overrides.items():
                origin = f"overrides[{key!r}]"
                parts = check_key(key, origin)
                set_path(self.tree, parts, copy.deepcopy(value), origin)
                self.sources[tuple(parts)] = origin
            return
        for text in overrides or []:
            parts, value = parse_override(text)
            set_path(self.tree, parts, value, f"--set {text}")
            self.sources[tuple(parts)] = f"--set {'.'.join(parts)}"

    def where(self, key: str) -> str:
        """``'file:line: '`` (or the flag) for ``key`` or its longest known prefix, else ``''``."""
        return where(self.sources, key)

    def refuse_secrets(self) -> None:
        """A ConfigError naming every literal secret in the tree (configs are saved with the run)."""
        secrets = literal_secrets(self.tree)
        if secrets:
            lines = [f"{self.where(key)}{key}: {why}" for key, why in secrets]
            advice = (
                "Configs are saved with the run (config.yaml), so secrets do not belong in them: put the "
                "value in an environment variable and give the variable's name (e.g. api_key_env: MY_KEY, or "
                "a plugin argument such as token_env: MY_TOKEN)."
            )
            raise ConfigError.invalid([*lines, advice])

    def refuse_nonfinite(self) -> None:
        """A ConfigError naming every NaN or infinite number in the tree, also where the schema takes any
        value (reward ``args``, a scripted ``script``): they make every later sum and mean NaN."""
        found: list[str] = []

        def walk(node: Any, path: str) -> None:
            if isinstance(node, dict):
                for k, v in node.items():
                    walk(v, f"{path}.{k}" if path else str(k))
            elif isinstance(node, list):
                for i, v in enumerate(node):
                    walk(v, f"{path}.{i}" if path else str(i))
            elif isinstance(node, float) and not math.isfinite(node):
                found.append(f"{self.where(path)}{path}: got {node}; only finite numbers are allowed")

        walk(self.tree, "")
        if found:
            raise ConfigError.invalid(found)

    def validate(self, model: type[M]) -> M:
        """The tree validated as ``model``; a ConfigError with one line per problem otherwise."""
        try:
            return model.model_validate(self.tree)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, self.sources, self.tree, model)) from None
