"""``--set key.path=value`` overrides: parsing one, setting a dotted path in a tree, merging trees."""

from __future__ import annotations

import copy
import re
from typing import Any

from rapo_echo.config.yaml_files import load_yaml_text
from rapo_echo.errors import ConfigError


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'train.lr=1e-5'`` -> (``['train', 'lr']``, ``1e-05``). The value is parsed as a YAML scalar;
    lists and mappings need flow syntax (``[a, b]``, ``{k: v}``), other text stays a string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    check_key(key, f"--set {text!r}")
    value = load_yaml_text(raw, f"--set {key}") if raw.strip() else ""
    if isinstance(value, (dict, list)) and not raw.strip().startswith(("[", "{")):
        value = raw.strip()  # plain text such as "Be kind: always." stays text; use [..] / {..} for YAML
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
    return key.split("."), value


def check_key(key: object, origin: str) -> list[str]:
    """``key`` split at its dots; a :class:`ConfigError` naming ``origin`` when it is not a dotted key
    path (``train.lr``, ``rewards.0.weight``)."""
    if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][\w-]*(\.[\w-]+)*", key):
        raise ConfigError(f"{origin}: {key!r} is not a dotted key path such as train.lr")
    return key.split(".")


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def set_path(tree: dict[str, Any], path: list[str], value: Any, origin: str) -> None:
    """Set ``tree[path[0]][path[1]]... = value``, creating mappings; lists are indexed by number."""
    node: Any = tree
    for i, part in enumerate(path[:-1]):
        if isinstance(node, list):
            idx = _list_index(node, part, path[: i + 1], origin)
            node = node[idx]
            continue
        if part not in node or node[part] is None:
            node[part] = {}
        if not isinstance(node[part], (dict, list)):
            raise ConfigError(f"{origin}: {'.'.join(path[: i + 1])} is a value, not a section")
        node = node[part]
    last = path[-1]
    if isinstance(node, list):
        node[_list_index(node, last, path, origin)] = value
    else:
        node[last] = value


def _list_index(node: list, part: str, path: list[str], origin: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(
            f"{origin}: {'.'.join(path)}: index {part!r} is not in the list of {len(node)} items"
        )
    return int(part)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursively merge ``over`` into a copy of ``base`` (lists and scalars are replaced)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out
