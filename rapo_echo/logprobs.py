"""Per-token log-probs through the LM head in chunks, so the full-vocabulary logits of a whole batch
are never held at once (with gradients, each chunk is recomputed in the backward pass)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


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
