"""Resolving a plugin name from a config, in order: a built-in (``builtins``: name -> ``module:attr``), an
entry point of the ``group``, or a ``module:attr`` / ``module.attr`` path, imported with the working
folder on ``sys.path`` (so a ``my_rewards.py`` beside the command is found). :class:`Registry` adds the
check that what was found is of its kind, for the kinds whose built-ins are entry points.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar, cast

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
    """The object a plugin ``name`` refers to (not called, not instantiated); errors start with ``where``
    (none when it is empty: a config section's validator, whose key pydantic names)."""
    at = f"{where}: " if where else ""
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
        raise ConfigError(f"{at}unknown {kind} {name!r}; known: {', '.join(known)} (or use module:attr)")
    cwd_importable()
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"{at}cannot import module {module!r} for {kind} {name!r}: {exc} (looked in the working "
            f"folder {os.getcwd()} and the installed packages)"
        ) from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{at}module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


T = TypeVar("T")
DISTRIBUTION = "rapo-echo"  # the distribution whose entry points are the built-ins


class Registry(Generic[T]):
    """The plugins of one kind: an entry point of ``group`` (rapo-echo's own built-ins too) or a
    ``module:attr`` path. ``refuse(obj)`` says why an object is not of this kind (None: it is), so a config
    cannot name an arbitrary callable. Lookups are cached per name and ``sys.path``."""

    def __init__(self, group: str, kind: str, refuse: Callable[[Any], str | None]) -> None:
        self.group, self.kind, self.refuse = group, kind, refuse
        self._found: dict[tuple[str, tuple[str, ...]], T] = {}

    def names(self, builtin: bool = False) -> list[str]:
        """The names registered in the group (``builtin``: only rapo-echo's own)."""
        found = entry_points(group=self.group)
        if builtin:
            return sorted({ep.name for ep in found if ep.dist is not None and ep.dist.name == DISTRIBUTION})
        return sorted({ep.name for ep in found})

    def get(self, name: str, where: str) -> T:
        """What ``name`` refers to; a :class:`ConfigError` starting with ``where`` (as
        :func:`resolve_object`'s) when nothing does (listing the names registered), two packages claim it,
        or it is not of this kind."""
        at = f"{where}: " if where else ""
        key = (name, tuple(sys.path))
        if key in self._found:
            return self._found[key]
        claims = {ep.value: ep for ep in entry_points(group=self.group) if ep.name == name}
        if len(claims) > 1:
            owners = ", ".join(f"{v} ({e.dist.name if e.dist else 'no package'})" for v, e in claims.items())
            twice = f"the {self.kind} {name!r} is registered twice"
            raise ConfigError(f"{at}{twice}: {owners}; uninstall one")
        obj = resolve_object(name, group=self.group, builtins={}, kind=self.kind, where=where)
        problem = self.refuse(obj)
        if problem is not None:
            raise ConfigError(f"{at}{name!r} {problem}")
        self._found[key] = cast(T, obj)
        return self._found[key]
