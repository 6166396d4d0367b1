"""The Algorithm interface: what an algorithm declares, what it hands the Learner, what it gets back.

An algorithm owns its rollout (sample, score, and the rows to train on) and its loss (one micro-batch's
share of it). The run (``training/run.py``) builds what it declares it uses and holds the loop; the
Learner (``training/learner.py``) owns the update every algorithm shares -- the optimizer and its
schedule, reference and old log-probs, micro-batches normalised exactly by their mini-batch's totals,
the update, distribution, checkpoints and resume. Both know an algorithm only through this module:

* :class:`Needs`, returned by :meth:`Algorithm.needs` from the config before anything is built: the
  kinds of training rows with their loss normalisers (:class:`LossKind`), whether a reference is kept,
  whether the policy carries a value head, the per-token fields the rows carry, the served roles it
  calls, and what the config must give (reward plugins, a group size);
* :class:`TrainItem` (one row), :class:`Rollout` (a step's rows, samples and metrics) going to the
  Learner, and :class:`MicroBatch` with :class:`~rapo_echo.policy.TokenScores` (the training forward)
  coming back to :meth:`Algorithm.loss`;
* :class:`RoleRequest`: the requests it sends the served roles each step (:meth:`Algorithm.requests`,
  for ``--dry-run``'s plan).

The hooks, in the order they are called: ``config`` (the algorithm's section, a class attribute) and
:meth:`~Algorithm.defaults` when the config loads, :meth:`~Algorithm.check_plugins` after it;
:meth:`~Algorithm.requests` by ``--dry-run``; :meth:`~Algorithm.needs` before the policy is built;
:meth:`~Algorithm.check_resume` before anything loads on ``--resume``; the constructor;
:meth:`~Algorithm.step_hooks` once after it; :meth:`~Algorithm.rollout` once per step;
:meth:`~Algorithm.loss` once per micro-batch; :meth:`~Algorithm.validate` after checkpoints (with
``validation.data``); :meth:`~Algorithm.state_dict` / :meth:`~Algorithm.load_state_dict` with every
checkpoint. Class attributes ``name``, ``progress_keys``, ``validation_key``, ``validation_dialogues`` and
``dialogue_prompts`` describe it; :meth:`~Algorithm.negative_rules` serves the ``rule_floor`` validation
check. docs/architecture.md has the table.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch

from rapo_echo.policy import pad_left_aligned
from rapo_echo.types import Sample, Scenario, ValidationResult

if TYPE_CHECKING:
    from pydantic import BaseModel

    from rapo_echo.engines.base import ChatEngine
    from rapo_echo.policy import Policy, TokenBatch, TokenScores
    from rapo_echo.rewards import RewardSet
    from rapo_echo.step_hooks import StepHook

    from .run_sections import RunConfig


@dataclass(frozen=True)
class LossKind:
    """A kind of training row with its own loss normaliser: the token and sequence totals of the rows of
    this kind in the mini-batch, summed over the processes, so micro-batch losses add up exactly.

    ``policy_gradient`` rows are the policy's own samples: they get old log-probs (the ratio), reference
    log-probs when the run keeps a reference (the KL term), and are compared with the sampler's
    log-probs (``train/sampler_logprob_gap``). ``temperature`` is the training forward's for these rows
    (None: ``rollout.temperature``, the one that sampled them)."""

    name: str
    policy_gradient: bool = True
    temperature: float | None = None


PG = LossKind("pg")  # an on-policy sample trained with the policy-gradient loss

Totals = dict[LossKind, dict[str, float]]  # kind -> {"tokens": ..., "seqs": ...} over the mini-batch

ROLES = ("simulator", "judge")  # the roles besides the policy, each on the engine its config section names


class RoleRequest(NamedTuple):
    """A kind of request an algorithm sends a served role each step, for ``--dry-run``'s plan: the role
    (one of :data:`ROLES`), what it asks, and how many first tries per step per process (None: unknown)."""

    role: str
    what: str
    per_process: int | None


@dataclass(frozen=True)
class Needs:
    """What an algorithm needs from the run, the Learner and the config, decided from the config alone.

    * ``kinds``: the kinds of rows its items may have; each gets its own totals in :meth:`Algorithm.loss`.
    * ``reference``: keep a reference (LoRA: the adapter off; full fine-tuning: a frozen copy) and fill
      ``ref_logprobs`` of the policy-gradient rows.
    * ``value_head``: the policy carries a value head, built before the optimizer, trained, synced,
      checkpointed; every training forward returns its values (``TokenScores.values``).
    * ``fields``: the per-token values the items carry in :attr:`TrainItem.fields` (a list of floats or a
      tensor ``[tokens, ...]`` per item), padded by the Learner into ``MicroBatch.fields`` ``[rows,
      n_targets, ...]`` (zeros where a row has none); an item with an undeclared field is refused.
    * ``gather``: one of ``fields`` holding token ids ``[tokens, k]``: the training forward also returns the
      log-probs at those ids (``TokenScores.gathered``; logit distillation).
    * ``entropy_grad``: the loss takes a gradient through the entropy (an entropy bonus).
    * ``rewards``: it learns only from the reward plugins, so the config must name one with a weight.
    * ``min_group_size``: the smallest ``rollout.group_size`` it learns from.
    * ``roles``: the served roles it calls itself (:data:`ROLES`); the run builds only these, and those
      its reward plugins and step hooks use: SFT calls none, so an SFT run builds no simulator or judge.
    """

    kinds: tuple[LossKind, ...] = (PG,)
    reference: bool = False
    value_head: bool = False
    fields: tuple[str, ...] = ()
    gather: str | None = None
    entropy_grad: bool = False
    rewards: bool = False
    min_group_size: int = 2
    roles: tuple[str, ...] = ROLES

    def __post_init__(self) -> None:
        names = [k.name for k in self.kinds]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"Needs.kinds: one or more kinds with distinct names, got {names}")
        if self.gather is not None and self.gather not in self.fields:
            raise ValueError(f"Needs.gather: {self.gather!r} is not one of the declared fields {self.fields}")
        if self.min_group_size < 1:
            raise ValueError(f"Needs.min_group_size: at least 1, got {self.min_group_size}")
        if not set(self.roles) <= set(ROLES):
            raise ValueError(f"Needs.roles: each one of {ROLES}, got {self.roles}")


@dataclass
class TrainItem:
    """One sequence the loss trains on.

    Multi-turn items (RLVER) hold a whole dialogue after its first prompt in ``completion_ids``: the
    policy's sampled turns and, between them, the user's turns; ``loss_mask`` is 1 on the policy's
    tokens and 0 on the user's (None: every completion token counts). ``fields`` holds the per-token
    values the algorithm declared in :attr:`Needs.fields` (e.g. PPO's returns, a teacher's top-k)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float = 0.0
    old_logprobs: list[float] | None = None  # filled by the Learner (see Learner.fill_old)
    ref_logprobs: list[float] | None = None
    kind: LossKind = PG
    group: int = 0
    weight: float = 1.0
    sample: int = -1  # index into Rollout.samples (or -1)
    # The log-probs the sampler reported for the completion tokens (None: it reported none). The
    # Learner compares them with its own forward (``train/sampler_logprob_gap``) and uses them as
    # old log-probs only where they match the training forward's numerics.
    sampler_logprobs: list[float] | None = None
    loss_mask: list[int] | None = None
    fields: dict[str, Sequence[float] | torch.Tensor] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def loss_tokens(self) -> int:
        """How many completion tokens carry the loss."""
        return len(self.completion_ids) if self.loss_mask is None else int(sum(self.loss_mask))


@dataclass
class Rollout:
    """What one rollout produced: the samples (for logging), the items to train on, metrics, per-stage
    seconds, the step's records of the algorithm's own judges (``judge_metrics``: each a judge's
    ``step_metrics()``: position bias, texts that addressed it; merged with the reward judges' by
    decision count) and anything else the algorithm keeps for its tests (``extra``)."""

    samples: list[Sample]
    items: list[TrainItem]
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    judge_metrics: list[dict[str, float]] = field(default_factory=list)


@dataclass
class MicroBatch:
    """What the loss sees of one micro-batch: tensors ``[rows, n_targets]`` (``advantages`` and
    ``weights`` ``[rows]``; ``fields`` ``[rows, n_targets, ...]``), the rows' kinds and items."""

    items: list[TrainItem]
    batch: TokenBatch
    mask: torch.Tensor
    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    advantages: torch.Tensor
    weights: torch.Tensor
    kinds: list[LossKind]
    fields: dict[str, torch.Tensor] = field(default_factory=dict)

    def kind_mask(self, kind: LossKind) -> torch.Tensor:
        rows = torch.tensor([k == kind for k in self.kinds], dtype=self.mask.dtype, device=self.mask.device)
        return self.mask * rows[:, None]


@dataclass
class AlgoContext:
    """The engines and rewards an algorithm works with."""

    policy: Policy
    rewards: RewardSet
    simulator: ChatEngine | None = None
    judge: ChatEngine | None = None


def totals_of(items: Sequence[TrainItem], kind: LossKind) -> dict[str, float]:
    """Token and sequence counts of the items of one kind (the normalisers of aggregation)."""
    chosen = [it for it in items if it.kind == kind]
    return {"tokens": float(sum(it.loss_tokens for it in chosen)), "seqs": float(len(chosen))}


def pad_rows(values: Sequence[Sequence[float] | torch.Tensor | None], n_targets: int) -> torch.Tensor:
    """Per-token values of each row left-aligned into ``[rows, n_targets, ...]``, zeros elsewhere (and for a
    row without any): float lists as float32, tensors ``[tokens, ...]`` in their own dtype and shape."""
    like = next((v for v in values if isinstance(v, torch.Tensor)), None)
    if like is None:  # float lists and None only
        rows = [[] if v is None else v for v in values if not isinstance(v, torch.Tensor)]
        return pad_left_aligned(rows, n_targets)
    out = torch.zeros((len(values), n_targets, *like.shape[1:]), dtype=like.dtype)
    for row, v in enumerate(values):
        if v is not None and len(v):
            out[row, : len(v)] = torch.as_tensor(v, dtype=like.dtype)
    return out


class Algorithm(abc.ABC):
    """An algorithm: its rollout and its loss, and what it declares (see the module doc)."""

    name: ClassVar[str] = "base"
    # Its own config section, at the top-level key ``name`` (None: it has none); a saved config holds it
    # and the shared sections only.
    config: ClassVar[type[BaseModel] | None] = None
    progress_keys: ClassVar[tuple[str, ...]] = ("reward/mean", "loss/total")  # shown on the progress bar
    # The score held-out validation ranks checkpoints by (higher is better; see training/validation);
    # None: this algorithm has no single-reply score to validate with.
    validation_key: ClassVar[str | None] = None
    # whether :meth:`validate` can play held-out contexts on as dialogues (``validation.turns`` > 1)
    validation_dialogues: ClassVar[bool] = False
    # whether the policy's prompts grow during a rollout (multi-turn dialogues): its decode shape is then
    # sized for ``rollout.max_prompt_tokens`` rather than the longest scenario prompt
    dialogue_prompts: ClassVar[bool] = False

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """A config overlay applied under the user's file, flags and ``--set`` (its own section's defaults
        are its ``config`` class's)."""
        return {}

    @classmethod
    def needs(cls, cfg: RunConfig) -> Needs:
        """What this run of the algorithm needs from the Learner and the config (see :class:`Needs`)."""
        return Needs()

    @classmethod
    def check_plugins(cls, cfg: RunConfig, at: Callable[[str], str]) -> None:
        """Import the plugins its own section names and check each is one (a ``ConfigError`` whose text
        starts with ``at(key)``: the key with its ``file:line: ``), before any model loads."""
        return None

    @classmethod
    def requests(cls, cfg: RunConfig) -> list[RoleRequest] | None:
        """The requests it sends the simulator and the judge each step (its rewards' are the plan's own),
        for ``--dry-run``; ``[]``: none; None (the default): not declared, and the plan says so."""
        return None

    @classmethod
    def check_resume(cls, cfg: RunConfig, checkpoint: Path) -> None:
        """Refuse (a ``ConfigError`` naming the setting) a checkpoint this configuration cannot continue,
        before anything loads; the Learner itself refuses a value head that comes or goes."""
        return None

    def __init__(self, cfg: RunConfig, ctx: AlgoContext) -> None:
        self.cfg = cfg
        self.ctx = ctx

    @abc.abstractmethod
    def rollout(self, scenarios: list[Scenario], step: int) -> Rollout:
        """Sample and score this step's ``scenarios``; the items to train on, with metrics and timings."""

    @abc.abstractmethod
    def loss(
        self, mb: MicroBatch, out: TokenScores, totals: Totals
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's share of the mini-batch loss (normalised by ``totals``, so the shares add up
        exactly whatever the micro-batch size) and additive metric contributions."""

    def validate(self, scenarios: list[Scenario], max_new_tokens: int, turns: int = 1) -> ValidationResult:
        """Validation metrics of the policy's greedy replies to held-out ``scenarios`` (``val/...``),
        including :attr:`validation_key`, and that key's score per scenario; ``turns`` > 1 (only where
        :attr:`validation_dialogues`): each scenario is played on for that many replies."""
        raise NotImplementedError(f"{self.name} has no validation score")

    def step_hooks(self) -> list[StepHook]:
        """Step hooks it runs around each step (:mod:`rapo_echo.step_hooks`), after the config's and
        before the reward-hacking monitor; asked once, after the constructor."""
        return []

    def negative_rules(self) -> list[str] | None:
        """The negative rules of the simulated person this algorithm trains against, where they are known
        (the ``rule_floor`` validation check names some of them); None: unknown."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Algorithm state to checkpoint (e.g. its own RNG); restored by :meth:`load_state_dict`."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
