"""Attention for a short block of new tokens after a long KV cache, without copying the cache.

transformers' SDPA attention handles grouped-query heads (GQA: fewer key/value heads than query heads)
without copying keys and values only for one query token or no mask. A block of n > 1 tokens after a
cache (verify-ahead, branches, catch-up reads) carries a causal mask, and then it repeats every
key/value head for each query head: a copy of the whole cache per layer and block, O(T) work that made
a branch at token 4,000 cost twice one at token 40. Here the query heads that share a key/value head are
stacked along the query axis instead (what transformers does for one token, generalised to n), so
attention reads the cache where it is. Same dot products, same softmax rows.

`use_block_attention(model)` switches a model from "sdpa" to this; other implementations are left alone.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "forkpoint_sdpa"


def block_sdpa_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, with GQA heads packed along the query axis for masked blocks."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, length, dim = query.shape
    if (groups == 1 or length == 1 or attention_mask is None or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1 or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # query head h uses key/value head h // groups: rows (g, l) of a packed head are query head kv * groups + g
    packed = query.reshape(batch, heads // groups, groups * length, dim)
    mask = attention_mask[..., : key.shape[-2]].repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scaling)
    return out.reshape(batch, heads, length, value.shape[-1]).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, block_sdpa_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def use_block_attention(model: Any) -> Any:
    """Switch `model` from transformers' "sdpa" attention to `block_sdpa_forward` (in place; returns it)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return model
    _register()
    model.set_attn_implementation(NAME)
    return model
