"""Supervised fine-tuning (``--algo sft``; docs/algorithms/sft.md): a warm start on dialogue data before RL.

Nothing is sampled. Each step's scenarios become rows whose prompt is the policy's prompt for the
scenario (the system prompt and the visible dialogue, as every algorithm builds it) and whose completion
is the scenario's reference reply -- the assistant turn a ``messages`` row ends with, or its
``reference`` -- tokenised as the policy would write it: the reply's text and the chat template's
end-of-turn marker, so the model also learns where a reply stops. A row longer than ``sft.max_length``
tokens (TRL's ``SFTConfig.max_length``: prompt and reply together; the memory plan sizes rows by it) has its
reply cut to fit: ``sft/cut`` counts them, and the first step that cuts one says so. The sampling key
``rollout.max_new_tokens`` does not touch SFT's targets. The loss is the negative log-likelihood of the
reply tokens, a mean over every reply token of the mini-batch: prompt tokens (earlier turns, assistant
ones included) carry no loss. No reference model, no KL, no rewards; LoRA or full fine-tuning as
``model.lora`` says.

A scenario without a reference reply is a :class:`~rapo_echo.errors.DataError` naming its file and id,
raised when the algorithm is built, before the first step trains.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field

from rapo_echo.chat_template import ChatMarkers
from rapo_echo.config import Strict
from rapo_echo.data import scenarios_from_config
from rapo_echo.errors import DataError
from rapo_echo.text import is_blank
from rapo_echo.types import Sample, Scenario

from .base import AlgoContext, Algorithm, LossKind, MicroBatch, Needs, RoleRequest, Rollout, Totals, TrainItem

if TYPE_CHECKING:
    from rapo_echo.policy import TokenScores

    from .run_sections import RunConfig

    class SftRunConfig(RunConfig):
        """The run config :func:`.run_config.run_config_class` builds for SFT (the type checker's view)."""

        sft: SftConfig


log = logging.getLogger(__name__)


class SftConfig(Strict):
    """SFT's own switches (the ``sft`` section of a run config)."""

    end_of_turn: bool = Field(
        True,
        description="Train the chat template's end-of-turn marker after each reply (the model learns to "
        "stop); false: the reply's text only.",
    )
    coef: float = Field(1.0, gt=0.0, description="Scale of the negative log-likelihood.")
    max_length: int = Field(
        1024,
        ge=2,
        description="The longest row in tokens, prompt and reply together (TRL's SFTConfig.max_length); a "
        "longer row's reply is cut to fit (counted in sft/cut, and said). The prompt is cut first, to "
        "rollout.max_prompt_tokens, as every algorithm's; rollout.max_new_tokens is not read.",
    )


# A reference reply learnt under its context: its own normaliser (the mini-batch's reply tokens), scored
# at temperature 1 (the model's own distribution), not a policy-gradient row (no ratio, no KL).
REPLY = LossKind("reply", policy_gradient=False, temperature=1.0)


def check_references(scenarios: list[Scenario]) -> None:
    """A :class:`DataError` naming the first scenario (file, id) without a reference reply."""
    for s in scenarios:
        if s.reference is None or is_blank(s.reference):
            where = s.meta.get("where") or s.meta.get("file") or "data.path"
            raise DataError(
                f"{where}: scenario {s.id!r} has no reference reply; --algo sft learns the reply a row "
                "ends with: a `messages` row whose last turn is the assistant's, or a `reference` field"
            )


def sft_nll(mask: torch.Tensor, logp: torch.Tensor, tokens: float) -> torch.Tensor:
    """The micro-batch's share of the token-mean negative log-likelihood: ``-sum(mask * logp) / tokens``,
    ``tokens`` the mini-batch's count of reply tokens (so micro-batch shares add up to the mean)."""
    return -(logp * mask).sum() / max(tokens, 1.0)


class SFT(Algorithm):
    """Supervised fine-tuning on the scenarios' reference replies (see the module doc)."""

    name = "sft"
    config = SftConfig
    cfg: SftRunConfig
    progress_keys = ("loss/nll",)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        # one row per scenario: the plan and the batch sizes count rows as rollout.batch_size x group_size
        return {"rollout": {"group_size": 1}}

    @classmethod
    def needs(cls, cfg: RunConfig) -> Needs:
        # Its own rows only; no reference model, no rewards, no group, no simulator or judge.
        return Needs(kinds=(REPLY,), min_group_size=1, roles=())

    @classmethod
    def requests(cls, cfg: RunConfig) -> list[RoleRequest]:
        return []  # it samples nothing and asks no one

    def __init__(self, cfg: RunConfig, ctx: AlgoContext) -> None:
        super().__init__(cfg, ctx)
        check_references(scenarios_from_config(cfg.data))
        markers = ChatMarkers.from_tokenizer(ctx.policy.tokenizer)
        self.end_text = markers.suffix.rstrip() if self.cfg.sft.end_of_turn else ""
        self.warned_cut = False

    def reply_ids(self, reply: str, prompt_tokens: int = 0) -> tuple[list[int], bool]:
        """Token ids of a reply as the policy writes it after its prompt (the text and the end-of-turn
        marker), cut so that the row fits ``sft.max_length`` after ``prompt_tokens`` (one token at least,
        where the prompt alone fills it); and whether it was cut."""
        ids = self.ctx.policy.tokenizer(reply + self.end_text, add_special_tokens=False)["input_ids"]
        limit = max(1, self.cfg.sft.max_length - prompt_tokens)
        return list(ids[:limit]), len(ids) > limit

    def rollout(self, scenarios: list[Scenario], step: int) -> Rollout:
        check_references(scenarios)
        samples, items, cut = [], [], 0
        for i, s in enumerate(scenarios):
            prompt = self.ctx.policy.prompt_ids(s)
            reply, was_cut = self.reply_ids(str(s.reference), len(prompt))
            cut += was_cut
            samples.append(
                Sample(s, i, prompt, reply, None, str(s.reference), "length" if was_cut else "stop")
            )
            items.append(TrainItem(prompt, reply, kind=REPLY, group=i, sample=i))
        if cut and not self.warned_cut:
            self.warned_cut = True
            log.warning(
                "sft: %d of %d reference replies of step %d were cut to fit sft.max_length=%d (prompt + "
                "reply tokens); raise it to learn their ends (sft/cut counts them each step)",
                cut,
                len(items),
                step,
                self.cfg.sft.max_length,
            )
        tokens = [len(it.completion_ids) for it in items]
        metrics = {
            "sft/rows": float(len(items)),
            "sft/cut": float(cut),
            "sft/reply_tokens": sum(tokens) / max(len(tokens), 1),
        }
        return Rollout(samples, items, metrics, {"generate": 0.0})

    def loss(
        self, mb: MicroBatch, out: TokenScores, totals: Totals
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        nll = sft_nll(mb.kind_mask(REPLY), out.logp, totals[REPLY]["tokens"])
        return self.cfg.sft.coef * nll, {"loss/nll": nll.detach()}
