"""Comparing reasoners: one response scored against two or more reasoners that share the base.

`compare(pairs, prompt, response)` scores the same tokens under each pair (the pairs share the base model,
its prompt format and the vocabulary; `with_reasoner` loads another reasoner onto a loaded pair without a
second copy of the base). The base runs once per item; each reasoner once. The result is a `Comparison`:
one `Trace` per reasoner, aligned token by token (the same token ids), with per-token tables for stacked
heatmap rows and each reasoner's top-k. `dataset_tables` compares Gini, position density, enrichment and
the shifted ratio of many traces per reasoner side by side.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from core import settings
from core.analysis import tables as A
from core.annotate.rank_shift import rank_shift, shifted_ratio
from core.errors import ForkpointError, InvalidInputError, PairMismatchError
from core.pair.loading import (
    ModelPair,
    PromptFormat,
    check_same_vocabulary,
    format_spec,
    load_one,
    load_tokenizer,
)
from core.record.assembly import assemble
from core.record.meta import make_meta
from core.record.problems import problem_record
from core.record.request import request
from core.scoring.registry import DEFAULT_SCORE, check_score, score_values
from core.scoring.teacher_forced import (
    _batch_hidden,
    _check_length,
    _response_ids,
    metrics_from_hidden,
)
from core.trace import Trace

log = logging.getLogger(__name__)


def reasoner_name(pair_or_trace: Any) -> str:
    """A reasoner's display name: its model id (last path part) from a pair or a trace's meta."""
    if isinstance(pair_or_trace, Trace):
        spec = ((pair_or_trace.meta.get("pair") or {}).get("reason") or {})
        ident = str(spec.get("id") or "?")
    else:
        ident = str(pair_or_trace.specs["reason"].id)
    return ident.rstrip("/").split("/")[-1] or ident


def with_reasoner(pair: ModelPair, reason: str | ModelPair, *, revision: str | None = None,
                  reason_format: str | None = None, trust_remote_code: bool = False) -> ModelPair:
    """`pair`'s base (the same resident model) with another reasoner: a hub id / local dir / .gguf, or the
    reasoner of another loaded pair. The new reasoner must share the base's vocabulary."""

    if isinstance(reason, ModelPair):
        model, tok, spec = reason.reason, reason.prompt_tokenizers.get("reason", reason.tokenizer), reason.specs["reason"]
        fmt = reason.formats["reason"] if reason_format is None else PromptFormat(format_spec(reason_format))
    else:
        tok = load_tokenizer(str(reason), revision, trust_remote_code)
        check_same_vocabulary(pair.tokenizer, tok)  # before the weights load (seconds, not minutes)
        model, tok, spec = load_one(str(reason), revision, pair.device, pair.dtype, trust_remote_code, tokenizer=tok)
        if reason_format is None:
            reason_format = "chat" if getattr(tok, "chat_template", None) else pair.formats["base"].spec
        fmt = PromptFormat(format_spec(reason_format))
    notes = check_same_vocabulary(pair.tokenizer, tok)
    rows = model.get_output_embeddings().weight.shape[0]
    if rows < pair.vocab_size:
        raise PairMismatchError(f"Reasoner {spec.id!r} has {rows} output rows; the pair's vocabulary has {pair.vocab_size}")
    return dataclasses.replace(
        pair, reason=model, specs={**pair.specs, "reason": spec}, formats={**pair.formats, "reason": fmt},
        vocab_notes=list(notes), prompt_tokenizers={**pair.prompt_tokenizers, "reason": tok},
    )


def _check_shared_base(pairs: Sequence[ModelPair]) -> None:
    if len(pairs) < 1:
        raise InvalidInputError("compare needs at least one pair (two or more to compare reasoners)")
    first = pairs[0]
    for i, pair in enumerate(pairs[1:], start=1):
        if pair.specs["base"].as_dict() != first.specs["base"].as_dict():
            raise PairMismatchError(f"Pair {i} has base {pair.specs['base'].id!r}, pair 0 has {first.specs['base'].id!r}; "
                                    "compared reasoners must share the base model (see with_reasoner)")
        if pair.formats["base"].spec != first.formats["base"].spec:
            raise PairMismatchError(f"Pair {i} formats the base prompt as {pair.formats['base'].spec!r}, pair 0 as "
                                    f"{first.formats['base'].spec!r}; compared pairs must format the base alike")
        check_same_vocabulary(first.tokenizer, pair.tokenizer, ("pair 0", f"pair {i}"))


@dataclass
class Comparison:
    """One response scored against several reasoners: `traces[i]` is reasoner `names[i]`'s trace; all share
    the token ids and the base-side metrics."""

    traces: list[Trace]
    names: list[str]

    def __post_init__(self) -> None:
        if len(self.traces) != len(self.names) or not self.traces:
            raise InvalidInputError(f"{len(self.traces)} traces for {len(self.names)} names")
        ids = self.traces[0].token_ids
        for name, trace in zip(self.names, self.traces):
            if not np.array_equal(trace.token_ids, ids):
                raise InvalidInputError(f"Trace of reasoner {name!r} has other tokens than {self.names[0]!r}'s")

    def __len__(self) -> int:
        return len(self.traces[0])

    @property
    def tokens(self) -> list[str]:
        return list(self.traces[0].tokens)

    def trace(self, name: str) -> Trace:
        """The trace of reasoner `name`."""
        if name not in self.names:
            raise InvalidInputError(f"No reasoner {name!r} in this comparison; choose one of: {', '.join(self.names)}")
        return self.traces[self.names.index(name)]

    def value_range(self, score: str = DEFAULT_SCORE) -> tuple[float | None, float | None]:
        """One finite (min, max) of `score` over every reasoner: stacked rows share one colour scale."""
        vals = np.concatenate([np.asarray(score_values(t.metrics, check_score(score)), dtype=np.float64)
                               for t in self.traces])
        vals = vals[np.isfinite(vals)]
        return (float(vals.min()), float(vals.max())) if vals.size else (None, None)

    def frame(self, score: str = DEFAULT_SCORE) -> pd.DataFrame:
        """One row per token: pos, token, and per reasoner `<name>` (the score), `<name> top` (its top token
        id), `<name> rank_shift` (category)."""

        check_score(score)
        out = pd.DataFrame({"pos": np.arange(len(self)), "token": self.tokens})
        for name, trace in zip(self.names, self.traces):
            out[name] = np.asarray(score_values(trace.metrics, score), dtype=np.float64)
            out[f"{name} top"] = np.asarray(trace.topk["reason"][0])[:, 0] if len(trace) else []
            out[f"{name} rank_shift"] = rank_shift(trace)
        return out

    def topk_table(self, pos: int, decode: Callable[[int], str] | None = None, k: int | None = None) -> pd.DataFrame:
        """At token `pos`: one row per rank with the base's top-k and each reasoner's (token, p) side by side."""
        if not 0 <= pos < len(self):
            raise InvalidInputError(f"Position {pos} is outside the response (0..{len(self) - 1})")
        show = decode or (lambda i: f"#{i}")
        k = self.traces[0].k if k is None else min(k, self.traces[0].k)
        ids, probs = self.traces[0].topk["base"]
        table: dict[str, Any] = {"rank": np.arange(1, k + 1),
                                 "base": [show(int(i)) for i in ids[pos][:k]], "base p": probs[pos][:k].astype(float)}
        for name, trace in zip(self.names, self.traces):
            ids, probs = trace.topk["reason"]
            table[name] = [show(int(i)) for i in ids[pos][:k]]
            table[f"{name} p"] = probs[pos][:k].astype(float)
        return pd.DataFrame(table)


def compare_batch(pairs: Sequence[ModelPair], items: Sequence[tuple[Any, Any]], *, names: Sequence[str] | None = None,
                  k: int = settings.K, store: Any = None) -> list[Comparison]:
    """Score each (prompt, response) under every pair (pairs share the base: it runs once per item)."""

    pairs = list(pairs)
    _check_shared_base(pairs)
    if names is None:  # model ids' last parts; made distinct when two share one ("model" in two folders)
        names = [reasoner_name(p) for p in pairs]
        names = [n if names.count(n) == 1 else f"{n} ({i})" for i, n in enumerate(names)]
    names = [str(n) for n in names]
    if len(names) != len(pairs) or len(set(names)) != len(names):
        raise InvalidInputError(f"names must be {len(pairs)} distinct labels, one per pair; got {names}")
    out = []
    for prompt, response in items:
        problem = problem_record(prompt)
        ids = _response_ids(pairs[0], response)
        targets = torch.tensor(ids, dtype=torch.long, device=pairs[0].device)
        base_hidden = None
        traces = []
        for pair in pairs:
            prompt_ids = pair.prompt_ids(problem["prompt"])
            _check_length(pair, prompt_ids, len(ids))
            meta = make_meta(pair, kind="score", problem=problem, request=request(
                "score", pair.fingerprint(), prompt=problem["prompt"], response_ids=ids, k=k))
            if store is not None and meta["key"] in store:
                traces.append(store.get(meta["key"]))
                continue
            t0 = time.perf_counter()
            job = [(ids, prompt_ids, meta)]
            if base_hidden is None:
                base_hidden = _batch_hidden(pair, "base", job)[0]
            hidden = {"base": base_hidden, "reason": _batch_hidden(pair, "reason", job)[0]}
            arrays = metrics_from_hidden(pair, hidden, targets, k)
            meta["timings"] = {"score_s": round(time.perf_counter() - t0, 4)}
            meta["comparison"] = {"reasoners": names}
            trace = assemble(pair, ids, prompt_ids, arrays, ["base"] * len(ids), meta)
            if store is not None:
                store.put(trace)
            traces.append(trace)
        out.append(Comparison(traces, list(names)))
    return out


def compare(pairs: Sequence[ModelPair], prompt: Any, response: Any, *, names: Sequence[str] | None = None,
            k: int = settings.K, store: Any = None) -> Comparison:
    """Score `response` (text or token ids) for `prompt` against each pair's reasoner (the pairs share the base;
    build them with `with_reasoner`). Returns a `Comparison` of aligned traces, one per reasoner."""
    return compare_batch(pairs, [(prompt, response)], names=names, k=k, store=store)[0]


def group_by_reasoner(traces: Sequence[Trace]) -> dict[str, list[Trace]]:
    """Traces grouped by their reasoner's name (from meta), in first-seen order."""
    groups: dict[str, list[Trace]] = {}
    for trace in traces:
        groups.setdefault(reasoner_name(trace), []).append(trace)
    return groups


def dataset_tables(groups: Mapping[str, Sequence[Trace]], score: str = DEFAULT_SCORE,
                   top: float = settings.SPIKE_TOP, bins: int = 20) -> dict[str, pd.DataFrame]:
    """Side-by-side analysis per reasoner: "summary" (one row each: traces, tokens, pooled Gini, median spike
    position, shifted ratio), "position_density" and "enrichment" (each with a `reasoner` column)."""

    check_score(score)
    summary, density, enrich = [], [], []
    for name, traces in groups.items():
        traces = list(traces)
        if not traces:
            continue
        gini = A.gini_table(traces, score)
        dens = A.position_density(traces, score, top=top, bins=bins)
        summary.append({"reasoner": name, "traces": len(traces), "tokens": sum(len(t) for t in traces),
                        "gini": float(gini.loc[gini["trace"] == A.POOLED, "gini"].iloc[0]), "median_u": dens.attrs["median_u"],
                        "shifted_ratio": shifted_ratio(traces)})
        density.append(dens.assign(reasoner=name))
        try:
            enrich.append(A.enrichment(traces, score, top=top).assign(reasoner=name))
        except (ForkpointError, ImportError, OSError) as exc:
            log.warning("enrichment for %s skipped: %s", name, exc)
    return {
        "summary": pd.DataFrame(summary, columns=["reasoner", "traces", "tokens", "gini", "median_u", "shifted_ratio"]),
        "position_density": pd.concat(density, ignore_index=True) if density else pd.DataFrame(),
        "enrichment": pd.concat(enrich, ignore_index=True) if enrich else pd.DataFrame(),
    }
