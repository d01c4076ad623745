"""Decision pairs: at each top disagreement position, what the base and the reasoner would each emit
(ids, texts, both models' probabilities of both), as a table or JSONL for inspection."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from core import settings
from core.analysis.views import ENTROPY, POOLED, SEGMENTS  # noqa: F401
from core.analysis.views import as_list as _as_list  # noqa: F401
from core.analysis.views import label as _label
from core.analysis.views import prepare as _prepare
from core.analysis.views import values as _values  # noqa: F401
from core.analysis.views import view as _view
from core.annotate.spikes import spikes_or_top, top_positions
from core.errors import OutputExistsError
from core.io.atomic import write_atomic
from core.scoring.registry import DEFAULT_SCORE, score_values
from core.trace import Trace

log = logging.getLogger(__name__)


DECISION_COLUMNS = [
    "trace", "pos", "prefix", "emitted_id", "emitted_text", "source",
    "base_id", "base_text", "reason_id", "reason_text",
    "p_base_base", "p_base_reason", "p_reason_base", "p_reason_reason",
    "reason_top_rank_in_base", "score_name", "score",
]  # fmt: skip


def _prob_of(ids: np.ndarray, probs: np.ndarray, token: int) -> float:
    hit = np.flatnonzero(ids == token)
    return float(probs[hit[0]]) if hit.size else float("nan")


def decision_pairs(
    traces: Trace | Sequence[Trace],
    tokenizer_decode: Callable[[list[int]], str] | None = None,
    score: str = DEFAULT_SCORE,
    top: float = settings.SPIKE_TOP,
    segment: str | None = None,
) -> pd.DataFrame:
    """One row per spike (annotated, else top-`top` by `score`): the base's and the reasoner's choice.

    base/reason token = argmax of each model's top-k; p_<model>_<choice> is that model's probability
    of that choice (NaN when outside the model's top-k). Texts come from `tokenizer_decode([id])`
    when given; without it only a choice equal to the emitted token gets its text (else None).
    """
    items = _prepare(traces, score, segment)
    rows = []
    for i, t in enumerate(items):
        view = _view(t, segment)
        if "spikes" in t.annotations:
            pos_list = np.intersect1d(view, spikes_or_top(t, score))
        else:
            pos_list = view[top_positions(_values(t, score, segment)[1], top)]
        values = np.asarray(score_values(t.metrics, score), dtype=np.float64)
        ids_b, probs_b = (np.asarray(a) for a in t.topk["base"])
        ids_r, probs_r = (np.asarray(a) for a in t.topk["reason"])
        for pos in pos_list.tolist():
            base_id = int(ids_b[pos][np.argmax(probs_b[pos])])
            reason_id = int(ids_r[pos][np.argmax(probs_r[pos])])
            emitted = int(t.token_ids[pos])

            def text(tok: int) -> str | None:
                if tokenizer_decode is not None:
                    return tokenizer_decode([tok])
                return t.tokens[pos] if tok == emitted else None

            rows.append({
                "trace": _label(t, i), "pos": pos, "prefix": "".join(t.tokens[:pos]),
                "emitted_id": emitted, "emitted_text": t.tokens[pos], "source": str(t.source[pos]),
                "base_id": base_id, "base_text": text(base_id),
                "reason_id": reason_id, "reason_text": text(reason_id),
                "p_base_base": _prob_of(ids_b[pos], probs_b[pos], base_id),
                "p_base_reason": _prob_of(ids_b[pos], probs_b[pos], reason_id),
                "p_reason_base": _prob_of(ids_r[pos], probs_r[pos], base_id),
                "p_reason_reason": _prob_of(ids_r[pos], probs_r[pos], reason_id),
                "reason_top_rank_in_base": int(t.metrics["reason_top_rank_in_base"][pos]),
                "score_name": score, "score": float(values[pos]),
            })  # fmt: skip
    return pd.DataFrame(rows, columns=DECISION_COLUMNS)


def write_decision_pairs_jsonl(df: pd.DataFrame, path: str, overwrite: bool = False) -> str:
    """Write decision pairs one JSON object per line (NaN -> null); refuses to overwrite unless asked."""
    if os.path.exists(path) and not overwrite:
        raise OutputExistsError(f"{path} exists; overwrite=True (CLI: --overwrite) replaces it")
    lines = (json.dumps({k: _jsonable(v) for k, v in r.items()}, ensure_ascii=False) + "\n"
             for r in df.to_dict(orient="records"))
    write_atomic(Path(path), lambda fh: fh.writelines(lines), what="decision pairs")
    log.info("wrote %d decision pairs to %s", len(df), path)
    return path


def _jsonable(v: object) -> object:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v
