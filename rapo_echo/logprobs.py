"""Per-token log-probs through the LM head in chunks, so the full-vocabulary logits of a whole batch
are never held at once (with gradients, each chunk is recomputed in the backward pass).

Every path applies the model's own logit processing (:class:`LogitTransform`): the head's bias,
Granite's ``logits_scaling``, Cohere's ``logit_scale`` and the final soft-capping of Gemma-2/3, in
the order the models apply them. :func:`check_logit_transform` refuses a model whose logits the
transform does not reproduce (some other model-specific step), with a message that says so."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rapo_echo.errors import ModelResolutionError
from rapo_echo.fused_logprobs import fits_fused, fused_token_logprobs


@dataclass(frozen=True)
class LogitTransform:
    """What a causal LM does between its head's matmul and the softmax: ``z = (h W^T + bias) *
    scale``, then ``z = softcap * tanh(z / softcap)`` when ``softcap`` is set."""

    scale: float = 1.0
    softcap: float | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def logit_transform(config: Any) -> LogitTransform:
    """The :class:`LogitTransform` a model's config asks for: Granite divides the logits by
    ``logits_scaling``, Cohere multiplies them by ``logit_scale``, Gemma-2/3 soft-cap them at
    ``final_logit_softcapping`` (the head's bias, if any, is applied with the matmul)."""
    scale = 1.0
    if getattr(config, "logits_scaling", None):
        scale /= float(config.logits_scaling)
    if getattr(config, "logit_scale", None) is not None:
        scale *= float(config.logit_scale)
    softcap = getattr(config, "final_logit_softcapping", None)
    return LogitTransform(scale, float(softcap) if softcap else None)


class UnsupportedLogitsError(ModelResolutionError):
    """The model's own logits differ from what the chunked scorer computes from its hidden states."""


@torch.no_grad()
def check_logit_transform(lm: Any, transform: LogitTransform, probe_ids: list[int]) -> float:
    """Compare the model's own forward logits on ``probe_ids`` with the head applied to its decoder's
    hidden states through ``transform``; raise :class:`UnsupportedLogitsError` when they differ
    (beyond the precision of the weights' dtype). Returns the largest difference."""
    ids = torch.tensor([probe_ids], dtype=torch.long, device=next(lm.parameters()).device)
    own = lm(input_ids=ids, use_cache=False).logits.float()
    hidden = lm.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
    head = lm.get_output_embeddings()
    ours = transform(F.linear(hidden, head.weight, getattr(head, "bias", None)).float())
    diff = float((own - ours).abs().max())
    exact = head.weight.dtype in (torch.float32, torch.float64)
    tol = (1e-4 if exact else 2e-2) * max(1.0, float(own.abs().max()))
    if not diff <= tol:
        kind = getattr(lm.config, "model_type", type(lm).__name__)
        raise UnsupportedLogitsError(
            f"model type {kind!r}: its forward transforms the logits in a way rapo-echo's scorer does not "
            f"reproduce (max |difference| {diff:.4g} on a probe); supported are a head bias, Granite's "
            "logits_scaling, Cohere's logit_scale and final_logit_softcapping (Gemma-2/3). Training such "
            "a model would compute wrong log-probs; please report the model so its transform can be added."
        )
    return diff


def _logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    transform: LogitTransform | None,
    temperature: float | torch.Tensor,
) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias).float()
    if transform is not None:
        logits = transform(logits)
    if isinstance(temperature, torch.Tensor) or temperature != 1.0:
        logits = logits / temperature  # a tensor holds one temperature per position: [N, 1]
    return logits


Temperature = float | torch.Tensor  # one for all positions, or one per row of the batch ([B])


def _per_position(temperature: Temperature, shape: torch.Size) -> Temperature:
    """A per-row temperature tensor ``[B]`` spread over positions ``[B * n, 1]`` (floats unchanged)."""
    if not isinstance(temperature, torch.Tensor):
        return temperature
    rows = temperature.reshape(-1, *([1] * (len(shape) - 1))).float()
    return rows.expand(shape).reshape(-1, 1)


def _over_chunks(
    fn: Callable[..., Any],
    grad: bool,
    size: int,
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    rows: torch.Tensor,
    temperature: Temperature,
    *rest: Any,
) -> list[Any]:
    """``fn(h, weight, bias, rows, temperature, *rest)`` over ``size`` rows at a time, each chunk
    checkpointed when ``grad``; the chunks' results in order."""
    out = []
    for start in range(0, h.shape[0], size):
        temp = temperature[start : start + size] if isinstance(temperature, torch.Tensor) else temperature
        args = (h[start : start + size], weight, bias, rows[start : start + size], temp, *rest)
        out.append(checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args))
    return out


def _chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: Temperature,
    transform: LogitTransform | None,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = _logits(hidden, weight, bias, transform, temperature)
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    return logp, entropy if entropy_grad else entropy.detach()


def chunked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: Temperature = 1.0,
    transform: LogitTransform | None = None,
    chunk_size: int = 512,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (and entropies) of ``targets`` [..., N] given hidden states [..., N, H].

    ``log softmax(transform(h W^T + bias) / temperature)[target]`` computed ``chunk_size`` positions
    at a time; under autograd each chunk is checkpointed so only one chunk of logits exists during
    backward too. ``temperature`` is a float or one per row (``[B]`` for targets ``[B, n]``). The
    entropy is detached unless ``entropy_grad``.
    """
    shape = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1)
    temperature = _per_position(temperature, shape)
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    softcap = transform is not None and transform.softcap
    if grad and not softcap and not entropy_grad and fits_fused(t.shape[0], weight.shape[0]):
        # small enough to keep the softmax: one LM-head matmul and a two-matmul backward
        scale = (transform.scale if transform is not None else 1.0) / temperature
        lp, ent = fused_token_logprobs(h, weight, t, bias=bias, scale=scale, with_entropy=with_entropy)
        return lp.reshape(shape), ent.reshape(shape)
    parts = _over_chunks(
        _chunk, grad, chunk_size, h, weight, bias, t, temperature, transform, with_entropy, entropy_grad
    )
    lps, ents = zip(*parts)
    return torch.cat(lps).reshape(shape), torch.cat(ents).reshape(shape)


def _topk_chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    k: int,
    temperature: float,
    transform: LogitTransform | None,
) -> tuple[torch.Tensor, ...]:
    logp = torch.log_softmax(_logits(hidden, weight, bias, transform, temperature), dim=-1)
    return torch.topk(logp, k, dim=-1)


@torch.no_grad()
def chunked_topk_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    transform: LogitTransform | None = None,
    chunk_size: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely token ids and their log-probs at each position: ([..., k] ids, [..., k] logp)."""
    h = hidden.reshape(-1, hidden.shape[-1])
    vals, ids = [], []
    for start in range(0, h.shape[0], chunk_size):
        v, i = _topk_chunk(h[start : start + chunk_size], weight, bias, k, temperature, transform)
        vals.append(v)
        ids.append(i)
    shape = (*hidden.shape[:-1], k)
    return torch.cat(ids).reshape(shape), torch.cat(vals).reshape(shape)


def _gather_chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    ids: torch.Tensor,
    temperature: Temperature,
    transform: LogitTransform | None,
) -> torch.Tensor:
    logp = torch.log_softmax(_logits(hidden, weight, bias, transform, temperature), dim=-1)
    return logp.gather(-1, ids)


def chunked_gather_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: Temperature = 1.0,
    transform: LogitTransform | None = None,
    chunk_size: int = 512,
) -> torch.Tensor:
    """Log-probs at given token ids ``[..., k]`` (differentiable, checkpointed per chunk);
    ``temperature`` as in :func:`chunked_token_logprobs`."""
    h = hidden.reshape(-1, hidden.shape[-1])
    flat = ids.reshape(-1, ids.shape[-1])
    temperature = _per_position(temperature, ids.shape[:-1])
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    out = _over_chunks(_gather_chunk, grad, chunk_size, h, weight, bias, flat, temperature, transform)
    return torch.cat(out).reshape(ids.shape)


def with_tail(logp: torch.Tensor) -> torch.Tensor:
    """Append the log of the probability mass outside the given ids: [..., k] -> [..., k + 1]."""
    rest = torch.log1p(-logp.exp().sum(-1).clamp(max=1.0 - 1e-6))
    return torch.cat([logp, rest.unsqueeze(-1)], dim=-1)


def generalized_jsd(teacher_logp: torch.Tensor, student_logp: torch.Tensor, alpha: float) -> torch.Tensor:
    """Divergence between teacher T and student S over the last dim (log-probs of a full distribution).

    ``alpha = 0``: forward KL(T || S); ``alpha = 1``: reverse KL(S || T); otherwise
    ``alpha * KL(T || M) + (1 - alpha) * KL(S || M)`` with ``M = alpha * T + (1 - alpha) * S``
    (``alpha = 0.5`` is the Jensen-Shannon divergence)."""
    t, s = teacher_logp, student_logp
    if alpha == 0.0:
        return (t.exp() * (t - s)).sum(-1)
    if alpha == 1.0:
        return (s.exp() * (s - t)).sum(-1)
    import math

    m = torch.logsumexp(torch.stack([t + math.log(alpha), s + math.log(1 - alpha)]), dim=0)
    return alpha * (t.exp() * (t - m)).sum(-1) + (1 - alpha) * (s.exp() * (s - m)).sum(-1)
