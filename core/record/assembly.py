"""A `Trace` from flat per-position rows (scored or decoded), reusing a parent's prefix rows for a child."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from core.errors import InvalidInputError
from core.pair.loading import SIDES, ModelPair
from core.pair.tokens import display_tokens
from core.scoring.registry import METRICS
from core.trace import Trace


def assemble(pair: ModelPair, response_ids: list[int], prompt_ids: dict[str, list[int]],
             arrays: dict[str, np.ndarray], source: Sequence[str], meta: dict[str, Any], *,
             parent: Trace | None = None, keep: int = 0) -> Trace:
    """Build a Trace from flat metric arrays (as returned by `metrics_from_hidden`).

    A branch passes its `parent` and the `keep` tokens it shares with it: those rows (display strings,
    metrics, top-k) are the parent's, so assembling costs the same at any branch position. `arrays` then
    holds either the rows after the prefix or all rows."""
    n = len(response_ids)
    if parent is None:
        keep = 0
    elif not 0 <= keep <= min(len(parent), n) or not np.array_equal(
            np.asarray(parent.token_ids[:keep], dtype=np.int64), np.asarray(response_ids[:keep], dtype=np.int64)):
        raise InvalidInputError(f"The first {keep} tokens are not the parent trace's first {keep} tokens")
    rows = {name: np.asarray(value) for name, value in arrays.items()}
    if keep and len(rows["entropy_base"]) == n - keep:  # new rows only: the prefix's come from the parent
        prefix = {name: np.asarray(parent.metrics[name])[:keep] for name in METRICS}
        for side in SIDES:
            prefix[f"topk_{side}_ids"], prefix[f"topk_{side}_probs"] = (a[:keep] for a in parent.topk[side])
        rows = {name: np.concatenate([prefix[name], value]) for name, value in rows.items()}
    # a finished parent's last display string may hold an unfinished character's tail: recomputed
    known = parent.tokens[: min(keep, len(parent) - 1)] if parent is not None else ()
    return Trace(
        token_ids=np.asarray(response_ids, dtype=np.int64),
        tokens=display_tokens(pair.tokenizer, response_ids, known=known),
        prompt_ids=prompt_ids,
        metrics={name: rows[name] for name in METRICS},
        topk={side: (np.asarray(rows[f"topk_{side}_ids"], dtype=np.int64),
                     np.asarray(rows[f"topk_{side}_probs"], dtype=np.float32)) for side in SIDES},
        source=np.asarray(list(source), dtype=object),
        meta=meta,
    )
