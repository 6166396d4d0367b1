"""What an exported ``reward_func.py`` runs: rapo-echo's reward plugins behind OpenRLHF's contract
``reward_func(queries, prompts, labels, **kwargs) -> {"rewards", "scores", "extra_logs"}``.

* ``queries`` are prompt + response decoded *with* special tokens; each is split at the prompt's last
  assistant opening (:class:`~rapo_echo.chat_template.ChatMarkers`), and the reply is cut at its
  end-of-turn marker (no marker: the reply was truncated, ``finish_reason="length"``).
* The prompt conversation comes from the label when it carries a rapo-echo scenario (datasets written
  by :mod:`rapo_echo.openrlhf.dataset`), else from parsing the rendered prompt.
* ``rewards`` is the weighted sum of the run's rewards. A sample a reward could not score (``None``)
  gets ``invalid_reward`` instead, never a silent 0: OpenRLHF cannot mask a sample out of the loss,
  and it calls ``reward_func`` with one sample at a time, so no batch statistic (such as "the batch
  minimum minus 1") is available. The default, ``-sum(|weight|)``, is the lowest total that rewards
  scoring in [-1, 1] (all built-ins) can reach, so an invalid sample never ranks above a valid one in
  its group. The count is logged as ``rapo/invalid`` (fraction of samples).
* ``scores`` (OpenRLHF's 0-1 value for dynamic filtering) is the reward clamped to [0, 1]; 0 for an
  invalid sample.
* ``extra_logs``: ``rapo/invalid`` and, per reward, ``rapo/<name>`` (0 where that reward was invalid)
  and ``rapo/<name>_invalid``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rapo_echo.algorithms.run_config import RunConfig, load_config
from rapo_echo.chat_template import ChatMarkers
from rapo_echo.errors import ConfigError
from rapo_echo.openrlhf.dataset import scenario_from_label
from rapo_echo.rewards import RewardContext, RewardSet
from rapo_echo.types import Sample, Scenario

log = logging.getLogger(__name__)


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


class OpenRLHFReward:
    """The run's :class:`RewardSet` as an OpenRLHF reward function."""

    def __init__(
        self, rewards: RewardSet, tokenizer: Any, *, invalid_reward: float, markers: ChatMarkers | None = None
    ) -> None:
        self.rewards = rewards
        self.tokenizer = tokenizer
        self.markers = markers or ChatMarkers.from_tokenizer(tokenizer)
        self.invalid_reward = float(invalid_reward)

    @classmethod
    def from_config(
        cls, cfg: RunConfig, tokenizer: Any, *, invalid_reward: float | None = None
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
        return cls(rewards, tokenizer, invalid_reward=floor)

    @classmethod
    def from_bundle(
        cls, config_path: str | Path, tokenizer_dir: str | Path, *, invalid_reward: float | None = None
    ) -> OpenRLHFReward:
        """Build from the files an export wrote: ``run_config.yaml`` and the ``tokenizer/`` folder."""
        cfg = load_config(config_path)
        return cls.from_config(cfg, bundle_tokenizer(tokenizer_dir), invalid_reward=invalid_reward)

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
        import torch

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
        extra = {"rapo/invalid": torch.tensor(invalid, dtype=torch.float32)}
        for name in self.rewards.names:
            values = [s.rewards.get(name) for s in samples]
            extra[f"rapo/{name}"] = torch.tensor(
                [v if v is not None else 0.0 for v in values], dtype=torch.float32
            )
            extra[f"rapo/{name}_invalid"] = torch.tensor(
                [float(v is None) for v in values], dtype=torch.float32
            )
        return {
            "rewards": torch.tensor(rewards, dtype=torch.float32),
            "scores": torch.tensor(scores, dtype=torch.float32),
            "extra_logs": extra,
        }
