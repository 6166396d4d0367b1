"""Scoring for the loss: the shared-prompt layout equals the full-sequence layout and the engine's
teacher-forced scores, in values and in gradients; chunked LM-head maths against direct formulas."""

from __future__ import annotations

import math

import pytest
import torch

from rapo_echo.engines.hf import HFEngine
from rapo_echo.logprobs import chunked_gather_logprobs, chunked_token_logprobs, generalized_jsd, with_tail
from rapo_echo.policy import TokenScorer, collate, pad_left_aligned
from tests.conftest import make_tiny_model

PROMPTS = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10], [9, 10], [11, 12, 13]]
COMPLETIONS = [[20, 21, 22], [23], [24, 25], [26, 27, 28, 29], [30, 31]]


@pytest.fixture
def model(smol_tokenizer):
    return make_tiny_model(smol_tokenizer, layers=2)


def test_layouts_agree_with_engine_scores(model, smol_tokenizer) -> None:
    scorer = TokenScorer(model, chunk_size=3)
    shared = collate(PROMPTS, COMPLETIONS, pad_id=2, shared=True)
    full = collate(PROMPTS, COMPLETIONS, pad_id=2, shared=False)
    assert shared.inputs["prompt_ids"].shape[0] == 3  # 5 rows, 3 distinct prompts
    with torch.no_grad():
        a = shared.rows(scorer(shared.inputs)[0])
        b = full.rows(scorer(full.inputs)[0])
    c = HFEngine(model, smol_tokenizer).score_ids(PROMPTS, COMPLETIONS)
    for x, y, z, comp in zip(a, b, c, COMPLETIONS):
        assert len(x) == len(comp)
        assert x == pytest.approx(y, abs=1e-5) and x == pytest.approx(z, abs=1e-5)


def test_layouts_give_the_same_gradients(smol_tokenizer) -> None:
    grads = []
    for shared in (True, False):
        m = make_tiny_model(smol_tokenizer, seed=3).train()
        batch = collate(PROMPTS, COMPLETIONS, pad_id=2, shared=shared)
        logp = TokenScorer(m)(batch.inputs).logp
        (logp * batch.target_mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_left_alignment_and_padding() -> None:
    batch = collate([[1], [2]], [[3, 4, 5], [6]], pad_id=0)
    assert batch.target_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.inputs["targets"].tolist() == [[3, 4, 5], [6, 0, 0]]
    assert pad_left_aligned([[0.5], [1.0, 2.0]], 3).tolist() == [[0.5, 0, 0], [1.0, 2.0, 0]]
    with pytest.raises(ValueError, match="completion"):
        collate([[1]], [[]], pad_id=0)


def test_chunked_logprobs_entropy_and_gather_by_hand() -> None:
    torch.manual_seed(0)
    h = torch.randn(7, 4, requires_grad=True)
    w = torch.randn(6, 4, requires_grad=True)
    t = torch.tensor([0, 5, 2, 3, 1, 4, 0])
    lp, ent = chunked_token_logprobs(h, w, t, temperature=0.5, chunk_size=3, with_entropy=True)
    ref = torch.log_softmax(h @ w.T / 0.5, dim=-1)
    assert torch.allclose(lp, ref.gather(1, t[:, None]).squeeze(1), atol=1e-6)
    assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=1e-5)
    lp.sum().backward()
    g_chunked = w.grad.clone()
    w.grad = None
    ref.gather(1, t[:, None]).sum().backward()
    assert torch.allclose(g_chunked, w.grad, atol=1e-5)
    ids = torch.tensor([[0, 1]] * 7)
    got = chunked_gather_logprobs(h.detach(), w.detach(), ids, temperature=0.5, chunk_size=2)
    assert torch.allclose(got, ref.detach()[:, :2], atol=1e-6)


def test_tail_and_generalized_jsd_by_hand() -> None:
    # top-2 probs 0.5, 0.25 -> tail 0.25
    tail = with_tail(torch.log(torch.tensor([0.5, 0.25])))
    assert tail.exp().tolist() == pytest.approx([0.5, 0.25, 0.25])
    t = torch.log(torch.tensor([0.5, 0.5]))
    s = torch.log(torch.tensor([0.25, 0.75]))
    # forward KL(T||S) = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 (0.693147 - 0.405465) = 0.143841
    assert generalized_jsd(t, s, 0.0).item() == pytest.approx(0.143841, abs=1e-5)
    # reverse KL(S||T) = 0.25 ln(0.5) + 0.75 ln(1.5) = -0.173287 + 0.304099 = 0.130812
    assert generalized_jsd(t, s, 1.0).item() == pytest.approx(0.130812, abs=1e-5)
    # JSD: M = [0.375, 0.625]; KL(T||M) = 0.5 ln(0.5/0.375) + 0.5 ln(0.5/0.625) = 0.5(0.287682 - 0.223144)
    #      = 0.032269 ; KL(S||M) = 0.25 ln(0.25/0.375) + 0.75 ln(0.75/0.625) = -0.101366 + 0.136741 = 0.035375
    # JSD = 0.5 * 0.032269 + 0.5 * 0.035375 = 0.033822
    assert generalized_jsd(t, s, 0.5).item() == pytest.approx(0.033822, abs=1e-5)
    assert generalized_jsd(t, t, 0.5).item() == pytest.approx(0.0, abs=1e-7)
    assert math.isfinite(generalized_jsd(t, s, 0.3).item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_lm_head_backward_equals_autograd(dtype) -> None:
    """The kept-softmax backward (rapo_echo.fused_logprobs) gives autograd's gradients of
    log softmax((h W^T + b) / T)[target] for h, W and b, and the same values and entropies."""
    from rapo_echo.fused_logprobs import fused_token_logprobs

    torch.manual_seed(0)
    h = torch.randn(9, 5, dtype=dtype, requires_grad=True)
    w = torch.randn(11, 5, dtype=dtype, requires_grad=True)
    b = torch.randn(11, dtype=dtype, requires_grad=True)
    t = torch.tensor([0, 10, 2, 3, 1, 4, 0, 7, 7])
    g = torch.randn(9)  # an arbitrary upstream gradient, zero on one "padding" row
    g[4] = 0.0
    lp, ent = fused_token_logprobs(h, w, t, bias=b, scale=1 / 0.7, with_entropy=True)
    (lp * g).sum().backward()
    fused = [x.grad.clone() for x in (h, w, b)]
    for x in (h, w, b):
        x.grad = None
    ref = torch.log_softmax(torch.nn.functional.linear(h, w, b).float() / 0.7, dim=-1)
    (ref.gather(1, t[:, None]).squeeze(1) * g).sum().backward()
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert torch.allclose(lp, ref.gather(1, t[:, None]).squeeze(1), atol=tol)
    assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=tol) and not ent.requires_grad
    for got, x in zip(fused, (h, w, b)):
        assert got.dtype == dtype
        assert torch.allclose(got.float(), x.grad.float(), atol=tol, rtol=tol)


def test_chunked_path_takes_the_fused_backward_only_when_it_fits(monkeypatch) -> None:
    import rapo_echo.fused_logprobs as fused
    import rapo_echo.logprobs as logprobs

    calls = []
    real = logprobs.fused_token_logprobs
    monkeypatch.setattr(logprobs, "fused_token_logprobs", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    h = torch.randn(6, 4, requires_grad=True)
    w = torch.randn(8, 4, requires_grad=True)
    t = torch.tensor([1, 2, 3, 4, 5, 6])
    grads = []
    for budget in (fused.FUSED_MAX_BYTES, 6 * 8 * 4 - 1):  # fits; one byte short: chunked path
        monkeypatch.setattr(fused, "FUSED_MAX_BYTES", budget)
        lp, _ = chunked_token_logprobs(h, w, t, temperature=2.0, chunk_size=4)
        lp.sum().backward()
        grads.append(w.grad.clone())
        w.grad = None
    assert calls == [1]  # the first budget only
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_fused_path_applies_the_logit_scale_and_per_row_temperatures(monkeypatch) -> None:
    """The kept-softmax path and the chunked path agree on values and gradients when the model scales its
    logits (Cohere / Granite) and every row has its own temperature (RAPO's PG rows at the rollout
    temperature, SD rows at 1); a soft-capped model always takes the chunked path."""
    import rapo_echo.fused_logprobs as fused
    from rapo_echo.logprobs import LogitTransform

    torch.manual_seed(0)
    h = torch.randn(2, 3, 4, requires_grad=True)
    w = torch.randn(8, 4, requires_grad=True)
    t = torch.tensor([[1, 2, 3], [4, 5, 6]])
    temps = torch.tensor([0.7, 1.0])
    transform = LogitTransform(scale=0.5)
    out = []
    for budget in (fused.FUSED_MAX_BYTES, 0):  # fused; chunked
        monkeypatch.setattr(fused, "FUSED_MAX_BYTES", budget)
        lp, _ = chunked_token_logprobs(h, w, t, temperature=temps, transform=transform, chunk_size=4)
        (lp * torch.arange(6.0).reshape(2, 3)).sum().backward()
        out.append((lp.detach(), h.grad.clone(), w.grad.clone()))
        h.grad = w.grad = None
    # by hand for one position: log softmax(0.5 * h W^T / 0.7)[target]
    ref = torch.log_softmax(0.5 * (h[0, 1] @ w.T) / 0.7, dim=-1)[2]
    assert out[0][0][0, 1].item() == pytest.approx(ref.item(), abs=1e-5)
    for a, b in zip(out[0], out[1]):
        assert torch.allclose(a, b, atol=1e-5)
    calls = []
    monkeypatch.setattr(fused, "FUSED_MAX_BYTES", 2**30)
    monkeypatch.setattr(
        "rapo_echo.logprobs.fused_token_logprobs",
        lambda *a, **k: calls.append(1) or fused.fused_token_logprobs(*a, **k),
    )
    chunked_token_logprobs(h, w, t, transform=LogitTransform(softcap=30.0))[0].sum().backward()
    assert calls == []
