"""What every algorithm shares: the training items a rollout produces, the micro-batch the loss sees,
and the :class:`Algorithm` base class with the GRPO loss core."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from rapo_echo.algorithms.core import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES, aggregate
from rapo_echo.types import Sample, SamplingParams, Scenario, ValidationResult

if TYPE_CHECKING:
    from rapo_echo.algorithms.run_config import RunConfig
    from rapo_echo.engines.base import ChatEngine
    from rapo_echo.policy import Policy, TokenBatch
    from rapo_echo.rewards import RewardSet

PG = "pg"  # an on-policy sample trained with the policy-gradient loss
SD = "sd"  # a self-distillation target (RAPO): a corrected reply learnt under the plain context


@dataclass
class TrainItem:
    """One sequence the loss trains on.

    Multi-turn items (RLVER) hold a whole dialogue after its first prompt in ``completion_ids``: the
    policy's sampled turns and, between them, the user's turns; ``loss_mask`` is 1 on the policy's
    tokens and 0 on the user's (None: every completion token counts). PPO items also carry per-token
    ``token_advantages``, ``old_values`` and ``returns`` (one per completion token)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float = 0.0
    old_logprobs: list[float] | None = None  # filled by the trainer (see Trainer._fill_old)
    ref_logprobs: list[float] | None = None
    kind: str = PG
    group: int = 0
    weight: float = 1.0
    sample: int = -1  # index into Rollout.samples (or -1)
    # The log-probs the sampler reported for the completion tokens (None: it reported none). The
    # trainer compares them with its own forward (``train/sampler_logprob_gap``) and uses them as
    # old log-probs only where they match the training forward's numerics.
    sampler_logprobs: list[float] | None = None
    loss_mask: list[int] | None = None
    token_advantages: list[float] | None = None
    old_values: list[float] | None = None
    returns: list[float] | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def loss_tokens(self) -> int:
        """How many completion tokens carry the loss."""
        return len(self.completion_ids) if self.loss_mask is None else int(sum(self.loss_mask))


@dataclass
class Rollout:
    """What one rollout produced: the samples (for logging), the items to train on, metrics."""

    samples: list[Sample]
    items: list[TrainItem]
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class MicroBatch:
    """Tensors of one micro-batch, all [rows, n_targets] except ``advantages``/``weights`` [rows]."""

    items: list[TrainItem]
    batch: TokenBatch
    mask: torch.Tensor
    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    advantages: torch.Tensor
    weights: torch.Tensor
    kinds: list[str]

    def kind_mask(self, kind: str) -> torch.Tensor:
        rows = torch.tensor([k == kind for k in self.kinds], dtype=self.mask.dtype, device=self.mask.device)
        return self.mask * rows[:, None]


@dataclass
class AlgoContext:
    """The engines and rewards an algorithm works with."""

    policy: Policy
    rewards: RewardSet
    simulator: ChatEngine | None = None
    judge: ChatEngine | None = None


def totals_of(items: Sequence[TrainItem], kind: str) -> dict[str, float]:
    """Token and sequence counts of the items of one kind (the normalisers of aggregation)."""
    chosen = [it for it in items if it.kind == kind]
    return {"tokens": float(sum(it.loss_tokens for it in chosen)), "seqs": float(len(chosen))}


class Algorithm:
    """Base class: GRPO's loss core over ``pg`` items; subclasses add rollout shape and extra terms."""

    name = "base"
    progress_keys: tuple[str, ...] = ("reward/mean", "loss/total")  # shown on the progress bar

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Config overlay applied before the user's YAML."""
        return {}

    def __init__(self, cfg: RunConfig, ctx: AlgoContext) -> None:
        self.cfg = cfg
        self.ctx = ctx

    @property
    def needs_reference(self) -> bool:
        return self.cfg.loss.beta > 0

    def rollout(self, scenarios: list[Scenario], step: int) -> Rollout:
        raise NotImplementedError

    # The score held-out validation ranks checkpoints by (higher is better; see algorithms/validation);
    # None: this algorithm has no single-reply score to validate with.
    validation_key: str | None = None
    # whether :meth:`validate` can play held-out contexts on as dialogues (``validation.turns`` > 1)
    validation_dialogues: bool = False

    def greedy_replies(self, scenarios: list[Scenario], max_new_tokens: int) -> list[Sample]:
        """One greedy reply per scenario, as the policy is used after training."""
        policy = self.ctx.policy
        prompt_ids = [policy.prompt_ids(s) for s in scenarios]
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, n=1)
        gens = policy.generator.generate_ids(prompt_ids, params)
        return [
            Sample(
                scenario=sc,
                group=i,
                prompt_ids=g[0].prompt_ids or p,
                completion_ids=g[0].token_ids,
                logprobs=None,
                text=g[0].text,
                finish_reason=g[0].finish_reason,
            )
            for i, (sc, p, g) in enumerate(zip(scenarios, prompt_ids, gens))
        ]

    def validate(self, scenarios: list[Scenario], max_new_tokens: int, turns: int = 1) -> ValidationResult:
        """Validation metrics of the policy's greedy replies to held-out ``scenarios`` (``val/...``),
        including :attr:`validation_key`, and that key's score per scenario; ``turns`` > 1 (only where
        :attr:`validation_dialogues`): each scenario is played on for that many replies."""
        raise NotImplementedError(f"{self.name} has no validation score")

    def advantages(self, rewards: Sequence[float | None], groups: Sequence[int]) -> list[float]:
        """Advantages from the configured estimator; invalid (None) rewards get 0."""
        valid = torch.tensor([r is not None for r in rewards])
        r = torch.tensor([0.0 if v is None else float(v) for v in rewards], dtype=torch.float64)
        g = torch.tensor(list(groups), dtype=torch.long)
        est = ADVANTAGE_ESTIMATORS[self.cfg.loss.advantage]
        return est(r, g, valid, eps=self.cfg.loss.std_eps).tolist()

    def pg_loss(
        self, mb: MicroBatch, logp: torch.Tensor, entropy: torch.Tensor, totals: dict[str, dict[str, float]]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The GRPO objective over the ``pg`` rows: clipped policy loss + beta * KL - entropy bonus,
        aggregated with the mini-batch totals so micro-batch losses add up exactly."""
        lc = self.cfg.loss
        mask = mb.kind_mask(PG)
        tot = totals[PG]
        metrics: dict[str, torch.Tensor] = {}
        if tot["seqs"] == 0:
            return logp.sum() * 0.0, metrics
        norm = lc.norm_constant or self.cfg.rollout.max_new_tokens

        def agg(x: torch.Tensor) -> torch.Tensor:
            return aggregate(
                x, mask, lc.agg, total_tokens=tot["tokens"], total_seqs=tot["seqs"], norm_constant=norm
            )

        eps = {k: v for k, v in (("eps_low", lc.eps_low), ("eps_high", lc.eps_high)) if v is not None}
        pg_tok, stats = POLICY_LOSSES[lc.policy_loss](logp, mb.old_logp, mb.advantages, mask, **eps)
        per = pg_tok
        metrics["loss/pg"] = agg(pg_tok).detach()
        share = mask.sum() / tot["tokens"]
        metrics["clip_frac"] = stats["clip_frac"].detach() * share
        if lc.beta > 0 and mb.ref_logp is not None:
            kl = KL_ESTIMATORS[lc.kl_estimator](logp, mb.ref_logp, mask=mask)
            per = per + lc.beta * kl
            metrics["kl"] = (kl * mask).sum().detach() / tot["tokens"]
            metrics["loss/kl"] = lc.beta * agg(kl).detach()
        if lc.entropy_coef > 0:
            per = per - lc.entropy_coef * entropy
        metrics["entropy"] = (entropy.detach() * mask).sum() / tot["tokens"]
        loss = agg(per)
        metrics["loss/grpo"] = loss.detach()
        return loss, metrics

    def loss(
        self,
        mb: MicroBatch,
        logp: torch.Tensor,
        entropy: torch.Tensor,
        totals: dict[str, dict[str, float]],
        gathered: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's share of the mini-batch loss, and additive metric contributions.
        ``gathered`` holds log-probs at the ids asked for by :meth:`forward_kwargs`, if any."""
        return self.pg_loss(mb, logp, entropy, totals)

    def forward_temperature(self, mb: MicroBatch) -> float | torch.Tensor:
        """The temperature of the training forward's distribution, one for all rows or one per row:
        the sampling temperature, so the policy-gradient ratio is taken against the distribution
        that sampled the tokens."""
        return self.cfg.rollout.temperature

    def forward_kwargs(self, mb: MicroBatch) -> dict[str, Any]:
        """Extra keyword arguments for the scorer's forward on this micro-batch (e.g. ``gather_ids``)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Algorithm state to checkpoint (e.g. its own RNG); restored by :meth:`load_state_dict`."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
