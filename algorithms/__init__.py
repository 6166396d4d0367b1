"""The algorithms, their config sections, the shared formulas (:mod:`.core`), the interface
(:mod:`.base`) and the registry ``--algo NAME`` reads; the loop that drives them is ``rapo_echo.training``.

A name resolves to an entry point of the ``rapo_echo.algorithms`` group -- the built-ins are registered
there by rapo-echo's own pyproject.toml, exactly as an installed plugin registers its own -- or to a
``module:Class`` path. What it names must declare itself an algorithm, a subclass of
:class:`.base.Algorithm`, checked before anything is called or built: anything else a config names
(``subprocess:Popen``) is refused. Importing a ``module:Class`` path still runs that module's top-level
code: a config is code to trust. Classes are imported only when chosen, so reading a config stays light.
"""

from __future__ import annotations

import inspect
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from rapo_echo.errors import ConfigError
from rapo_echo.plugins import resolve_object

if TYPE_CHECKING:
    from .base import Algorithm

ENTRY_POINT_GROUP = "rapo_echo.algorithms"
DISTRIBUTION = "rapo-echo"  # the distribution whose entry points are the built-ins


def names(builtin: bool = False) -> list[str]:
    """The algorithm names ``--algo`` finds by name: every entry point of the group (``builtin``: only
    rapo-echo's own, the ones this documentation describes)."""
    found = entry_points(group=ENTRY_POINT_GROUP)
    if builtin:
        found = [ep for ep in found if ep.dist is not None and ep.dist.name == DISTRIBUTION]
    return sorted({ep.name for ep in found})


def get(name: str, where: str = "algo") -> type[Algorithm]:
    """The algorithm class ``name`` refers to (an entry point or ``module:Class``); a :class:`ConfigError`
    naming ``where`` when there is none, two packages claim the name, or it is not an algorithm."""
    from .base import Algorithm

    claims = {ep.value: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name}
    if len(claims) > 1:
        owners = ", ".join(f"{v} ({ep.dist.name if ep.dist else 'no package'})" for v, ep in claims.items())
        raise ConfigError(f"{where}: the algorithm {name!r} is registered twice: {owners}; uninstall one")
    obj = resolve_object(name, group=ENTRY_POINT_GROUP, builtins={}, kind="algorithm", where=where)
    if not (inspect.isclass(obj) and issubclass(obj, Algorithm)):
        raise ConfigError(
            f"{where}: {name!r} is not an algorithm: an algorithm is a class that subclasses "
            "rapo_echo.algorithms.base.Algorithm"
        )
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        raise ConfigError(f"{where}: the algorithm {name!r} does not define {missing}")
    return obj
