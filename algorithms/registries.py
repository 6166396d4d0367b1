"""The open registries of the shared formulas: advantage estimators, policy losses and KL estimators.

Each is a :class:`rapo_echo.plugins.Registry`, the door ``--algo`` uses: a name in the ``loss`` section
(``loss.advantage``, ``loss.policy_loss``, ``loss.kl_estimator``) resolves to an entry point of the kind's
group (rapo-echo's own formulas in :mod:`.core` are registered there by its pyproject.toml, exactly as a
package registers one) or to a ``module:function`` path. A function is used only if it declares its kind
with the decorator below; anything else a config names is refused before it is called::

    from rapo_echo.algorithms.registries import advantage_estimator

    @advantage_estimator
    def my_advantages(rewards, groups, valid, *, eps=1e-4): ...

    # its package's pyproject.toml
    [project.entry-points."rapo_echo.advantage_estimators"]
    mine = "my_pkg.estimators:my_advantages"
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, TypeVar, cast, get_args, overload

from torch import Tensor

from rapo_echo.plugins import Registry

KIND = "rapo_echo_formula"  # the attribute a declaration sets to its kind
AGGREGATION = "rapo_echo_aggregation"  # a policy loss's own aggregation (``loss.agg: auto``)

F = TypeVar("F", bound=Callable[..., Any])
Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


class AdvantageEstimator(Protocol):
    """``(rewards [N], groups [N] int ids, valid [N] bool, *, eps) -> advantages [N]``: 0 for an invalid
    sample; ``eps`` is ``loss.std_eps``."""

    def __call__(self, rewards: Tensor, groups: Tensor, valid: Tensor, *, eps: float = ...) -> Tensor: ...


class PolicyLoss(Protocol):
    """``(logp, old_logp [B, T], advantages [B] or [B, T], mask [B, T], *, eps_low, eps_high) -> (loss [B, T],
    stats)``; ``stats`` holds ``clip_frac`` and ``ratio_mean``; the clip ranges are given only when the
    config sets them (``loss.eps_low`` / ``eps_high``), so the function's defaults are its own."""

    def __call__(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        eps_low: float = ...,
        eps_high: float = ...,
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


class KlEstimator(Protocol):
    """``(logp, ref_logp [B, T], *, mask) -> KL(pi || pi_ref) per token [B, T]``, 0 where ``mask`` is 0."""

    def __call__(self, logp: Tensor, ref_logp: Tensor, *, mask: Tensor | None = None) -> Tensor: ...


def _declare(fn: F, kind: str) -> F:
    setattr(fn, KIND, kind)
    return fn


def advantage_estimator(fn: F) -> F:
    """Declare ``fn`` an advantage estimator (:class:`AdvantageEstimator`)."""
    return _declare(fn, "advantage estimator")


@overload
def policy_loss(fn: F, *, aggregation: Aggregation = ...) -> F: ...
@overload
def policy_loss(fn: None = None, *, aggregation: Aggregation = ...) -> Callable[[F], F]: ...
def policy_loss(fn: F | None = None, *, aggregation: Aggregation = "token-mean") -> F | Callable[[F], F]:
    """Declare ``fn`` a policy loss (:class:`PolicyLoss`); ``aggregation`` is the one ``loss.agg: auto``
    resolves to for it (GSPO: ``seq-mean-token-mean``)."""
    if aggregation not in get_args(Aggregation):
        raise ValueError(f"policy_loss: aggregation is one of {get_args(Aggregation)}, got {aggregation!r}")

    def declare(f: F) -> F:
        setattr(f, AGGREGATION, aggregation)
        return _declare(f, "policy loss")

    return declare if fn is None else declare(fn)


def kl_estimator(fn: F) -> F:
    """Declare ``fn`` a KL estimator (:class:`KlEstimator`)."""
    return _declare(fn, "KL estimator")


def aggregation_of(loss: PolicyLoss) -> Aggregation:
    """The aggregation ``loss.agg: auto`` resolves to for the policy loss ``loss``."""
    return cast(Aggregation, getattr(loss, AGGREGATION, "token-mean"))


def _registry(group: str, kind: str) -> Registry[Any]:
    """The registry of ``kind``: it takes a callable declared with the decorator named after the kind."""
    decorator = kind.lower().replace(" ", "_")

    def refuse(obj: Any) -> str | None:
        if callable(obj) and getattr(obj, KIND, None) == kind:
            return None
        return f"is not a declared {kind}: decorate the function with @{__name__}.{decorator}"

    return Registry(group, kind, refuse)


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = _registry(
    "rapo_echo.advantage_estimators", "advantage estimator"
)
POLICY_LOSSES: Registry[PolicyLoss] = _registry("rapo_echo.policy_losses", "policy loss")
KL_ESTIMATORS: Registry[KlEstimator] = _registry("rapo_echo.kl_estimators", "KL estimator")
