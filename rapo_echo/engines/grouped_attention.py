"""One-token attention over grouped key/value heads without repeating the keys and values.

With grouped-query attention (several query heads per key/value head) transformers' ``sdpa`` path
repeats every key and value head ``num_key_value_groups`` times before calling
``scaled_dot_product_attention`` whenever a mask is passed (the padded batches we decode always have
one), and under ``torch.compile`` always (its own packing for one query token is skipped there). In a
decode step that copy is the largest memory traffic of the step: for a 1.4B Llama with 6 query heads per
key/value head, 256 rows and a 384-token static cache it writes and reads about 34 GB per step, against
2.8 GB of weights. For one query token the same attention needs no copy: the query heads of a group
become ``groups`` query positions over their shared key/value head
(``[rows, heads, 1, dim] -> [rows, kv_heads, groups, dim]``), under the same mask, which broadcasts.

:func:`use_grouped_attention` registers that function with transformers' attention interface under
:data:`NAME` and switches a model from ``sdpa`` to it; anything but a one-token query with a mask shared
by all heads goes to transformers' own ``sdpa`` function unchanged, so training forwards are untouched.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

NAME = "rapo_grouped_sdpa"


def grouped_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns ``([rows, q_len, heads, dim], None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    rows, heads, q_len, dim = query.shape
    per_head_mask = attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[1] != 1
    if q_len != 1 or groups == 1 or per_head_mask or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
            **kwargs,
        )
    packed = query.reshape(rows, heads // groups, groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        packed, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling
    )
    return out.reshape(rows, heads, 1, dim).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, grouped_sdpa)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_grouped_attention(model: Any) -> bool:
    """Switch ``model`` (a transformers model, or a PEFT wrapper of one) from ``sdpa`` to
    :func:`grouped_sdpa` when it has grouped key/value heads; returns whether it did. Models on any
    other attention implementation (eager, flash, flex) are left as they are."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    if text is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    if kv_heads == text.num_attention_heads or not hasattr(base, "set_attn_implementation"):
        return False
    try:
        _register()
        base.set_attn_implementation(NAME)
    except Exception as err:  # an older or newer transformers without this interface: keep sdpa
        log.debug("grouped attention not installed (%s); decoding with sdpa", err)
        return False
    return base.config._attn_implementation == NAME
