"""Decoding: generate traces with a takeover policy, branch them, calibrate the gate.

Modules: `sampling` (settings, position-keyed draws), `kvcache` (a KV cache layer that grows without a
copy per step), `state` (one model's cache over a batch), `caches` (held caches for branching), `records`
(per-token arrays), `engine` (the verify-ahead loop), `generation` (generate, generate_many), `takeover`
(takeover, branch), `calibration` (calibrate, base rollouts of this pair), `policies` (the registry, Guided,
the baselines), `lazy_gates` (the gates on the base alone), `policy_base`, `params`.

Each name loads its module on first use: `core.decoding.policies` (the CLI's option tables) must not pay
for torch and transformers, which `caches` and `generation` import.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "CACHES": "core.decoding.caches", "CacheLRU": "core.decoding.caches", "HeldCaches": "core.decoding.caches",
    "base_rollouts": "core.decoding.calibration", "calibrate": "core.decoding.calibration",
    "has_base_rollouts": "core.decoding.calibration", "generate": "core.decoding.generation",
    "generate_many": "core.decoding.generation", "Sampling": "core.decoding.sampling",
    "sample_token": "core.decoding.sampling", "branch": "core.decoding.takeover",
}  # fmt: skip

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'core.decoding' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))
