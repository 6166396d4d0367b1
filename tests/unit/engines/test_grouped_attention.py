"""Grouped one-token attention: equal to transformers' sdpa on the same padded decode step, and installed
only where it applies."""

from __future__ import annotations

import copy

import pytest
import torch

from rapo_echo.engines.grouped_attention import NAME, grouped_sdpa, use_grouped_attention
from tests.conftest import make_tiny_model


@pytest.fixture
def tiny_pair(smol_tokenizer):
    """The same tiny GQA Llama (4 query heads, 2 key/value heads) twice: on sdpa, and switched."""
    base = make_tiny_model(smol_tokenizer)
    base.set_attn_implementation("sdpa")
    grouped = copy.deepcopy(base)
    assert use_grouped_attention(grouped)
    assert grouped.config._attn_implementation == NAME and base.config._attn_implementation == "sdpa"
    return base, grouped


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(5, 500, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding of different widths
    mask[1, :1] = 0
    return ids, mask


def test_decode_step_equals_sdpa_with_padding(tiny_pair) -> None:
    base, grouped = tiny_pair
    ids, mask = _padded_batch()
    out = []
    for model in (base, grouped):
        with torch.no_grad():
            pre = model(input_ids=ids, attention_mask=mask, use_cache=True)
            step = torch.tensor([[11], [12], [13]])
            full_mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
            nxt = model(input_ids=step, attention_mask=full_mask, past_key_values=pre.past_key_values)
        out.append((pre.logits, nxt.logits))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=0, atol=0)  # prefill: sdpa itself
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-5, atol=1e-5)


def test_function_packs_query_heads_of_a_group() -> None:
    """By hand: with 2 query heads on 1 key/value head and keys that make the softmax one-hot, each
    head's output is the value row its own query picks."""

    class Attn(torch.nn.Module):
        num_key_value_groups = 2

    q = torch.tensor([[[[50.0, 0.0]], [[0.0, 50.0]]]])  # [1 row, 2 heads, 1 token, dim 2]
    k = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # [1, 1 kv head, 2 keys, 2]
    v = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    out, _ = grouped_sdpa(Attn(), q, k, v, None, scaling=1.0)
    assert out.shape == (1, 1, 2, 2)
    torch.testing.assert_close(out[0, 0], torch.tensor([[1.0, 2.0], [3.0, 4.0]]), atol=1e-6, rtol=0)
    masked, _ = grouped_sdpa(Attn(), q, k, v, torch.tensor([[[[True, False]]]]), scaling=1.0)
    torch.testing.assert_close(masked[0, 0], torch.tensor([[1.0, 2.0], [1.0, 2.0]]), atol=1e-6, rtol=0)


def test_not_installed_without_groups_or_off_sdpa(smol_tokenizer) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    mha = LlamaForCausalLM(
        LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=4)
    )
    mha.set_attn_implementation("sdpa")
    assert not use_grouped_attention(mha) and mha.config._attn_implementation == "sdpa"
    eager = make_tiny_model(smol_tokenizer)
    eager.set_attn_implementation("eager")
    assert not use_grouped_attention(eager) and eager.config._attn_implementation == "eager"
