"""Say once, up front, when a simulator or judge runs on a model too small to give a meaningful signal.

A well-formed answer is not a meaningful one: on real ESConv ratings the embedded 135M model is at chance as
a simulated user and as a judge (docs/fidelity.md), and as an A/B judge it picks a slot rather than a reply.
Such a run still trains and evaluates (the format is enforced, rewards differ within groups), so the warning
is the only place a user learns that the numbers are noise; it names what to use instead.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

log = logging.getLogger(__name__)

WEAK_ROLE_PARAMETERS = 1_000_000_000  # below this many parameters a role's verdicts are treated as noise
_checked: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()  # roles read per engine
_unreferenced: dict[int, set[str]] = {}

INSTEAD = {
    "train": (
        "for a signal use a served 7B-70B model (--set {role}.engine=openai --set "
        "{role}.base_url=http://HOST:PORT/v1, e.g. vLLM or `rapo-echo serve`), or on this machine RAPO "
        "against the rule-based hidden-preference user (make quickstart)"
    ),
    "eval": "for a figure that means something pass a served 7B-70B model: --{role} http://HOST:PORT/v1",
    "data": "for data that means something give this role a served 7B-70B model (http://HOST:PORT/v1)",
}


def parameter_count(engine: Any) -> int | None:
    """The parameters of the model behind a local engine (``hf``, a role sharing the policy), None when
    the engine has no local model (an endpoint, ``vllm``, ``scripted``)."""
    model = getattr(engine, "model", None)
    params = getattr(model, "parameters", None)
    if not callable(params):
        return None
    try:
        return sum(int(p.numel()) for p in params())
    except Exception:  # a model object that cannot list its parameters: size unknown
        return None


def weak_role_message(engine: Any, role: str, command: str = "train") -> str | None:
    """The warning for ``role`` on ``engine``, or None when its size is unknown or large enough."""
    count = parameter_count(engine)
    if count is None or count >= WEAK_ROLE_PARAMETERS:
        return None
    instead = INSTEAD.get(command, INSTEAD["train"]).format(role=role)
    return (
        f"the {role} runs on a {count / 1e6:.0f}M-parameter model ({getattr(engine, 'name', '?')}): its "
        f"answers are well-formed but carry no meaningful signal (at chance against real seekers' ratings, "
        f"docs/fidelity.md); {instead}"
    )


def warn_if_weak(engine: Any, role: str, command: str = "train") -> str | None:
    """Log :func:`weak_role_message` once per engine and role; returns the message when it was logged.
    Called on every judge and simulator call, so the engine's size is read only at its first call in a
    role (an engine that cannot be weakly referenced is remembered by its id)."""
    try:
        roles = _checked.setdefault(engine, set())
    except TypeError:
        roles = _unreferenced.setdefault(id(engine), set())
    if role in roles:
        return None
    roles.add(role)
    message = weak_role_message(engine, role, command)
    if message is not None:
        log.warning(message)
    return message
