"""The learned gate's features along a stored trace: what the engine would hand the router at each position
(core/decoding/router.py's FEATURES), from one teacher-forced forward of the base over the trace's tokens.
Used to train a router and to calibrate its cut on base rollouts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from core.decoding.router import step_features
from core.pair.forward import backbone, head
from core.scoring.metrics import entropy_and_top2


def trace_features(pair: Any, trace: Any, chunk: int = 128) -> np.ndarray:
    """(T, F) the router's features at each position of `trace` (the base's path is the trace's tokens)."""
    n = len(trace)
    prompt = list(trace.prompt_ids["base"])
    if n == 0:
        return np.zeros((0, 0), dtype=np.float32)
    ids = torch.tensor([prompt + [int(x) for x in trace.token_ids]], dtype=torch.long, device=pair.device)
    hidden, _ = backbone(pair.base, ids)
    hidden = hidden[0, len(prompt) - 1 : len(prompt) - 1 + n]
    h, top = [], []
    for start in range(0, n, chunk):
        e, t2 = entropy_and_top2(head(pair.base, hidden[start : start + chunk], pair.vocab_size))
        h.append(e.cpu().numpy())
        top.append(t2.cpu().numpy())
    limit = int((trace.meta.get("sampling") or {}).get("max_new_tokens") or n)
    return step_features(hidden.float().cpu().numpy(), np.concatenate(h), np.concatenate(top), np.arange(n), limit)
