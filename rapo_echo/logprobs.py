"""Per-token log-probs through the LM head in chunks, so the full-vocabulary logits of a whole batch
are never held at once (with gradients, each chunk is recomputed in the backward pass)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rapo_echo.fused_logprobs import fits_fused, fused_token_logprobs


def _chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    softcap: float | None,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(hidden, weight, bias).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
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
    temperature: float = 1.0,
    softcap: float | None = None,
    chunk_size: int = 512,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (and entropies) of ``targets`` [..., N] given hidden states [..., N, H].

    ``log softmax(h W^T / temperature)[target]`` computed ``chunk_size`` positions at a time; under
    autograd each chunk is checkpointed so only one chunk of logits exists during backward too.
    The entropy is detached unless ``entropy_grad``.
    """
    shape = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1)
    lps, ents = [], []
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    if grad and not softcap and not entropy_grad and fits_fused(t.shape[0], weight.shape[0]):
        # small enough to keep the softmax: one LM-head matmul and a two-matmul backward
        lp, ent = fused_token_logprobs(
            h, weight, t, bias=bias, scale=1.0 / temperature, with_entropy=with_entropy
        )
        return lp.reshape(shape), ent.reshape(shape)
    for start in range(0, t.shape[0], chunk_size):
        args = (
            h[start : start + chunk_size],
            weight,
            bias,
            t[start : start + chunk_size],
            temperature,
            softcap,
            with_entropy,
            entropy_grad,
        )
        lp, ent = checkpoint(_chunk, *args, use_reentrant=False) if grad else _chunk(*args)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps).reshape(shape), torch.cat(ents).reshape(shape)


def _topk_chunk(
    hidden: torch.Tensor, weight: torch.Tensor, k: int, temperature: float
) -> tuple[torch.Tensor, ...]:
    logp = torch.log_softmax(F.linear(hidden, weight).float() / temperature, dim=-1)
    return torch.topk(logp, k, dim=-1)


@torch.no_grad()
def chunked_topk_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, k: int, *, temperature: float = 1.0, chunk_size: int = 512
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely token ids and their log-probs at each position: ([..., k] ids, [..., k] logp)."""
    h = hidden.reshape(-1, hidden.shape[-1])
    vals, ids = [], []
    for start in range(0, h.shape[0], chunk_size):
        v, i = _topk_chunk(h[start : start + chunk_size], weight, k, temperature)
        vals.append(v)
        ids.append(i)
    shape = (*hidden.shape[:-1], k)
    return torch.cat(ids).reshape(shape), torch.cat(vals).reshape(shape)


def _gather_chunk(
    hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, temperature: float
) -> torch.Tensor:
    logp = torch.log_softmax(F.linear(hidden, weight).float() / temperature, dim=-1)
    return logp.gather(-1, ids)


def chunked_gather_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 512,
) -> torch.Tensor:
    """Log-probs at given token ids ``[..., k]`` (differentiable, checkpointed per chunk)."""
    h = hidden.reshape(-1, hidden.shape[-1])
    flat = ids.reshape(-1, ids.shape[-1])
    out = []
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    for start in range(0, h.shape[0], chunk_size):
        args = (h[start : start + chunk_size], weight, flat[start : start + chunk_size], temperature)
        out.append(checkpoint(_gather_chunk, *args, use_reentrant=False) if grad else _gather_chunk(*args))
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
