"""rapo-echo's rewards as TRL reward functions (``GRPOTrainer(reward_funcs=...)``; TRL 1.16's convention);
what a function reads and returns is in docs/integrations.md, "TRL: our rewards as reward functions".

A role is a model spec or an engine object; one engine per spec is shared by every function built here.
TRL is not imported: the functions only follow its convention.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from rapo_echo.engines import ChatEngine, engine_from_spec
from rapo_echo.errors import ConfigError
from rapo_echo.rewards import RewardContext, as_output, build_reward
from rapo_echo.types import Conversation, Sample, Scenario, msg

# names that stand for one of ours with fixed args
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "sage_emotion": ("emotion_change", {"simulator": "sage"}),
}
Role = str | ChatEngine | None


@cache
def _engine(spec: str) -> ChatEngine:
    return engine_from_spec(spec)


def role_engine(role: Role) -> ChatEngine | None:
    """The engine of a role given as a model spec (one engine per spec, shared), an engine, or None."""
    if role is None or not isinstance(role, str):
        return role
    return _engine(role)


def trl_reward(
    name: str,
    *,
    judge: Role = None,
    simulator: Role = None,
    policy: Role = None,
    args: Mapping[str, Any] | None = None,
) -> TRLReward:
    """A TRL reward function scoring with our reward ``name`` (its ``args`` as under ``rewards:``), on the
    engines of the roles it needs (module doc)."""
    base, fixed = ALIASES.get(name, (name, {}))
    engines = {"policy": policy, "simulator": simulator, "judge": judge}
    ctx = RewardContext(**{role: role_engine(given) for role, given in engines.items()})
    reward = build_reward(base, {**fixed, **(args or {})}, ctx, where=f"trl_reward({name!r})")
    return TRLReward(reward, name)


class TRLReward:
    """One of our rewards behind TRL's reward-function call (:func:`trl_reward`)."""

    def __init__(self, reward: Any, name: str) -> None:
        self.reward = reward
        self.__name__ = name  # TRL names the reward (its logs and the completions table) by __name__

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        log_metric = columns.pop("log_metric", None)
        for key in ("trainer_state", "log_extra", "environments"):
            columns.pop(key, None)
        samples = to_samples(prompts, completions, completion_ids, columns)
        outputs = list(self.reward(samples))
        if len(outputs) != len(samples):
            raise ValueError(f"{self.__name__}: {len(outputs)} scores for {len(samples)} completions")
        if log_metric is not None and callable(getattr(self.reward, "step_metrics", None)):
            for key, value in self.reward.step_metrics().items():
                log_metric(f"{self.__name__}/{key}", float(value))
        return [as_output(o, self.__name__).score for o in outputs]


def to_samples(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]] | None,
    columns: Mapping[str, Sequence[Any]],
) -> list[Sample]:
    """TRL's batch as our samples (module doc); a column that is not one value per completion is an error
    naming it."""
    n = len(prompts)
    if len(completions) != n:
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    for key, values in columns.items():
        if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != n:
            raise ValueError(f"column {key!r}: expected one value per completion ({n})")
    out = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        row = {k: v[i] for k, v in columns.items()}
        context, reply = _context_and_reply(prompt, completion)
        profile = _profile(row.get("profile"), i)
        sid = row.get("scenario_id") or row.get("id") or _hash(context)
        scenario = Scenario(str(sid), context, profile, row.get("reference"), {"columns": row})
        ids = list(completion_ids[i]) if completion_ids is not None else []
        out.append(Sample(scenario, group=i, prompt_ids=[], completion_ids=ids, logprobs=None, text=reply))
    return out


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of TRL's multimodal content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        return "".join(str(p.get("text", "")) for p in parts)
    return "" if content is None else str(content)


def _messages(value: Any) -> Conversation:
    if isinstance(value, str):
        return [msg("user", value)]
    return [msg(str(m.get("role", "user")), _text(m.get("content"))) for m in value]


def _context_and_reply(prompt: Any, completion: Any) -> tuple[Conversation, str]:
    """The dialogue the reply answers, and the reply (the last assistant message of a conversational
    completion; what comes before it joins the dialogue)."""
    context = _messages(prompt)
    if isinstance(completion, str):
        return context, completion
    messages = [msg(str(m.get("role", "")), _text(m.get("content"))) for m in completion]
    last = max((j for j, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        return context + messages, ""
    return context + messages[:last], messages[last]["content"]


def _profile(value: Any, i: int) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError(f"column 'profile', row {i}: not a JSON object: {value[:80]!r}") from None
    if not isinstance(value, Mapping):
        raise ConfigError(f"column 'profile', row {i}: expected a mapping, got {type(value).__name__}")
    return dict(value)


def _hash(context: Conversation) -> str:
    return hashlib.sha256(json.dumps(context, sort_keys=True).encode()).hexdigest()[:16]
