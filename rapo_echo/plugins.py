"""Resolving a plugin name from a config: a built-in, an entry point of a group, or a dotted path.

One resolver for every kind of plugin (rewards, simulated users, validation checks): names resolve, in
order, to a built-in (``builtins`` maps names to ``module:attr`` import strings, imported on first use),
a plugin registered in the entry-point ``group``, or a ``module:attr`` / ``module.attr`` path. A path is
imported with the current working folder on ``sys.path`` (first, as ``python -m`` puts it), so a
``my_rewards.py`` beside the command is found. Errors are :class:`ConfigError` naming the config field
(``where``). Whether the object found may be used is the caller's check (a class that declares itself a
plugin of its kind), made before it is called.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from rapo_echo.errors import ConfigError


def import_string(spec: str) -> Any:
    """The object named by an import string ``module:attr`` (``attr`` may be dotted)."""
    module, attr = spec.split(":", 1)
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def cwd_importable() -> None:
    """Put the current working folder first on ``sys.path`` (once), as ``python -m`` does."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
        importlib.invalidate_caches()


def resolve_object(name: str, *, group: str, builtins: Mapping[str, str], kind: str, where: str) -> Any:
    """The object a plugin ``name`` refers to (not called, not instantiated)."""
    if name in builtins:
        return import_string(builtins[name])
    for ep in entry_points(group=group):
        if ep.name == name:
            return ep.load()
    if ":" in name:
        module, attr = name.split(":", 1)
    elif "." in name:
        module, attr = name.rsplit(".", 1)
    else:
        known = sorted({ep.name for ep in entry_points(group=group)} | set(builtins))
        raise ConfigError(f"{where}: unknown {kind} {name!r}; known: {', '.join(known)} (or use module:attr)")
    cwd_importable()
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"{where}: cannot import module {module!r} for {kind} {name!r}: {exc} (looked in the working "
            f"folder {os.getcwd()} and the installed packages)"
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{where}: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
