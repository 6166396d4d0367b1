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
    data = load_yaml_text(text, str(p))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data, line_map(text)


# Nodes a YAML document may stand for once its aliases are expanded: a config is a few hundred; an "alias
# bomb" (9 levels of 9 aliases: 9**9 nodes) would hang every reader that walks the loaded data.
MAX_YAML_NODES = 200_000


def load_yaml_text(text: str, origin: str) -> Any:
    """Parse YAML text safely, checked first (:func:`check_yaml_nodes`: no key given twice, no recursive
    alias, at most :data:`MAX_YAML_NODES` nodes with aliases expanded); errors name ``origin`` and the line.
    The one way rapo-echo reads YAML."""
    try:
        check_yaml_nodes(yaml.compose(text, Loader=yaml.SafeLoader), origin)
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{origin}:{mark.line + 1}" if mark is not None else origin
        raise ConfigError(f"{where}: invalid YAML: {exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: invalid YAML: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{origin}: the YAML is nested too deeply to read") from None


def _expanded_sizes(root: yaml.Node, origin: str) -> None:
    """Refuse a document whose aliases expand to more than :data:`MAX_YAML_NODES` nodes, naming the line of
    the first node (innermost) whose expansion passes the bound."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        total = 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                total += size(key) + size(value)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
        if total > MAX_YAML_NODES:
            raise ConfigError(
                f"{origin}:{node.start_mark.line + 1}: with its aliases (*name) expanded, this YAML value "
                f"stands for more than {MAX_YAML_NODES} nodes (an alias bomb?); write the values out or "
                "use fewer nested aliases"
            )
        sizes[id(node)] = total
        return total

    size(root)


def check_yaml_nodes(root: yaml.Node | None, origin: str) -> None:
    """Refuse a mapping that gives a key twice (YAML loaders keep the last silently), an anchor whose
    value contains its own alias (a recursive structure) and an alias bomb; errors name ``origin`` and
    the line."""
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
        _expanded_sizes(root, origin)


def dump_config(cfg: BaseModel, path: str | Path) -> None:
    """Write the resolved config as YAML, secrets redacted, atomically."""
    text = yaml.safe_dump(redacted(cfg.model_dump(mode="json")), sort_keys=False, allow_unicode=True)
    write_text_atomic(path, text)
