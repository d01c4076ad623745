"""core.decoding.kvcache: the growing KV layer equals transformers' concatenating one, and copies never
write into the buffer of the layer they were copied from."""

from __future__ import annotations

import copy

import torch
from transformers.cache_utils import DynamicLayer

from core.decoding.kvcache import MIN_CAPACITY, GrowingLayer, compact, growing_cache


def kv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, n, 4, generator=g), torch.randn(2, 3, n, 4, generator=g)


def test_growing_layer_matches_dynamic_layer_through_updates_and_crops() -> None:
    grow, plain = GrowingLayer(), DynamicLayer()
    for step, (n, crop) in enumerate([(5, 0), (1, 0), (300, 0), (1, -2), (7, -7), (2, 0)]):
        k, v = kv(n, step)
        a, b = grow.update(k, v), plain.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        if crop:
            grow.crop(crop)
            plain.crop(crop)
        assert grow.get_seq_length() == plain.get_seq_length()
    assert grow._buffers[1].shape[-2] >= max(MIN_CAPACITY, grow.get_seq_length())
    assert grow.keys.data_ptr() == grow._buffers[1].data_ptr()  # a view of the buffer: no copy per step


def test_a_copy_never_writes_into_the_original() -> None:
    held = GrowingLayer()
    held.update(*kv(10, 0))
    snapshot = held.keys.clone(), held.values.clone()
    child = copy.copy(held)
    child.crop(-4)  # what core.decoding.caches.cropped_copy does
    child.update(*kv(6, 1))  # would overwrite positions 6..9 of a shared buffer
    assert torch.equal(held.keys, snapshot[0]) and torch.equal(held.values, snapshot[1])
    assert torch.equal(child.keys[..., :6, :], snapshot[0][..., :6, :]) and child.get_seq_length() == 12


def test_a_dropped_layer_frees_its_buffer_without_the_cycle_collector() -> None:
    import gc
    import weakref

    gc.disable()  # only reference counting may free it (a GPU cache must not wait for a gc pass)
    try:
        layer = GrowingLayer()
        layer.update(*kv(10, 0))
        buffer = weakref.ref(layer._buffers[1])
        del layer
        assert buffer() is None
    finally:
        gc.enable()


def test_growing_cache_and_compact(qwen_pair) -> None:
    cache = growing_cache(qwen_pair.base.config)
    assert len(cache.layers) == qwen_pair.base.config.num_hidden_layers
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    for layer in cache.layers:
        layer.update(*kv(3, 2))
    compact(cache)
    assert all(layer.keys.shape[-2] == 3 and layer.keys.untyped_storage().nbytes() == layer.keys.nbytes
               for layer in cache.layers)


def test_compact_keeps_a_tight_buffer_and_never_writes_into_it_again() -> None:
    """A held layer whose buffer has little spare room keeps it (no copy of the cache); the layer then
    writes into a buffer of its own, so views a branch took of the held positions stay as they were."""
    held = GrowingLayer()
    held.update(*kv(1000, 0))  # one allocation of 1000 + 1000 // SLACK positions
    held.update(*kv(200, 1))
    compact(cache := type("C", (), {"layers": [held]})())
    assert held.keys.untyped_storage().nbytes() > held.keys.nbytes  # kept: 50 spare of 1200 positions
    view, snapshot = held.keys, held.keys.clone()
    held.crop(-100)
    held.update(*kv(100, 2))  # would overwrite positions 1100..1199 of the kept buffer
    assert torch.equal(view, snapshot) and held.get_seq_length() == 1200
    loose = GrowingLayer()
    loose.update(*kv(1000, 0))
    loose.crop(-600)  # 850 spare of 400: copied to exact size
    compact(type("C", (), {"layers": [loose]})())
    assert loose.keys.untyped_storage().nbytes() == loose.keys.nbytes
    assert cache.layers[0] is held


def test_block_attention_equals_transformers_sdpa_without_repeating_the_cache(tiny_dirs, monkeypatch) -> None:
    """core.pair.attention: a masked block after a cache (left padding, GQA) gives transformers' SDPA result,
    and torch's SDPA sees the key/value heads as they are (no per-query-head copy of the cache)."""
    from transformers import AutoModelForCausalLM

    from core.pair.attention import NAME, use_block_attention

    plain = AutoModelForCausalLM.from_pretrained(tiny_dirs["qwen_base"], dtype=torch.float32).eval()
    block = use_block_attention(AutoModelForCausalLM.from_pretrained(tiny_dirs["qwen_base"], dtype=torch.float32).eval())
    assert plain.config._attn_implementation == "sdpa" and block.config._attn_implementation == NAME
    assert plain.config.num_attention_heads > plain.config.num_key_value_heads  # the GQA case
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.append((q.shape[1], k.shape[1]))
        return sdpa(q, k, v, **kwargs)

    ids = torch.randint(5, 300, (2, 30), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 36, dtype=torch.long)
    mask[1, :4] = 0  # row 1 is left-padded
    outs = []
    with torch.inference_mode():
        for model in (plain, block):
            cache = growing_cache(model.config)
            model(input_ids=ids, attention_mask=mask[:, :30], cache=cache)
            monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
            outs.append(model(input_ids=ids[:, :6], attention_mask=mask, cache=cache).logits)
            monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=1e-5)
    layers = plain.config.num_hidden_layers
    kv_heads = plain.config.num_key_value_heads
    assert seen[:layers] != seen[layers:] and all(k == kv_heads for _, k in seen[layers:])
