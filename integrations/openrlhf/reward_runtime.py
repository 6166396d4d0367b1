"""What an exported ``reward_func.py`` runs: rapo-echo's reward plugins behind OpenRLHF's contract
``reward_func(queries, prompts, labels, **kwargs) -> {"rewards", "scores", "extra_logs"}``.

How a query is split, why an unscorable sample gets ``invalid_reward`` (never 0) and why
``reward_func`` never raises: docs/scaling.md, "Multi-node with OpenRLHF and Ray". ``scores`` is the
reward clamped to [0, 1] (0 for an invalid sample); ``extra_logs`` holds ``rapo/invalid``,
``rapo/error`` and, per reward, ``rapo/<name>`` (0 where that reward was invalid) and
``rapo/<name>_invalid``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rapo_echo.chat_template import ChatMarkers
from rapo_echo.errors import ConfigError
from rapo_echo.rewards import RewardContext, RewardSet
from rapo_echo.training.run_config import RunConfig, load_config
from rapo_echo.types import Sample, Scenario

from .dataset import scenario_from_label

log = logging.getLogger(__name__)

FAILURES_BEFORE_ERROR = 8  # failed samples in a row before an ERROR names the endpoints (and again every 8)


def bundle_tokenizer(path: str | Path) -> Any:
    """The policy tokenizer an export saved (a folder with tokenizer files and the chat template)."""
    from rapo_echo.models import ResolvedModel, load_tokenizer

    if not Path(path).is_dir():
        raise ConfigError(f"tokenizer folder {path} not found; re-run 'rapo-echo openrlhf export'")
    return load_tokenizer(ResolvedModel(str(path), source=str(path)))


def default_invalid_reward(cfg: RunConfig) -> float:
    """``-sum(|weight|)`` over the run's rewards (the floor of a sum of [-1, 1] scores)."""
    return -sum(abs(r.weight) for r in cfg.rewards) if cfg.rewards else -1.0


def role_engines(cfg: RunConfig) -> RewardContext:
    """Engines for the simulator and judge roles. ``engine: policy`` cannot work here (the policy lives
    inside OpenRLHF), so those roles are left empty and a reward needing them fails with a hint."""
    from rapo_echo.engines import make_engine

    engines: dict[str, Any] = {}
    shared: dict[Any, Any] = {}  # one engine per endpoint for the roles that share it
    for role in ("simulator", "judge"):
        ecfg = getattr(cfg, role)
        engines[role] = None if ecfg.engine == "policy" else make_engine(ecfg, role=role, shared=shared)
    return RewardContext(policy=None, **engines)


def describe_endpoints(cfg: RunConfig) -> str:
    """The simulator's and judge's engines as an ERROR names them: ``judge http://host:8000/v1 (model
    M)`` for a served role, the engine kind otherwise."""
    parts = []
    for role in ("judge", "simulator"):
        e = getattr(cfg, role)
        if e.engine == "openai":
            parts.append(f"{role} {e.base_url} (model {e.model})")
        elif e.engine != "policy":
            parts.append(f"{role} engine {e.engine} ({e.model})")
    return "; ".join(parts) or "no simulator or judge engine"


def reward_payload(
    rewards: Sequence[float],
    scores: Sequence[float],
    invalid: Sequence[float],
    error: Sequence[float],
    per_reward: dict[str, Sequence[float | None]],
) -> dict[str, Any]:
    """OpenRLHF's return value: ``rewards``, ``scores`` and ``extra_logs`` (same keys for every call)."""
    import torch

    extra = {
        "rapo/invalid": torch.tensor(list(invalid), dtype=torch.float32),
        "rapo/error": torch.tensor(list(error), dtype=torch.float32),
    }
    for name, values in per_reward.items():
        extra[f"rapo/{name}"] = torch.tensor(
            [v if v is not None else 0.0 for v in values], dtype=torch.float32
        )
        extra[f"rapo/{name}_invalid"] = torch.tensor([float(v is None) for v in values], dtype=torch.float32)
    return {
        "rewards": torch.tensor(list(rewards), dtype=torch.float32),
        "scores": torch.tensor(list(scores), dtype=torch.float32),
        "extra_logs": extra,
    }


class FailureCounter:
    """Failed samples in a row (thread-safe: OpenRLHF scores samples in threads): a WARNING for each
    failure, an ERROR naming ``endpoints`` whenever the streak reaches a multiple of ``every``; a call
    with a scored sample ends the streak."""

    def __init__(self, endpoints: str, every: int = FAILURES_BEFORE_ERROR) -> None:
        self.endpoints = endpoints
        self.every = max(1, int(every))
        self.in_a_row = 0
        self.total = 0
        self._lock = threading.Lock()

    def ok(self) -> None:
        with self._lock:
            self.in_a_row = 0

    def failed(self, n: int, what: str, invalid_reward: float, *, warn: bool = True) -> None:
        """``n`` samples failed because of ``what``; a WARNING unless ``warn`` is False (already said)."""
        with self._lock:
            before, self.in_a_row = self.in_a_row, self.in_a_row + n
            self.total += n
            streak = self.in_a_row
        if warn:
            log.warning(
                "reward_func: %d sample(s) could not be scored (%s); they get reward %g (rapo/invalid, "
                "rapo/error)",
                n,
                what,
                invalid_reward,
            )
        if streak // self.every > before // self.every:
            log.error(
                "reward_func: %d samples in a row could not be scored, the last with %s. Every one gets "
                "reward %g, so training learns nothing from them: check the endpoint(s) the rewards call: %s",
                streak,
                what,
                invalid_reward,
                self.endpoints,
            )


class OpenRLHFReward:
    """The run's :class:`RewardSet` as an OpenRLHF reward function (never raises, see the module)."""

    def __init__(
        self,
        rewards: RewardSet,
        tokenizer: Any,
        *,
        invalid_reward: float,
        markers: ChatMarkers | None = None,
        endpoints: str = "",
        failures_before_error: int = FAILURES_BEFORE_ERROR,
    ) -> None:
        self.rewards = rewards
        self.tokenizer = tokenizer
        self.markers = markers or ChatMarkers.from_tokenizer(tokenizer)
        self.invalid_reward = float(invalid_reward)
        self.failures = FailureCounter(
            endpoints or "the run config's judge and simulator", failures_before_error
        )

    @classmethod
    def from_config(
        cls,
        cfg: RunConfig,
        tokenizer: Any,
        *,
        invalid_reward: float | None = None,
        failures_before_error: int = FAILURES_BEFORE_ERROR,
    ) -> OpenRLHFReward:
        """Build the rewards (and the engines of the roles they use) from a run config."""
        if not cfg.rewards:
            raise ConfigError("rewards: the run lists no rewards; OpenRLHF needs at least one (e.g. judge)")
        ctx = role_engines(cfg)
        try:
            rewards = RewardSet.from_specs(cfg.rewards, ctx)
        except ConfigError as exc:
            raise ConfigError(
                f"{exc} (under OpenRLHF the policy is not available to rapo-echo: give judge/simulator "
                "'engine: openai' with the base_url of a 'vllm serve' replica)"
            ) from exc
        floor = default_invalid_reward(cfg) if invalid_reward is None else invalid_reward
        return cls(
            rewards,
            tokenizer,
            invalid_reward=floor,
            endpoints=describe_endpoints(cfg),
            failures_before_error=failures_before_error,
        )

    def sample(self, index: int, query: str, prompt: str | None, label: Any) -> Sample:
        """One OpenRLHF query as a rapo-echo :class:`Sample`."""
        prompt_text, raw = self.markers.split_query(query, prompt)
        reply, ended = self.markers.clean_reply(raw)
        scenario = scenario_from_label(label)
        if scenario is None:
            conv = self.markers.parse(prompt_text)
            system = [m for m in conv if m["role"] == "system"]
            meta: dict[str, Any] = {"source": "openrlhf", "label": label}
            if system:
                meta["system"] = system[0]["content"]
            scenario = Scenario(
                id=f"openrlhf-{index}", messages=[m for m in conv if m["role"] != "system"], meta=meta
            )
        encode = self.tokenizer
        return Sample(
            scenario=scenario,
            group=index,
            prompt_ids=encode(prompt_text, add_special_tokens=False)["input_ids"],
            completion_ids=encode(reply, add_special_tokens=False)["input_ids"] if reply else [],
            logprobs=None,
            text=reply,
            finish_reason="stop" if ended else "length",
        )

    def __call__(
        self,
        queries: Sequence[str],
        prompts: Sequence[str] | None = None,
        labels: Sequence[Any] | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        """Score the samples; any failure makes them invalid instead of raising (see the module)."""
        try:
            out = self._score(queries, prompts, labels)
        except Exception as exc:  # never into OpenRLHF, which would drop the sample and later the job
            self.failures.failed(len(queries), f"{type(exc).__name__}: {exc}", self.invalid_reward)
            return self.failed(len(queries))
        invalid = int(out["extra_logs"]["rapo/invalid"].sum().item())
        if queries and invalid == len(queries):  # answered, but no reward could score them
            what = "no reward could score them (e.g. the judge's answers could not be read)"
            self.failures.failed(invalid, what, self.invalid_reward, warn=False)
        else:
            self.failures.ok()
        return out

    def failed(self, n: int) -> dict[str, Any]:
        """The payload of ``n`` samples that could not be scored at all."""
        none: list[float | None] = [None] * n
        return reward_payload(
            [self.invalid_reward] * n,
            [0.0] * n,
            [1.0] * n,
            [1.0] * n,
            dict.fromkeys(self.rewards.names, none),
        )

    def _score(
        self, queries: Sequence[str], prompts: Sequence[str] | None, labels: Sequence[Any] | None
    ) -> dict[str, Any]:
        n = len(queries)
        prompts_ = list(prompts) if prompts is not None else [None] * n
        labels_ = list(labels) if labels is not None else [None] * n
        if len(prompts_) != n or len(labels_) != n:
            raise ValueError(
                f"reward_func: {n} queries but {len(prompts_)} prompts and {len(labels_)} labels"
            )
        samples = [self.sample(i, q, p, lab) for i, (q, p, lab) in enumerate(zip(queries, prompts_, labels_))]
        if samples:
            self.rewards.score(samples)
        rewards = [s.reward if s.reward is not None else self.invalid_reward for s in samples]
        scores = [min(1.0, max(0.0, s.reward)) if s.reward is not None else 0.0 for s in samples]
        invalid = [0.0 if s.reward is not None else 1.0 for s in samples]
        if any(invalid):
            log.warning(
                "%d of %d samples could not be scored; they get reward %g",
                sum(invalid),
                n,
                self.invalid_reward,
            )
        per_reward = {name: [s.rewards.get(name) for s in samples] for name in self.rewards.names}
        return reward_payload(rewards, scores, invalid, [0.0] * n, per_reward)


class BundleReward:
    """What an exported ``reward_func.py`` calls: an :class:`OpenRLHFReward` built on first use from
    the bundle's files. A bundle that cannot be loaded costs the calls an ERROR and invalid rewards,
    never an exception (it is tried again on the next call)."""

    def __init__(
        self,
        config_path: str | Path,
        tokenizer_dir: str | Path,
        *,
        invalid_reward: float | None = None,
        failures_before_error: int = FAILURES_BEFORE_ERROR,
    ) -> None:
        self.config_path, self.tokenizer_dir = Path(config_path), Path(tokenizer_dir)
        self.invalid_reward = invalid_reward
        self.failures_before_error = failures_before_error
        self.reward: OpenRLHFReward | None = None
        self._lock = threading.Lock()

    def __call__(self, queries: Sequence[str], *args: Any, **kw: Any) -> dict[str, Any]:
        """:meth:`OpenRLHFReward.__call__`'s arguments."""
        with self._lock:
            if self.reward is None:
                try:
                    self.reward = OpenRLHFReward.from_config(
                        load_config(self.config_path),
                        bundle_tokenizer(self.tokenizer_dir),
                        invalid_reward=self.invalid_reward,
                        failures_before_error=self.failures_before_error,
                    )
                except Exception as exc:  # never into OpenRLHF
                    n = len(queries)
                    floor = -1.0 if self.invalid_reward is None else float(self.invalid_reward)
                    log.error(
                        "reward_func: the rewards of %s could not be built (%s: %s); %d sample(s) get "
                        "reward %g",
                        self.config_path,
                        type(exc).__name__,
                        exc,
                        n,
                        floor,
                    )
                    return reward_payload([floor] * n, [0.0] * n, [1.0] * n, [1.0] * n, {})
        return self.reward(queries, *args, **kw)
