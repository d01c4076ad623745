"""Held KV caches: recent traces' model states, kept so that a branch needs no re-prefill.

Entries are never mutated: a branch crops a copy (`cropped_copy`), whose layers slice views of the
held tensors, so an interrupted branch leaves the LRU exactly as it was.
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from core import settings
from core.decoding.kvcache import compact
from core.decoding.state import ModelState
from core.pair.loading import SIDES
from core.trace import Trace

log = logging.getLogger(__name__)
CPU_MAX_BYTES = 1 << 30  # held on a CPU when settings.HELD_CACHE_GIB is None
GPU_SHARE = 0.1  # of the device's memory, held on CUDA when settings.HELD_CACHE_GIB is None


@dataclass
class HeldCaches:
    """Both models' caches after a trace, how many response tokens each holds, and each model's final
    hidden states: hidden[side][r] (d,) predicts response token r, for r = 0 .. n_tokens."""

    caches: dict[str, Any]
    prompt_len: dict[str, int]
    n_tokens: int  # response tokens fed into both caches
    hidden: dict[str, torch.Tensor] | None = None  # side -> (n_tokens + 1, d)

    def device(self) -> torch.device | None:
        """Where the held tensors live (None when nothing is held)."""
        for cache in self.caches.values():
            for layer in cache.layers:
                if isinstance(layer.keys, torch.Tensor):
                    return layer.keys.device
        return None

    def nbytes(self) -> int:
        """Bytes of the KV tensors and the hidden states (as views: a child sharing its parent's buffer
        counts it again, so the bound errs towards holding less)."""
        tensors = [t for c in self.caches.values() for layer in c.layers for t in (layer.keys, layer.values)]
        tensors += list((self.hidden or {}).values())
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class CacheLRU:
    """Recent traces' KV caches, bounded in bytes. Entries are never mutated: branches crop copies.

    `max_bytes` None: settings.HELD_CACHE_GIB, or when that is None too, 1 GiB on a CPU and a tenth of
    the GPU's memory for caches on CUDA (a long chain of thought of an 8B reasoner holds ~0.3 MB a token)."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, HeldCaches] = OrderedDict()
        self._sizes: dict[str, int] = {}  # key -> its entry's nbytes(), measured once on put

    def limit(self, device: torch.device | None = None) -> int:
        """The byte bound for caches on `device`."""
        if self.max_bytes is not None:
            return int(self.max_bytes)
        if settings.HELD_CACHE_GIB is not None:
            return settings.gib_bytes(settings.HELD_CACHE_GIB)
        if device is not None and device.type == "cuda":
            return int(GPU_SHARE * torch.cuda.get_device_properties(device).total_memory)
        return CPU_MAX_BYTES

    def put(self, key: str, held: HeldCaches) -> None:
        """Hold `held` under `key`, dropping the least recently used entries past the limit. An entry
        over the limit by itself is not held, and the log says so (its branches re-read the prefix)."""
        limit, size = self.limit(held.device()), held.nbytes()
        if size > limit:
            log.warning("not holding the KV caches of trace %s (%.2f GiB, over the %.2f GiB limit): a branch of it "
                        "re-reads its prefix; raise settings.HELD_CACHE_GIB or core.decoding.CACHES.max_bytes to hold it",
                        key, size / (1 << 30), limit / (1 << 30))
            self._items.pop(key, None)
            self._sizes.pop(key, None)
            return
        self._items[key], self._sizes[key] = held, size
        self._items.move_to_end(key)
        total = sum(self._sizes.values())
        while self._items and total > limit:
            old, _ = self._items.popitem(last=False)
            total -= self._sizes.pop(old)

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
        self._sizes.clear()


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


def warm_caches(pair: Any, trace: Trace, lru: CacheLRU = CACHES) -> bool:
    """Hold `trace`'s model states (one prefill of its prompt and response per model, hidden states kept), so
    that its first branch resumes from them as later ones do; False when they are held already or the trace is
    empty. Nothing else changes: this is what a branch's own prefill would compute."""
    if trace.key is None or len(trace) == 0 or lru.get(trace.key) is not None:
        return False
    ids = [int(x) for x in trace.token_ids]
    states = {}
    for side in SIDES:
        state = ModelState(pair, side, [list(trace.prompt_ids[side]) + ids], record=len(ids) + 1)
        state.fed = len(ids)
        states[side] = state
    hold(trace, states, lru)
    return True
