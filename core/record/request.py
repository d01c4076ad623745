"""The request behind a store key: one constructor for every kind of trace (the key is `request_key` of it)."""

from __future__ import annotations

from typing import Any

from core.trace import request_key

__all__ = ["request", "request_key"]


def request(kind: str, pair: str, **fields: Any) -> dict[str, Any]:
    """The request of a trace of `kind` made with the pair identified by `pair` (its fingerprint, or an
    import's pair identity): every input that decides its content, so equal requests give one key."""
    return {"kind": kind, "pair": pair, **fields}
