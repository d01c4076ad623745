"""A lazy sequence of stored traces: keys in memory, each trace read from the store when it is used."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from core.trace import Trace

if TYPE_CHECKING:
    from core.io.store import TraceStore


def trace_bytes(trace: Trace) -> int:
    """An estimate of the memory a read trace holds: its arrays and token strings exactly, one pointer per
    object, ~64 B per element of its prompt ids and list layers, 4 KiB for its meta (within ~10 % of what
    tracemalloc counts on demo traces)."""
    arrays = [trace.token_ids, *trace.metrics.values(), *(a for pair in trace.topk.values() for a in pair)]
    strings = sum(sys.getsizeof(t) for t in trace.tokens)  # one object per token as a read makes them
    listed = len(trace.prompt_ids) + sum(len(v) for v in trace.annotations.values() if isinstance(v, list))
    return sum(np.asarray(a).nbytes for a in arrays) + strings + 16 * len(trace.tokens) + 64 * listed + 4096


class _Kept:
    """Traces kept in memory while their estimated sizes fit `limit` bytes: the first ones read stay, so a
    sequence scanned again and again in the same order reads only the rest again (an LRU would keep nothing)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.size, self.traces, self.lock = limit, 0, {}, threading.Lock()

    def get(self, store: TraceStore, key: str) -> Trace:
        trace = self.traces.get(key)
        if trace is None:
            trace = store.get(key)
            if self.size < self.limit:
                n = trace_bytes(trace)
                with self.lock:  # two threads may scan one sequence (a server's page and its first paint)
                    if key not in self.traces and self.size + n <= self.limit:
                        self.traces[key], self.size = trace, self.size + n
        return trace


class StoredTraces(Sequence[Trace]):
    """Traces of one store named by key, read one at a time as they are used: a list of keys in memory,
    never the traces (what the evaluation keeps for analyses over many stored rollouts)."""

    def __init__(self, store: TraceStore, keys: Iterable[str] = (), keep_bytes: int = 0) -> None:
        self.store, self.keys = store, list(keys)
        self._kept = _Kept(keep_bytes)

    @property
    def keep_bytes(self) -> int:
        """How many bytes of read traces this sequence keeps in memory (0: none)."""
        return self._kept.limit

    def keeping(self, max_bytes: int) -> StoredTraces:
        """The same keys, keeping the traces it reads in memory up to `max_bytes` (estimated): for work that
        scans the traces many times (a report's analyses), so that what fits is read once. Itself when it keeps
        that much already."""
        return self if max_bytes == self.keep_bytes else StoredTraces(self.store, self.keys, max_bytes)

    def extend(self, more: Iterable[Any]) -> None:
        """Add keys (or traces, by their key: they must be stored here)."""
        self.keys.extend(k if isinstance(k, str) else k.key for k in (more.keys if isinstance(more, StoredTraces)
                                                                       else more))

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            part = StoredTraces(self.store, self.keys[i])
            part._kept = self._kept
            return part
        return self._kept.get(self.store, self.keys[i])

    def __iter__(self) -> Iterator[Trace]:
        for key in self.keys:
            yield self._kept.get(self.store, key)

    def __add__(self, other: Any) -> Any:
        if isinstance(other, StoredTraces) and other.store is self.store:
            return StoredTraces(self.store, self.keys + other.keys)
        return list(self) + list(other)

    def __repr__(self) -> str:
        return f"StoredTraces({self.store!r}, {len(self.keys)} keys)"
