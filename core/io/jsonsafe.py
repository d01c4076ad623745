"""Strict JSON out: JSON has no NaN or Infinity, so forkpoint never writes them bare.

Rule (every JSON / JSONL file forkpoint writes): a non-finite float (NaN, +inf, -inf) is written as
`null`. Readers of per-token float arrays turn `null` back into NaN (`floats_in`); a `null` scalar in
meta reads back as None. Standard JSON parsers (jq, JavaScript, strict Python) read every line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from core.trace import _json_default


def finite_or_null(value: Any) -> Any:
    """A copy of a JSON-ready structure with every non-finite float (also in numpy arrays) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.ndarray):
        return finite_or_null(value.tolist())
    if isinstance(value, np.generic):
        return finite_or_null(value.item())
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


def dumps_strict(value: Any, **kwargs: Any) -> str:
    """json.dumps that never emits NaN/Infinity (they become null); numpy values are converted."""
    kwargs.setdefault("default", _json_default)
    try:  # the common case has no non-finite float: one pass, no copy
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError:
        return json.dumps(finite_or_null(value), allow_nan=False, **kwargs)


def floats_in(values: Sequence[Any], dtype: Any = np.float64) -> np.ndarray:
    """A float array from JSON values where null stands for NaN (the inverse of the rule above)."""
    return np.array([np.nan if v is None else v for v in values], dtype=dtype)
