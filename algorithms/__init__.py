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
from typing import TYPE_CHECKING, Any

from rapo_echo.plugins import Registry

if TYPE_CHECKING:
    from .base import Algorithm

ENTRY_POINT_GROUP = "rapo_echo.algorithms"


def _refuse(obj: Any) -> str | None:
    from .base import Algorithm

    if not (inspect.isclass(obj) and issubclass(obj, Algorithm)):
        return f"is not an algorithm: an algorithm is a class subclassing {Algorithm.__module__}.Algorithm"
    if inspect.isabstract(obj):
        return f"is an algorithm that does not define {', '.join(sorted(obj.__abstractmethods__))}"
    return None


REGISTRY: Registry[type[Algorithm]] = Registry(ENTRY_POINT_GROUP, "algorithm", _refuse)


def names(builtin: bool = False) -> list[str]:
    """The algorithm names ``--algo`` finds by name: every entry point of the group (``builtin``: only
    rapo-echo's own, the ones this documentation describes)."""
    return REGISTRY.names(builtin)


def get(name: str, where: str = "algo") -> type[Algorithm]:
    """The algorithm class ``name`` refers to (an entry point or ``module:Class``); a :class:`ConfigError`
    naming ``where`` when there is none, two packages claim the name, or it is not an algorithm."""
    return REGISTRY.get(name, where)
