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


def test_growing_cache_and_compact(qwen_pair) -> None:
    cache = growing_cache(qwen_pair.base.config)
    assert len(cache.layers) == qwen_pair.base.config.num_hidden_layers
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    for layer in cache.layers:
        layer.update(*kv(3, 2))
    compact(cache)
    assert all(layer.keys.shape[-2] == 3 and layer.keys.untyped_storage().nbytes() == layer.keys.nbytes
               for layer in cache.layers)
