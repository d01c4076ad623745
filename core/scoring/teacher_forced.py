"""Teacher-forced scoring: one forward per model over (own prompt + shared response) -> `Trace`.

Memory-bounded: the output head runs on chunks of positions, so no (T, V) float32 block of both
models exists at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from core import settings
from core.errors import InvalidInputError
from core.pair.forward import backbone
from core.pair.loading import SIDES, ModelPair
from core.pair.placement import to_host
from core.record.assembly import assemble  # noqa: F401  (assemble, make_meta, problem_record, versions: old home)
from core.record.meta import make_meta, versions  # noqa: F401
from core.record.problems import problem_record
from core.record.request import request
from core.scoring.metrics import chunk_metrics
from core.scoring.registry import INT_METRICS, METRICS
from core.trace import Trace

log = logging.getLogger(__name__)

DEFAULT_K = settings.K
DEFAULT_CHUNK = 256  # positions per head + metrics chunk: bounds the (C, V) float32 logits held at once


def _response_ids(pair: ModelPair, response: str | Sequence[int]) -> list[int]:
    if isinstance(response, str):
        try:
            response.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInputError(f"The response holds a lone surrogate at character {exc.start}; not valid text") from None
        return pair.encode(response)
    if not isinstance(response, (list, tuple, np.ndarray)) or not all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in response):
        raise InvalidInputError(f"response must be text or a list of token ids, got {type(response).__name__}: "
                                f"{str(response)[:80]!r}")
    ids = [int(i) for i in response]
    bad = [i for i in ids if not 0 <= i < pair.vocab_size]
    if bad:
        raise InvalidInputError(f"Token id {bad[0]} is outside the vocabulary (0..{pair.vocab_size - 1})")
    return ids


def _check_length(pair: ModelPair, prompt_ids: dict[str, list[int]], n: int) -> None:
    for side in SIDES:
        limit = pair.context_length(side)
        total = len(prompt_ids[side]) + n
        if limit is not None and total > limit:
            raise InvalidInputError(
                f"Prompt ({len(prompt_ids[side])} tokens) + response ({n} tokens) = {total} exceeds the "
                f"{side} model's context of {limit} tokens"
            )
    for side in SIDES:
        if not prompt_ids[side]:
            raise InvalidInputError(f"The {side} prompt is empty after formatting; nothing to condition on")


def metrics_from_hidden(pair: ModelPair, hidden: dict[str, torch.Tensor], targets: torch.Tensor | None,
                        k: int = DEFAULT_K, chunk: int = DEFAULT_CHUNK,
                        logits: dict[str, torch.Tensor] | None = None) -> dict[str, np.ndarray]:
    """Per-position metrics from each model's (T, d) hidden states, the head applied chunk by chunk; a side
    in `logits` gives its (T, V) logits instead (e.g. those decoding drew its tokens from)."""
    logits = logits or {}
    n = (logits["base"] if "base" in logits else hidden["base"]).shape[0]
    heads = {side: pair.runner(side)[0] for side in SIDES if side not in logits}
    parts: list[dict[str, torch.Tensor]] = []
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        block = {side: logits[side][start:stop] if side in logits else
                 heads[side](hidden[side][start:stop], pair.vocab_size) for side in SIDES}
        parts.append(chunk_metrics(block["base"], block["reason"],
                                   None if targets is None else targets[start:stop], k=k))
        del block
    if not parts:
        return empty_metrics(k)
    if len(parts) == 1:  # one chunk (most responses): its tensors are this call's own, no concatenated copy
        return to_host(parts[0])
    return to_host({name: torch.cat([p[name] for p in parts]) for name in parts[0]})


def empty_metrics(k: int) -> dict[str, np.ndarray]:
    out = {name: np.zeros(0, dtype=np.int64 if name in INT_METRICS else np.float32) for name in METRICS}
    for side in SIDES:
        out[f"topk_{side}_ids"] = np.zeros((0, k), dtype=np.int64)
        out[f"topk_{side}_probs"] = np.zeros((0, k), dtype=np.float32)
    return out


def score(pair: ModelPair, prompt: Any, response: str | Sequence[int], *, k: int = DEFAULT_K,
          chunk: int = DEFAULT_CHUNK, store: Any = None) -> Trace:
    """Score `response` (text or token ids) under both models, each conditioned on its own prompt.

    An empty response gives an empty trace (0 rows). With `store`, a cached trace is returned as is
    and a new one is saved.
    """
    return score_batch(pair, [(prompt, response)], k=k, chunk=chunk, store=store)[0]


def score_batch(pair: ModelPair, items: Sequence[tuple[Any, str | Sequence[int]]], *, k: int = DEFAULT_K,
                chunk: int = DEFAULT_CHUNK, batch_size: int = settings.BATCH_SIZE, store: Any = None,
                progress: Any = None) -> list[Trace]:
    """Score many (prompt, response) pairs, `batch_size` sequences per forward (right-padded).

    Gives the same numbers as one at a time (up to float rounding). `progress(done, total)` is called
    after each batch.
    """
    settings.SETTINGS["k"].check(k, "k")
    for name, value in (("chunk", chunk), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"{name} must be a whole number ≥ 1, got {value!r}")
    jobs = []
    for prompt, response in items:
        problem = problem_record(prompt)
        ids = _response_ids(pair, response)
        prompt_ids = pair.prompt_ids(problem["prompt"])
        _check_length(pair, prompt_ids, len(ids))
        meta = make_meta(pair, kind="score", problem=problem, request=request(
            "score", pair.fingerprint(), prompt=problem["prompt"], response_ids=ids, k=k))
        jobs.append((ids, prompt_ids, meta))
    results: list[Trace | None] = [None] * len(jobs)
    todo = []
    for i, (_, _, meta) in enumerate(jobs):
        if store is not None and meta["key"] in store:
            results[i] = store.get(meta["key"])
        else:
            todo.append(i)
    # similar lengths batch together: less padding
    todo.sort(key=lambda i: len(jobs[i][0]) + max(len(p) for p in jobs[i][1].values()))
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        t0 = time.perf_counter()
        hidden = {side: _batch_hidden(pair, side, [jobs[i] for i in batch]) for side in SIDES}
        shared = (time.perf_counter() - t0) / len(batch)  # each row's share of the batched forwards
        for row, i in enumerate(batch):
            ids, prompt_ids, meta = jobs[i]
            t1 = time.perf_counter()
            arrays = metrics_from_hidden(pair, {side: hidden[side][row] for side in SIDES},
                                         torch.tensor(ids, dtype=torch.long, device=pair.device), k, chunk)
            meta["timings"] = {"score_s": round(shared + time.perf_counter() - t1, 4)}
            trace = assemble(pair, ids, prompt_ids, arrays, ["base"] * len(ids), meta)
            if store is not None:
                store.put(trace)
            results[i] = trace
        if progress is not None:
            progress(min(start + batch_size, len(todo)), len(todo))
    return results  # type: ignore[return-value]


def _batch_hidden(pair: ModelPair, side: str, jobs: list) -> list[torch.Tensor]:
    """Hidden states predicting each response token: for each job a (T, d) tensor (positions P-1 .. P+T-2)."""
    model = pair.model(side)
    seqs = [job[1][side] + job[0] for job in jobs]
    width = max(len(s) for s in seqs)
    pad = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else 0
    # Right padding: a causal model's earlier positions never see the pads, so no mask is needed.
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    hidden, _ = backbone(model, ids.to(pair.device), decoder=pair.runner(side)[1])
    out = []
    for row, job in enumerate(jobs):
        p, t = len(job[1][side]), len(job[0])
        out.append(hidden[row, p - 1 : p - 1 + t])
    return out
