"""A KV cache whose layers grow geometrically instead of concatenating every step.

transformers' `DynamicLayer.update` runs `torch.cat([keys, new])`: every decoding step copies the whole
cache, O(T) per token on top of attention's own read. `GrowingLayer` writes new keys and values into a
buffer with spare room (a quarter more than needed: amortised O(1) per token, and little enough that a
held cache keeps its buffer instead of being copied to exact size) and exposes the filled part as a
view; crop just shortens the view. A layer only ever writes into a buffer it allocated itself: a
`copy.copy` of it (a branch's cropped copy of a held cache) allocates its own buffer on its first update,
and a compacted (held) layer gives its buffer up, so a held cache is never written through.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256  # positions allocated at least, so short prompts do not reallocate every few steps
SLACK = 4  # a buffer holds need + need // SLACK positions; compact keeps a buffer with at most that slack


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose keys/values (B, H, n, D) are views of (B, H, capacity, D) buffers."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.keys = self.values = None
        n = 0 if self.keys is None else self.keys.shape[-2]
        need = n + key_states.shape[-2]
        buffers = getattr(self, "_buffers", None)
        if buffers is None or buffers[0]() is not self or buffers[1].shape[-2] < need:
            self._grow(n, need, key_states)
        _, kbuf, vbuf = self._buffers
        kbuf[..., n:need, :] = key_states
        vbuf[..., n:need, :] = value_states
        self.keys, self.values = kbuf[..., :need, :], vbuf[..., :need, :]
        return self.keys, self.values

    def _grow(self, n: int, need: int, like: torch.Tensor) -> None:
        """New buffers owned by this layer object, holding the first n positions."""
        shape = list(like.shape)
        shape[-2] = max(MIN_CAPACITY, need + need // SLACK)
        kbuf = like.new_empty(shape)
        vbuf = like.new_empty(shape)
        if n:
            kbuf[..., :n, :] = self.keys
            vbuf[..., :n, :] = self.values
        # the owner as a weak reference: a strong one would be a cycle, and a finished cache's GPU memory
        # would then wait for the cycle collector instead of being freed when the cache is dropped
        self._buffers = (weakref.ref(self), kbuf, vbuf)

    def compact(self) -> None:
        """Before the cache is held: give the buffer up (the next update allocates its own), and copy keys
        and values to exact size only when the spare room is more than 1/SLACK of them (e.g. after a crop)."""
        if self.is_initialized and self.keys is not None:
            n, capacity = self.keys.shape[-2], self.keys.untyped_storage().nbytes() // max(1, self._row_bytes())
            if capacity - n > n // SLACK:
                self.keys, self.values = self.keys.clone(), self.values.clone()
            self._buffers = None

    def _row_bytes(self) -> int:
        """Bytes one position takes in the keys' storage (all rows and heads)."""
        shape = self.keys.shape
        return self.keys.element_size() * shape[0] * shape[1] * shape[-1]


def growing_cache(config: Any) -> Any:
    """A `DynamicCache` for `config` whose layers are all `GrowingLayer`s.

    Sliding-window layers too: transformers' sliding layer drops positions past its window, so it
    cannot be cropped back there (verify-ahead blocks and branches crop). A full layer keeps them, and
    the model's sliding-window mask (built from the layer types in its config, over absolute
    positions) still hides them from attention: the same outputs for more memory."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if isinstance(layer, DynamicLayer) else layer for layer in cache.layers]
    return cache


def compact(cache: Any) -> None:
    """Compact every growing layer of `cache`."""
    for layer in cache.layers:
        if isinstance(layer, GrowingLayer):
            layer.compact()
