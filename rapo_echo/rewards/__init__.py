"""Reward plugins: the protocol, the registry, the TRL-function adapter and weighted combination
(docs/extending.md#a-reward-plugin).

A reward is a class whose instances score a batch of :class:`~rapo_echo.types.Sample` (per sample a
float, ``None``, invalid: masked out of the loss and counted, or a :class:`RewardOutput`), constructed
with the spec's ``args`` and, when it declares ``ctx``, the run's :class:`RewardContext`; or a TRL-style
function ``f(prompts, completions, **columns)``. Names resolve to a built-in, an entry point of the
``rapo_echo.rewards`` group, or a ``module:attr`` path, whose object must declare itself a plugin
(:func:`is_reward_plugin`) before anything is called; importing the module still runs its code: a config
is code to trust.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol

from rapo_echo.errors import ConfigError
from rapo_echo.plugins import resolve_object
from rapo_echo.types import Sample

ENTRY_POINT_GROUP = "rapo_echo.rewards"
BUILTINS = {
    "length": "rapo_echo.rewards.builtin:LengthReward",
    "format": "rapo_echo.rewards.builtin:FormatReward",
    "question": "rapo_echo.rewards.builtin:QuestionReward",
    "think_format": "rapo_echo.rewards.builtin:ThinkFormatReward",
    "judge": "rapo_echo.rewards.judge:JudgeReward",
    "humanlike": "rapo_echo.rewards.echo_n1:HumanlikeReward",
    "empathy": "rapo_echo.rewards.echo_n1:EmpathyReward",
    "echo_n1": "rapo_echo.rewards.echo_n1:EchoN1Reward",
    "scalar_rm": "rapo_echo.rewards.scalar_rm:ScalarRMReward",
}


@dataclass
class RewardOutput:
    """What a reward says about one sample."""

    score: float | None
    critique: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardContext:
    """What a reward may use: the engines of the run's roles (any may be None) and the run directory
    (None outside a training run)."""

    policy: Any = None
    simulator: Any = None
    judge: Any = None
    run_dir: Any = None


class Reward(Protocol):
    """A batch reward: one output per sample, in order."""

    name: str

    def __call__(self, samples: Sequence[Sample]) -> Sequence[RewardOutput | float | None]: ...


def is_reward_plugin(obj: Any) -> bool:
    """Whether ``obj`` declares itself a reward plugin: a Python function with a ``completions``
    parameter (TRL's reward-function protocol, ``f(prompts, completions, **columns)``), or a class that
    subclasses :class:`Reward` or sets ``is_reward_plugin = True``; a function may set the marker too."""
    if getattr(obj, "is_reward_plugin", False) is True:
        return True
    if inspect.isclass(obj):
        return Reward in obj.__mro__[1:]
    if inspect.isfunction(obj):
        params = inspect.signature(obj).parameters
        named = {p.name for p in params.values() if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
        return "completions" in named
    return False


class TRLFunctionReward:
    """Adapter for a TRL-style reward function ``f(prompts, completions, **columns)``.

    ``prompts`` are the prompt conversations and ``completions`` the replies in TRL's conversational
    form (``[{"role": "assistant", "content": text}]``); the columns are ``completion_ids``,
    ``profile``, ``reference``, ``scenario_id`` and ``meta`` (one entry per sample), and, as TRL passes
    a dataset's columns, every other column of the data rows (``meta["columns"]``; ``None`` for a row
    without it).
    """

    def __init__(
        self, fn: Callable[..., Sequence[float | None]], name: str | None = None, **kwargs: Any
    ) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "reward")
        self.kwargs = kwargs

    def __call__(self, samples: Sequence[Sample]) -> list[float | None]:
        columns: dict[str, Any] = {
            "completion_ids": [s.completion_ids for s in samples],
            "profile": [s.scenario.profile for s in samples],
            "reference": [s.scenario.reference for s in samples],
            "scenario_id": [s.scenario.id for s in samples],
            "meta": [s.scenario.meta for s in samples],
        }
        extra = [s.scenario.meta.get("columns") or {} for s in samples]
        for name in dict.fromkeys(k for row in extra for k in row):
            if name not in columns and name not in self.kwargs and name not in ("prompts", "completions"):
                columns[name] = [row.get(name) for row in extra]
        out = self.fn(
            prompts=[s.scenario.messages for s in samples],
            completions=[[{"role": "assistant", "content": s.text}] for s in samples],
            **columns,
            **self.kwargs,
        )
        return list(out)


def resolve_reward(name: str, where: str) -> Any:
    """The object a reward name resolves to. Built-ins and entry points are registered on purpose, so
    they are trusted; an object named by path must pass :func:`is_reward_plugin`."""
    obj = resolve_object(name, group=ENTRY_POINT_GROUP, builtins=BUILTINS, kind="reward", where=where)
    registered = set(BUILTINS.values()) | {ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if f"{getattr(obj, '__module__', '')}:{getattr(obj, '__qualname__', '')}" in registered:
        return obj
    if not is_reward_plugin(obj):
        raise ConfigError(
            f"{where}: {name!r} is not a reward plugin, so it is not called. A reward is a function "
            "f(prompts, completions, **columns) or a class that subclasses rapo_echo.rewards.Reward or sets "
            "the class attribute is_reward_plugin = True (see docs/extending.md)"
        )
    return obj


def build_reward(name: str, args: dict[str, Any], ctx: RewardContext, *, where: str = "rewards") -> Reward:
    """Instantiate one reward from its spec; errors name the config field."""
    obj = resolve_reward(name, where)
    if inspect.isclass(obj):
        kwargs = dict(args)
        if "ctx" in inspect.signature(obj).parameters:
            kwargs["ctx"] = ctx
        try:
            inst = obj(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"{where}: reward {name!r} rejected its args {args}: {exc}") from exc
        if not getattr(inst, "name", None):
            inst.name = name
        return inst
    if callable(obj):
        return TRLFunctionReward(obj, name=name.split(":")[-1].split(".")[-1], **args)
    raise ConfigError(f"{where}: {name!r} is neither a reward class nor a function")


def as_output(value: RewardOutput | float | int | None, where: str) -> RewardOutput:
    """Normalise what a reward returned for one sample; NaN/inf count as invalid."""
    if isinstance(value, RewardOutput):
        out = value
    elif value is None:
        out = RewardOutput(None)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out = RewardOutput(float(value))
    else:
        raise TypeError(f"{where} returned {type(value).__name__}; expected float, None or RewardOutput")
    if out.score is not None and not math.isfinite(out.score):
        out = RewardOutput(None, out.critique, {**out.info, "nonfinite": True})
    return out


class RewardSet:
    """Several rewards combined with weights: total = sum of weight * score, None if any is None."""

    def __init__(self, rewards: Sequence[tuple[Reward, float]]) -> None:
        self.rewards = list(rewards)

    @classmethod
    def from_specs(cls, specs: Sequence[Any], ctx: RewardContext) -> RewardSet:
        """Build from config ``RewardSpec``s (objects with ``name``, ``weight``, ``args``)."""
        built = []
        for i, spec in enumerate(specs):
            built.append((build_reward(spec.name, spec.args, ctx, where=f"rewards.{i}.name"), spec.weight))
        names = [r.name for r, _ in built]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ConfigError(f"rewards: the same reward is listed twice: {', '.join(sorted(dupes))}")
        return cls(built)

    @property
    def names(self) -> list[str]:
        return [r.name for r, _ in self.rewards]

    def step_metrics(self) -> list[dict[str, float]]:
        """Each reward's own per-step metrics where it has any (e.g. a judge's position bias, through
        its ``step_metrics()``), since the last call."""
        return [r.step_metrics() for r, _ in self.rewards if callable(getattr(r, "step_metrics", None))]

    def score(self, samples: Sequence[Sample]) -> None:
        """Fill ``rewards``, ``reward``, ``critique`` and ``info`` of every sample in place."""
        for reward, _weight in self.rewards:
            outputs = list(reward(samples))
            if len(outputs) != len(samples):
                raise ValueError(
                    f"reward {reward.name!r} returned {len(outputs)} scores for {len(samples)} samples"
                )
            for s, value in zip(samples, outputs):
                out = as_output(value, f"reward {reward.name!r}")
                s.rewards[reward.name] = out.score
                if out.critique:
                    s.critique = out.critique if not s.critique else f"{s.critique}\n{out.critique}"
                if out.info:
                    s.info.setdefault(reward.name, {}).update(out.info)
        for s in samples:
            parts = [(s.rewards.get(r.name), w) for r, w in self.rewards]
            s.reward = None if any(v is None for v, _ in parts) else sum(v * w for v, w in parts)  # type: ignore[operator,misc]  # no None: checked in the same expression
