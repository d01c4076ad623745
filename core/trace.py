"""`Trace`: one response scored by both models, token by token, with the record of what made it.

A trace is immutable in spirit: annotating or branching makes a new one. `frame()` is the tidy,
one-row-per-token view every layer reads.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from core.errors import InvalidInputError
from core.scoring.registry import (
    METRICS,
    RANK_SHIFT,
    RANK_SHIFT_METRIC,
    rank_shift_category,
)

SCHEMA_VERSION = 1
SOURCES = ("base", "reason", "forced")
TAKEOVER_SOURCE = "reason"  # a takeover is a token the reasoner wrote; "forced" (typed or given) is the user's
SIDES = ("base", "reason")
_HTML_RENDERER: list = []  # Trace -> HTML for `_repr_html_`, set by `register_html_renderer` (the data never imports views)


def register_html_renderer(render: Any) -> None:
    """Set how a trace shows itself in Jupyter (`core/__init__.py` registers `core.views.display.trace_html`)."""
    _HTML_RENDERER[:] = [render]


def note_texts(layer: list[dict[str, Any]], n: int) -> list[str]:
    """Per token, the text of the notes of a "notes" layer covering it, joined with " | " ("" for none; "🔖"
    for an empty bookmark): the `note` column of `frame()` and of CSV/Parquet exports."""
    col: list[list[str]] = [[] for _ in range(n)]
    for note in layer:
        for pos in range(max(0, int(note["start"])), min(int(note["end"]), n - 1) + 1):
            col[pos].append(str(note.get("text", "")) or ("🔖" if note.get("bookmark") else ""))
    return [" | ".join(parts) for parts in col]


def request_key(request: dict[str, Any]) -> str:
    """Content-derived key of a request (same inputs and settings -> same key): sha256 of canonical JSON."""
    blob = json.dumps(request, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


@dataclass(eq=False)
class Trace:
    """A response and, per token, both models' metrics.

    token_ids   (T,) int64: the response tokens, shared by both models.
    tokens      T display strings; "".join(tokens) == text (a character split across byte-level
                tokens is shown on the token that completes it).
    prompt_ids  {"base": [...], "reason": [...]}: each model's formatted prompt.
    metrics     name -> (T,) array, one per entry of `core.scoring.registry.METRICS`.
    topk        {"base": (ids (T,k) int64, probs (T,k) float32), "reason": (...)}.
    source      (T,) str: who emitted each token ("base", "reason" or "forced").
    meta        the reproducibility record (request, pair, formats, policy, sampling, ...).
    annotations derived, optional layers: "spikes" {rule, positions}, "tags" (T,) str, "segments".
    """

    token_ids: np.ndarray
    tokens: list[str]
    prompt_ids: dict[str, list[int]]
    metrics: dict[str, np.ndarray]
    topk: dict[str, tuple[np.ndarray, np.ndarray]]
    source: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.token_ids = np.asarray(self.token_ids, dtype=np.int64).reshape(-1)
        self.source = np.asarray(self.source, dtype=object).reshape(-1)
        n = len(self.token_ids)
        if len(self.tokens) != n or len(self.source) != n:
            raise InvalidInputError(
                f"Trace parts disagree in length: {n} token ids, {len(self.tokens)} token strings, "
                f"{len(self.source)} sources"
            )
        missing = [name for name in METRICS if name not in self.metrics]
        if missing:
            raise InvalidInputError(f"Trace is missing metrics: {', '.join(missing)}")
        for name, values in self.metrics.items():
            if len(values) != n:
                raise InvalidInputError(f"metric {name!r} has {len(values)} values for {n} tokens")

    # -- identity -----------------------------------------------------------------------------
    @property
    def key(self) -> str | None:
        """The content-derived store key (from `meta["request"]`), or None for an ad-hoc trace."""
        return self.meta.get("key")

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def k(self) -> int:
        return int(self.topk["base"][0].shape[1]) if len(self) else 0

    @property
    def spike_positions(self) -> list[int]:
        """The positions of the "spikes" annotation layer, sorted ([] without one): the one reader of that layer."""
        layer = self.annotations.get("spikes") or {}
        return sorted({int(p) for p in layer.get("positions", ()) if 0 <= int(p) < len(self)})

    @property
    def n_takeovers(self) -> int:
        """Tokens the reasoner wrote: the one count of takeovers (a forced token, typed or given, is the user's
        and counts neither here nor in ρ)."""
        return int(np.count_nonzero(self.takeovers))

    @property
    def takeovers(self) -> np.ndarray:
        """(T,) bool: the tokens the reasoner wrote (TAKEOVER_SOURCE), the positions every count of takeovers reads."""
        return np.asarray(self.source, dtype=object) == TAKEOVER_SOURCE

    # -- views --------------------------------------------------------------------------------
    def frame(self) -> pd.DataFrame:
        """One row per response token: pos, token_id, token, every metric, topk_*, source, rank_shift, tags (and
        spike, segment, note, and switch ("reason" / "base" / a forced token id) when those exist)."""
        return pd.DataFrame(self.columns())

    def columns(self) -> dict[str, Any]:
        """`frame`'s columns, by name in its order, as arrays and lists (what an export of many traces puts in one
        frame: a frame per trace cost ~7 ms of pandas each)."""
        n = len(self)
        data: dict[str, Any] = {
            "pos": np.arange(n, dtype=np.int64),
            "token_id": self.token_ids,
            "token": list(self.tokens),
        }
        for name in METRICS:
            data[name] = np.asarray(self.metrics[name])
        for side in SIDES:
            ids, probs = self.topk[side]
            data[f"topk_{side}"] = [list(zip(row_ids, row_probs)) for row_ids, row_probs in
                                    zip(np.asarray(ids).tolist(), np.asarray(probs).tolist())]
        data["source"] = list(self.source)
        data[RANK_SHIFT] = rank_shift_category(self.metrics[RANK_SHIFT_METRIC]) if n else []  # unshifted / marginal / shifted
        if "tags" in self.annotations:
            data["tag"] = list(self.annotations["tags"])
        if "segments" in self.annotations:
            data["segment"] = list(self.annotations["segments"])
        if "spikes" in self.annotations:
            spike = np.zeros(n, dtype=bool)
            spike[list(self.annotations["spikes"]["positions"])] = True
            data["spike"] = spike
        if self.meta.get("switches"):  # core.takeover's switches in force: who was made to write there
            switch = [""] * n
            for pos, what in self.meta["switches"].items():
                if 0 <= int(pos) < n:
                    switch[int(pos)] = str(what)
            data["switch"] = switch
        if self.annotations.get("notes"):  # the notes layer (core/io/notes.py attach_notes): text per token
            data["note"] = note_texts(self.annotations["notes"], n)
        return data

    def _repr_html_(self) -> str | None:
        """Jupyter's rich display: the renderer `core` registers at import (core/views/display.py `trace_html`,
        the HTML export's self-contained page); None (plain repr) when none is registered."""
        return _HTML_RENDERER[0](self) if _HTML_RENDERER else None

    # -- derivation ---------------------------------------------------------------------------
    def annotate(self, **layers: Any) -> Trace:
        """A copy with the given annotation layers added or replaced (the original is unchanged)."""
        return replace(self, meta=copy.deepcopy(self.meta), annotations={**self.annotations, **layers})

    def prefix(self, n: int) -> Trace:
        """The first `n` tokens as a new trace (metrics, top-k and sources cut alike; annotations dropped).
        It is not the request that made the whole trace: its key, request and grade are dropped (a store
        keys it by content) and `prefix_of` names the whole trace."""
        meta = {name: value for name, value in copy.deepcopy(self.meta).items()
                if name not in ("key", "request", "answer", "correct")}
        if self.key is not None:
            meta["prefix_of"] = self.key
        return Trace(
            token_ids=self.token_ids[:n],
            tokens=self.tokens[:n],
            prompt_ids=copy.deepcopy(self.prompt_ids),
            metrics={name: np.asarray(values)[:n] for name, values in self.metrics.items()},
            topk={side: (ids[:n], probs[:n]) for side, (ids, probs) in self.topk.items()},
            source=self.source[:n],
            meta=meta,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        if len(self) != len(other) or self.tokens != other.tokens or self.prompt_ids != other.prompt_ids:
            return False
        if not np.array_equal(self.token_ids, other.token_ids) or list(self.source) != list(other.source):
            return False
        if self.metrics.keys() != other.metrics.keys() or any(
            not np.allclose(self.metrics[m], other.metrics[m], rtol=1e-6, atol=1e-6, equal_nan=True)
            for m in self.metrics
        ):
            return False
        for side in SIDES:
            if not np.array_equal(self.topk[side][0], other.topk[side][0]):
                return False
            if not np.allclose(self.topk[side][1], other.topk[side][1], rtol=1e-6, atol=1e-7):
                return False
        return _jsonable(self.meta) == _jsonable(other.meta) and _jsonable(self.annotations) == _jsonable(
            other.annotations
        )

    __hash__ = None  # type: ignore[assignment]


def _jsonable(value: Any) -> Any:
    """Normalise nested containers (tuples, numpy scalars) so that JSON round trips compare equal."""
    return json.loads(json.dumps(value, sort_keys=True, default=_json_default))


def answer_rule_of(meta: dict[str, Any]) -> str | None:
    """The rule that extracted a graded trace's answer (core/evaluation/answers.py RULES; "unrecorded" for an
    answer graded before rules were recorded); None when nothing was extracted or it is not graded."""
    if meta.get("answer") is None:
        return None
    return meta.get("answer_rule") or "unrecorded"


def decode_seconds(meta: dict[str, Any]) -> float | None:
    """This trace's share of the decoding wall time recorded with it (meta["timings"]: its batch's seconds over
    the batch's rows), so a run's wall time per token can be read back from stored traces; None when unrecorded."""
    timings = meta.get("timings") or {}
    seconds, batch = timings.get("generate_s"), timings.get("batch")
    if not isinstance(seconds, (int, float)) or not isinstance(batch, int) or batch < 1:
        return None
    return float(seconds) / batch


class RowSummary(NamedTuple):
    """What a driver keeps of one generated row (never its token arrays): a few dozen bytes."""

    key: str
    problem: Any  # the problem's id
    policy: str | None
    correct: bool | None
    takeovers: int
    length: int  # response tokens
    answer_rule: str | None = None  # which rule extracted the answer (None: nothing extracted)

    @classmethod
    def of_trace(cls, trace: Any) -> RowSummary:
        meta = trace.meta
        return cls(trace.key, (meta.get("problem") or {}).get("id"), (meta.get("policy") or {}).get("name"),
                   meta.get("correct"), int(trace.n_takeovers), len(trace), answer_rule_of(meta))

    @classmethod
    def resumed(cls, store: Any, key: str, recheck: Any = None) -> RowSummary | None:
        """A stored row's summary from the store's index alone (its trace file is not read), or None: not
        stored (or a store without an index), or `recheck(index row)` asks for the trace to be read again.
        The one resume rule of every driver (in-process `generate_many`, the executors' `drive`)."""
        row = store.summary(key) if hasattr(store, "summary") else None
        if row is None or (recheck is not None and recheck(row)):
            return None
        return cls.of_index(row)

    @classmethod
    def of_index(cls, row: dict[str, Any]) -> RowSummary:
        """From a store summary row (`TraceStore.summary`, the index): no trace file is read."""
        return cls(row["key"], row.get("problem"), row.get("policy"), row.get("correct"), int(row.get("n_takeovers") or 0),
                   int(row.get("n_tokens") or 0), row.get("answer_rule"))
