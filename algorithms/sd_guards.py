"""Guards of RAPO's self-distillation against the collapse peers report in long runs
(docs/algorithms/rapo.md, "Guards"; each is a ``rapo.sd`` switch, off by default unless the study set it):

* ``only_failed`` (SRPO, arXiv 2604.02288: only failed samples go to self-distillation): only replies
  the person felt no better after (emotion change <= 0) are rewritten or distilled;
* ``ref_kl`` (SDPG, arXiv 2606.04036: a reference-policy KL beside the distillation): ``ref_kl`` times
  a KL estimate to the reference (``loss.kl_estimator``) on the distilled tokens joins the SD loss;
* ``max_ref_logratio``: a distilled token whose log-prob is already more than this away from the
  reference's (either way) gives no SD gradient: a trust region around the reference that caps how far
  the distilled distribution moves (SDPO clips its importance ratio at 2, OPSD clips point-wise);
* ``min_beat`` (decay): the SD coefficient is scaled by ``min(1, ema / min_beat)``, ``ema`` the moving
  average (``beat_ema``) of the share of rewrites that beat their original when re-ranked, so
  self-distillation fades, and switches off at 0, when the rewrites stop beating their originals
  (ILF / Critique-GRPO keep only refinements that help; this keeps measuring and comes back on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .registries import KL_ESTIMATORS

# The reference's log-probs (temperature 1, as the SD rows) at each token of a distilled reply.
SD_REF_LOGP = "sd_ref_logp"


def failed(emotion_delta: float | None) -> bool:
    """A reply the person felt no better after (``only_failed``); an unknown change is not a failure."""
    return emotion_delta is not None and emotion_delta <= 0


def needs_reference(sd: Any) -> bool:
    """Whether the guards need the reference's log-probs on the distilled tokens."""
    return sd.ref_kl > 0 or sd.max_ref_logratio is not None


@dataclass
class BeatTracker:
    """The moving average of the share of rewrites that beat their original (``min_beat``)."""

    rate: float
    ema: float | None = None

    def update(self, share: float | None) -> None:
        """Fold in one step's share (None: no rewrite was re-ranked this step, the average stays)."""
        if share is None:
            return
        self.ema = share if self.ema is None else self.rate * self.ema + (1 - self.rate) * share

    def factor(self, min_beat: float | None) -> float:
        """The SD coefficient's multiplier: ``min(1, ema / min_beat)`` (1 without ``min_beat`` or before
        the first measurement)."""
        if min_beat is None or self.ema is None:
            return 1.0
        return min(1.0, self.ema / min_beat)


def guard_tokens(
    per: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    mask: torch.Tensor,
    sd: Any,
    kl_estimator: str,
    total_tokens: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The per-token SD loss ``per`` with the reference guards applied on the ``mask``-ed SD tokens:
    tokens outside the trust region (``|log p - log p_ref| > max_ref_logratio``) give no gradient, and
    ``ref_kl`` x the KL estimate to the reference is added. Returns it and the share of SD tokens capped
    (``sd/capped``) and the mean KL estimate on them (``sd/ref_kl``), both over the mini-batch's
    ``total_tokens`` SD tokens (so micro-batches add up)."""
    if ref_logp is None or not needs_reference(sd):
        return per, {}
    m = mask.to(per.dtype)
    tokens = max(float(total_tokens), 1.0)
    metrics: dict[str, torch.Tensor] = {}
    if sd.max_ref_logratio is not None:
        outside = (logp.detach() - ref_logp).abs() > sd.max_ref_logratio
        per = torch.where(outside, per.detach() * 0, per)
        metrics["sd/capped"] = (outside.to(per.dtype) * m).sum() / tokens
    kl = KL_ESTIMATORS.get(kl_estimator, "loss.kl_estimator")(logp, ref_logp, mask=mask)
    metrics["sd/ref_kl"] = (kl.detach() * m).sum() / tokens
    if sd.ref_kl > 0:
        per = per + sd.ref_kl * kl
    return per, metrics
