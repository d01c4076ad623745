"""Shared by test_scale.py (in process) and test_scale_ray.py (on Ray): the demo fixtures, the options, the
reference run and the trace comparison every executor is checked with."""

from __future__ import annotations

import numpy as np
import pytest

import core


@pytest.fixture(scope="module")
def demo():
    """The bundled demo pair, once per test module."""
    return core.demo_pair(device="cpu")


@pytest.fixture(scope="module")
def problems():
    """Six demo problems."""
    return core.demo_problems(limit=6)


OPTS = {"max_new_tokens": 12, "temperature": 0.7, "top_p": 0.95, "seed": 3, "samples": 2}


def same(a, b) -> bool:
    """Token-identical traces with the same key and sources; metrics equal to float32 rounding (the
    engine's verify-ahead blocks adapt at run time, so the reasoner's sums may group differently)."""
    return (a.key == b.key and np.array_equal(a.token_ids, b.token_ids) and list(a.source) == list(b.source)
            and all(np.allclose(a.metrics[m], b.metrics[m], rtol=1e-5, atol=1e-5, equal_nan=True)
                    for m in a.metrics))


def reference(pair, problems, policy, batch_size, **opts):
    """The plain engine, batch by batch: what every executor must reproduce."""
    out = []
    for i in range(0, len(problems), batch_size):
        out += core.generate(pair, problems[i:i + batch_size], policy, **opts)
    return out
