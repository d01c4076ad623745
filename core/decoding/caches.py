"""Held KV caches: recent traces' model states, kept so that a branch needs no re-prefill.

Entries are never mutated: a branch crops a copy (`cropped_copy`), whose layers slice views of the
held tensors, so an interrupted branch leaves the LRU exactly as it was.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from core.decoding.kvcache import compact
from core.pair.loading import SIDES
from core.trace import Trace

DEFAULT_MAX_BYTES = 1 << 30


@dataclass
class HeldCaches:
    """Both models' caches after a trace, how many response tokens each holds, and each model's final
    hidden states: hidden[side][r] (d,) predicts response token r, for r = 0 .. n_tokens."""

    caches: dict[str, Any]
    prompt_len: dict[str, int]
    n_tokens: int  # response tokens fed into both caches
    hidden: dict[str, torch.Tensor] | None = None  # side -> (n_tokens + 1, d)

    def nbytes(self) -> int:
        """Bytes held by the KV tensors and the hidden states."""
        tensors = [t for c in self.caches.values() for layer in c.layers for t in (layer.keys, layer.values)]
        tensors += list((self.hidden or {}).values())
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class CacheLRU:
    """Recent traces' KV caches, bounded in bytes. Entries are never mutated: branches crop copies."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, HeldCaches] = OrderedDict()

    def put(self, key: str, held: HeldCaches) -> None:
        """Hold `held` under `key`, dropping the least recently used entries past `max_bytes`."""
        self._items[key] = held
        self._items.move_to_end(key)
        while self._items and sum(h.nbytes() for h in self._items.values()) > self.max_bytes:
            self._items.popitem(last=False)

    def get(self, key: str | None) -> HeldCaches | None:
        """The entry for `key` (marked recently used), or None."""
        if key is None or key not in self._items:
            return None
        self._items.move_to_end(key)
        return self._items[key]

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()


CACHES = CacheLRU()  # the explicit process-wide cache of recent traces' KV caches


def cropped_copy(cache: Any, keep: int) -> Any:
    """A new cache holding the first `keep` positions; the original is untouched (crop slices views)."""
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    remove = cache.get_seq_length() - keep
    if remove > 0:
        new.crop(-remove)
    return new


def hold(trace: Trace, states: dict[str, Any], lru: CacheLRU = CACHES) -> None:
    """Keep a finished single-row run's model states (core.decoding.state.ModelState) for later branches."""
    if trace.key is None or len(trace) == 0:
        return
    fed = states["base"].fed
    if states["reason"].fed != fed:
        return
    for s in SIDES:
        compact(states[s].cache)  # held entries keep no spare room
    prompt_len = {s: states[s].cache.get_seq_length() - fed for s in SIDES}
    hidden = {s: states[s].recorded() for s in SIDES}
    lru.put(trace.key, HeldCaches({s: states[s].cache for s in SIDES}, prompt_len, fed,
                                  hidden if all(h is not None for h in hidden.values()) else None))
