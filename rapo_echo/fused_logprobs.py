"""Token log-probs through the LM head with a hand-written backward that keeps the softmax.

``logp = log softmax(s * (h W^T + b))[target]`` (``s`` folds a logit scale and the temperature) and,
detached, the entropy. Autograd on the plain formula needs the LM-head matmul once forward, its
logsumexp's softmax again in backward, and -- under the per-chunk checkpointing that keeps large
batches in memory -- the matmul and the softmax a second time. Here the forward computes the logits
once, keeps ``p = softmax`` (rows x vocab floats), and the backward is two matmuls:

    d logp_i / d z_i = s * (onehot(target_i) - p_i)          (z = h W^T + b)
    grad_h = (g * dlogp/dz) W,   grad_W = (g * dlogp/dz)^T h,   grad_b = sum_i g_i * dlogp_i/dz_i

For up to :data:`FUSED_MAX_BYTES` of kept softmax (e.g. 8 sequences x 48 tokens x a 49k vocabulary
is 75 MB); larger batches keep the chunked, checkpointed path of :mod:`rapo_echo.logprobs`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FUSED_MAX_BYTES = 256 * 2**20


def fits_fused(rows: int, vocab: int) -> bool:
    """Whether the softmax of ``rows`` positions over ``vocab`` tokens fits the kept-softmax budget."""
    return rows * vocab * 4 <= FUSED_MAX_BYTES


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, scale, with_entropy):
        logits = F.linear(hidden, weight, bias).float()
        if isinstance(scale, torch.Tensor) or scale != 1.0:
            logits.mul_(scale)
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        logits.sub_(lse)  # now log-probs of every token
        logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        probs = logits.exp()
        if with_entropy:
            entropy = -(probs * logits).sum(-1)
        else:
            entropy = torch.zeros_like(logp)
        del logits
        ctx.save_for_backward(hidden, weight, probs, targets)
        ctx.scale, ctx.has_bias = scale, bias is not None
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, probs, targets = ctx.saved_tensors
        # d logp / d z = scale * (onehot - p), times the incoming gradient; built in place in probs
        grad_z = probs.mul_(-grad_logp.unsqueeze(-1))
        grad_z.scatter_add_(-1, targets.unsqueeze(-1), grad_logp.unsqueeze(-1))
        if isinstance(ctx.scale, torch.Tensor) or ctx.scale != 1.0:
            grad_z.mul_(ctx.scale)
        grad_z = grad_z.to(weight.dtype)
        grad_h = grad_z @ weight if ctx.needs_input_grad[0] else None
        grad_w = grad_z.t() @ hidden.to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_b = grad_z.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_h, grad_w, grad_b, None, None, None


def fused_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    scale: float | torch.Tensor = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [N] of ``targets`` [N] from hidden states [N, H] (``scale`` multiplies the logits,
    e.g. ``1 / temperature``: a float, or one per position as ``[N, 1]``) and their detached entropies
    (zeros unless ``with_entropy``)."""
    return _TokenLogprobs.apply(hidden, weight, bias, targets, scale, with_entropy)
