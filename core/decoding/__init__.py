"""Decoding: generate traces with a takeover policy, branch them, calibrate the gate.

Modules: `sampling` (settings, position-keyed draws), `kvcache` (a KV cache layer that grows without a
copy per step), `state` (one model's cache over a batch), `caches` (held caches for branching), `records`
(per-token arrays), `engine` (the verify-ahead loop), `generation` (generate, generate_many), `takeover`
(takeover, branch), `calibration` (calibrate, base rollouts of this pair), `policies`, `params`.
"""

from core.decoding.caches import CACHES, CacheLRU, HeldCaches
from core.decoding.calibration import base_rollouts, calibrate, has_base_rollouts
from core.decoding.generation import generate, generate_many
from core.decoding.sampling import Sampling, sample_token
from core.decoding.takeover import branch

__all__ = [
    "CACHES",
    "CacheLRU",
    "HeldCaches",
    "Sampling",
    "base_rollouts",
    "branch",
    "calibrate",
    "generate",
    "generate_many",
    "has_base_rollouts",
    "sample_token",
]
