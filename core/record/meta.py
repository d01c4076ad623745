"""The reproducibility record every trace carries in `meta` (see docs/ARCHITECTURE.md)."""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

from core.pair.loading import SIDES, ModelPair
from core.trace import SCHEMA_VERSION, request_key


@functools.cache
def versions() -> dict[str, str]:
    """The installed versions of forkpoint, torch and transformers ("unknown" when not installed)."""
    import importlib.metadata as md

    out = {}
    for name in ("forkpoint", "torch", "transformers"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "unknown"
    return out


def make_meta(pair: ModelPair, *, kind: str, request: dict[str, Any], problem: dict[str, Any],
              **extra: Any) -> dict[str, Any]:
    """A trace's meta: its key (from `request`), the pair and formats, the problem, versions and time;
    `extra` sets the stage's own fields (policy, sampling, parent, ...)."""
    meta = {
        "key": request_key(request),
        "kind": kind,
        "request": request,
        "problem": problem,
        "pair": pair.spec(),
        "formats": {side: pair.formats[side].spec for side in SIDES},
        "policy": None,
        "sampling": None,
        "parent": None,
        "branch_pos": None,
        "answer": None,
        "correct": None,
        "timings": {},
        "versions": dict(versions()),
        "schema": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    meta.update(extra)
    return meta
