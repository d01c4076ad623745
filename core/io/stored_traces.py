"""A lazy sequence of stored traces: keys in memory, each trace read from the store when it is used."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from core.trace import Trace

if TYPE_CHECKING:
    from core.io.store import TraceStore


class StoredTraces(Sequence[Trace]):
    """Traces of one store named by key, read one at a time as they are used: a list of keys in memory,
    never the traces (what the evaluation keeps for analyses over many stored rollouts)."""

    def __init__(self, store: TraceStore, keys: Iterable[str] = ()) -> None:
        self.store, self.keys = store, list(keys)

    def extend(self, more: Iterable[Any]) -> None:
        """Add keys (or traces, by their key: they must be stored here)."""
        self.keys.extend(k if isinstance(k, str) else k.key for k in (more.keys if isinstance(more, StoredTraces)
                                                                       else more))

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return StoredTraces(self.store, self.keys[i])
        return self.store.get(self.keys[i])

    def __iter__(self) -> Iterator[Trace]:
        for key in self.keys:
            yield self.store.get(key)

    def __add__(self, other: Any) -> Any:
        if isinstance(other, StoredTraces) and other.store is self.store:
            return StoredTraces(self.store, self.keys + other.keys)
        return list(self) + list(other)

    def __repr__(self) -> str:
        return f"StoredTraces({self.store!r}, {len(self.keys)} keys)"
