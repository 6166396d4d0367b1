"""The simulated-user protocol RAPO's rollout talks to, and how a simulator is chosen by name
(docs/extending.md#a-simulator-plugin, docs/simulators.md).

A simulated user reacts to a batch of ``(scenario, reply)`` pairs (``scenario.messages`` the visible
dialogue, ``scenario.profile`` the hidden profile) and returns per pair, in order, a :class:`Reaction` or
``None`` when it could not react (the sample is then masked out of the loss and counted, never scored 0;
so is an emotion change that is not finite or outside ``[-scale, +scale]``).

A class is a simulator plugin only when it declares itself one: it subclasses :class:`UserSimulator` or
sets ``rapo_echo_simulator = True``. Its constructor gets ``rapo.simulator.args`` and, when it declares
them, ``engine`` (the ``simulator`` role engine), ``scale`` (``rapo.emotion_scale``) and ``seed``
(``train.seed``). A simulator with a known ground truth may also have ``hidden_rule_score(reply, heard,
earlier)`` (logged as ``sim/hidden_rule_score``) and ``rules_broken(reply, heard, earlier)`` (read by the
``rule_floor`` validation check). Names resolve to a built-in (:data:`BUILTINS`), an entry point of the
``rapo_echo.simulators`` group, or a ``module:Class`` / ``module.Class`` path.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from rapo_echo.errors import ConfigError
from rapo_echo.llm.reaction import Reaction
from rapo_echo.plugins import resolve_object
from rapo_echo.types import Scenario

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "rapo_echo.simulators"
BUILTINS = {
    "reaction": "rapo_echo.simulators.reaction:ReactionSimulator",
    "hidden_preference": "rapo_echo.simulators.hidden_preference:HiddenPreferenceUser",
    "sage": "rapo_echo.simulators.sage_reaction:SageReactionUser",
}
MARKER = "rapo_echo_simulator"  # the class attribute that declares a simulator plugin
INJECTED = ("engine", "scale", "seed", "rng")  # constructor parameters the library fills in


class UserSimulator:
    """Base class of simulated users that react to one supporter reply at a time (see the module doc)."""

    rapo_echo_simulator: ClassVar[bool] = True

    def react(self, pairs: Sequence[tuple[Scenario, str]]) -> Sequence[Reaction | None]:
        """The person's reaction to each ``(scenario, reply)``, in order; ``None`` = invalid."""
        raise NotImplementedError


def is_simulator_class(obj: Any) -> bool:
    """True for a class that declares itself a simulator plugin (checked before anything is called)."""
    declared = inspect.isclass(obj) and getattr(obj, MARKER, False) is True
    return declared and callable(getattr(obj, "react", None))


def resolve_simulator(name: str, where: str = "rapo.simulator.name") -> Any:
    """The simulator class ``name`` refers to (not instantiated); it must declare itself a plugin."""
    obj = resolve_object(name, group=ENTRY_POINT_GROUP, builtins=BUILTINS, kind="simulator", where=where)
    if not is_simulator_class(obj):
        raise ConfigError(
            f"{where}: {name!r} is not a simulator plugin: a simulator is a class that subclasses "
            f"rapo_echo.simulators.base.UserSimulator or sets `{MARKER} = True`, with a react(pairs) method"
        )
    return obj


def build_simulator(
    name: str,
    args: dict[str, Any] | None = None,
    *,
    engine: Any = None,
    scale: float = 10.0,
    seed: int = 0,
    rng: Any = None,
    where: str = "rapo.simulator.name",
) -> Any:
    """Instantiate the simulator ``name`` with ``args``; errors name the config field. ``engine``,
    ``scale``, ``seed`` and ``rng`` (a seeded, checkpointed ``random.Random``, e.g. for fence markers)
    are passed to a constructor that declares them."""
    obj = resolve_simulator(name, where)
    kwargs = dict(args or {})
    params = inspect.signature(obj).parameters
    given = {"engine": engine, "scale": scale, "seed": seed, "rng": rng}
    for key in INJECTED:
        if key in params and key not in kwargs:
            kwargs[key] = given[key]
    try:
        return obj(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}: simulator {name!r} rejected its args {args or {}}: {exc}") from exc


def invalid_reaction(scale: float, why: str = "") -> Reaction:
    """The placeholder for an item the simulator could not react to."""
    return Reaction(message="", emotion_delta=None, thought="", valid=False, raw=why, scale=scale)


def checked_reactions(
    out: Sequence[Reaction | None], n: int, *, scale: float, name: str = "simulator"
) -> list[Reaction]:
    """A simulator's answer for ``n`` items as exactly ``n`` reactions on the run's ``scale``: ``None``,
    an invalid reaction, or an emotion change that is not finite or outside ``[-scale, scale]`` become
    invalid reactions (counted by the caller); a wrong count or type is an error naming the simulator."""
    out = list(out)
    if len(out) != n:
        raise ValueError(f"simulator {name!r} returned {len(out)} reactions for {n} replies")
    checked = []
    for i, r in enumerate(out):
        if r is None:
            checked.append(invalid_reaction(scale, "simulator returned None"))
            continue
        if not isinstance(r, Reaction):
            raise TypeError(
                f"simulator {name!r} returned {type(r).__name__} for reply {i}; expected Reaction or None"
            )
        delta = r.emotion_delta
        if r.valid and delta is not None and not (math.isfinite(delta) and abs(delta) <= scale):
            log.warning("simulator %r: emotion change %r of reply %d is outside ±%g", name, delta, i, scale)
            checked.append(invalid_reaction(scale, f"emotion change {delta!r} out of range"))
            continue
        if r.valid:
            r.scale = scale
        checked.append(r)
    return checked
