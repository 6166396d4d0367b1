"""Reading a YAML config with the line of every key (so errors name ``file:line``), and writing one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from rapo_echo.atomic import write_text_atomic
from rapo_echo.config.secrets import redacted
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.jsonl import read_utf8


def line_map(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path in a YAML document to its 1-based line number."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = prefix + (str(k.value),)
                lines[key] = k.start_mark.line + 1
                walk(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                key = prefix + (str(i),)
                lines[key] = v.start_mark.line + 1
                walk(v, key)

    try:
        walk(yaml.compose(text), ())
    except yaml.YAMLError:
        pass
    return lines


def read_yaml(path: str | Path) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    """Read a YAML mapping; errors (bad YAML, not UTF-8, a key given twice, an anchor that contains
    itself) name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = read_utf8(p, "config file")
    except DataError as exc:
        raise ConfigError(str(exc)) from None
    try:
        check_yaml_nodes(yaml.compose(text, Loader=yaml.SafeLoader), str(p))
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise ConfigError(f"{where}: invalid YAML: {exc.problem}") from exc
    except RecursionError:
        raise ConfigError(f"{p}: the YAML is nested too deeply to read") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data, line_map(text)


def check_yaml_nodes(root: yaml.Node | None, origin: str) -> None:
    """Refuse a mapping that gives a key twice (YAML loaders keep the last silently) and an anchor whose
    value contains its own alias (a recursive structure); errors name ``origin`` and the line."""
    done: set[int] = set()

    def walk(node: yaml.Node, open_nodes: tuple[int, ...]) -> None:
        if id(node) in open_nodes:
            raise ConfigError(
                f"{origin}:{node.start_mark.line + 1}: a YAML anchor is used inside its own value (a "
                "recursive alias); write the value out instead"
            )
        if id(node) in done:
            return
        inner = (*open_nodes, id(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if key.value in seen:
                        raise ConfigError(
                            f"{origin}:{line}: key {key.value!r} is given twice (first on line "
                            f"{seen[key.value]}); keep one"
                        )
                    seen[key.value] = line
                walk(key, inner)
                walk(value, inner)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item, inner)
        done.add(id(node))

    if root is not None:
        walk(root, ())


def dump_config(cfg: BaseModel, path: str | Path) -> None:
    """Write the resolved config as YAML, secrets redacted, atomically."""
    text = yaml.safe_dump(redacted(cfg.model_dump(mode="json")), sort_keys=False, allow_unicode=True)
    write_text_atomic(path, text)
