"""Dual-model decoding: the base writes, a policy lets the reasoner emit single tokens, both KV caches
advance in lock-step over the shared response (each model behind its own prompt).

`generate` runs a batch of rows (problems x samples); `branch` continues an existing trace from any
position, reusing held caches when it can; `calibrate` fits the takeover gate on base rollouts.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from core.spike_rules import Gate, calibrate_gate
from core.metrics import check_score, chunk_metrics, entropy, score_values, target_metrics
from core.errors import GenerationCancelled, InvalidInputError, PairMismatchError
from core.pair.forward import backbone, head
from core.pair.loading import SIDES, ModelPair
from core.decoding.policies import REASON, BaseOnly, Policy, Step
from core.scoring import DEFAULT_K, assemble, empty_metrics, make_meta, metrics_from_hidden, problem_record
from core.trace import Trace

log = logging.getLogger(__name__)


# -- sampling ---------------------------------------------------------------------------------------


def sample_token(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    """(V,) logits -> one token id: argmax at temperature 0, else nucleus sampling from softmax(logits / T)."""
    if temperature == 0.0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # smallest prefix whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


@dataclass(frozen=True)
class Sampling:
    """Decoding settings recorded in every generated trace."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise InvalidInputError(f"temperature must be ≥ 0, got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidInputError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.max_new_tokens < 1:
            raise InvalidInputError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens!r}")

    def record(self, sample: int = 0) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed, "sample": sample,
                "max_new_tokens": self.max_new_tokens, "stop": list(self.stop)}


# -- held caches, for branching without a re-prefill ---------------------------------------------


@dataclass
class HeldCaches:
    """Both models' caches after a trace, how many response tokens each holds, and each model's final
    hidden states: hidden[side][r] (d,) predicts response token r, for r = 0 .. n_tokens."""

    caches: dict[str, Any]
    prompt_len: dict[str, int]
    n_tokens: int  # response tokens fed into both caches
    hidden: dict[str, torch.Tensor] | None = None  # side -> (n_tokens + 1, d)

    def nbytes(self) -> int:
        tensors = [t for c in self.caches.values() for layer in c.layers for t in (layer.keys, layer.values)]
        tensors += list((self.hidden or {}).values())
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class CacheLRU:
    """Recent traces' KV caches, bounded in bytes. Entries are never mutated: branches crop copies."""

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, HeldCaches] = OrderedDict()

    def put(self, key: str, held: HeldCaches) -> None:
        self._items[key] = held
        self._items.move_to_end(key)
        while self._items and sum(h.nbytes() for h in self._items.values()) > self.max_bytes:
            self._items.popitem(last=False)

    def get(self, key: str | None) -> HeldCaches | None:
        if key is None or key not in self._items:
            return None
        self._items.move_to_end(key)
        return self._items[key]

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()


CACHES = CacheLRU()  # the explicit process-wide cache of recent traces' KV caches


def _cropped_copy(cache: Any, keep: int) -> Any:
    """A new cache holding the first `keep` positions; the original is untouched (crop slices views)."""
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    remove = cache.get_seq_length() - keep
    if remove > 0:
        new.crop(-remove)
    return new


# -- the engine -------------------------------------------------------------------------------------


class _Side:
    """One model's running state over B left-padded rows."""

    def __init__(self, pair: ModelPair, side: str, prompts: list[list[int]], record: int = 0) -> None:
        """Prefill the prompts. With record=n (one row only), keep the final hidden states of the last n
        positions and of every later feed, so that a held trace can be branched without a forward."""
        from transformers import DynamicCache

        self.pair, self.model = pair, pair.model(side)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pair.tokenizer.pad_token_id or 0, dtype=torch.long)
        self.mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
            self.mask[row, width - len(p):] = 1
        self.cache = DynamicCache(config=self.model.config)
        hidden = self._forward(ids)
        self.last_hidden = hidden[:, -1]  # (B, d): predicts response token 0
        self.states = [hidden[:, -record:]] if record else None  # (B, n, d) blocks, see `recorded`
        self.fed = 0  # response tokens read so far

    @classmethod
    def resumed(cls, pair: ModelPair, side: str, cache: Any, states: torch.Tensor, fed: int,
                last_token: int | None = None) -> _Side:
        """A one-row state from a cache holding the prompt and `fed` response tokens and the final hidden
        states (fed + 1, d) that predicted response tokens 0 .. fed: no forward at all. With `last_token`,
        the cache lacks that last response token: it is read (one token) and its hidden state appended."""
        self = cls.__new__(cls)
        self.pair, self.model, self.cache = pair, pair.model(side), cache
        self.mask = torch.ones((1, cache.get_seq_length()), dtype=torch.long)
        self.states = [states.unsqueeze(0)]
        self.last_hidden = states[-1:]
        self.fed = fed - (last_token is not None)
        if last_token is not None:
            self.feed(torch.tensor([[last_token]]))
        return self

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        dev = self.pair.device
        positions = (self.mask.cumsum(-1) - 1).clamp_min(0)[:, -ids.shape[1]:]  # left padding shifts positions
        hidden, self.cache = backbone(self.model, ids.to(dev), cache=self.cache,
                                      attention_mask=self.mask.to(dev), position_ids=positions.to(dev))
        return hidden

    def feed(self, ids: torch.Tensor) -> torch.Tensor:
        """Read response tokens (B, n); returns (B, n, d) hidden states (column j predicts token fed+j+1)."""
        self.mask = torch.cat([self.mask, torch.ones(ids.shape, dtype=torch.long)], dim=1)
        hidden = self._forward(ids)
        self.last_hidden = hidden[:, -1]
        self.fed += ids.shape[1]
        if self.states is not None:
            self.states.append(hidden)
        return hidden

    def recorded(self) -> torch.Tensor | None:
        """(fed + 1, d) final hidden states of row 0, entry r predicting response token r (None if not kept)."""
        if self.states is None:
            return None
        out = torch.cat(self.states, dim=1)[0]
        return out if out.shape[0] == self.fed + 1 else None

    def logits(self) -> torch.Tensor:
        return head(self.model, self.last_hidden, self.pair.vocab_size)  # (B, V)


@dataclass
class _Row:
    problem: dict[str, Any]
    prompt_ids: dict[str, list[int]]
    meta: dict[str, Any]
    seed: int | None  # None: greedy
    tokens: list[int] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    history: list[float] = field(default_factory=list)
    done: bool = False

    def generator(self, t: int) -> torch.Generator | None:
        """Step t's random stream depends only on (seed, sample, t): a branch replays its parent exactly."""
        return None if self.seed is None else torch.Generator().manual_seed(self.seed * 1_000_003 + t)


def _run(pair: ModelPair, rows: list[_Row], policy: Policy, sampling: Sampling, k: int,
         sides: dict[str, _Side] | None = None, start: int = 0,
         progress: Callable[[int, int], None] | None = None,
         should_stop: Callable[[], bool] | None = None) -> tuple[list[dict[str, np.ndarray]], dict[str, _Side]]:
    """Step all rows from response index `start` to completion; returns per-row arrays of the new steps
    (as `metrics_from_hidden` does) and the final model states."""
    n, limit = len(rows), sampling.max_new_tokens
    if sides is None:
        record = 1 if n == 1 else 0  # a single row's hidden states are held for branching
        sides = {side: _Side(pair, side, [r.prompt_ids[side] for r in rows], record) for side in SIDES}
    base, reason = sides["base"], sides["reason"]
    pad = pair.tokenizer.pad_token_id or 0
    steps: dict[int, dict[str, np.ndarray]] = {}  # t -> name -> (B, ...) arrays
    fed_tokens: dict[int, list[int]] = {}  # t -> (B,) tokens emitted at t (pads for finished rows)
    lazy_hidden: dict[str, dict[int, torch.Tensor]] = {s: {} for s in SIDES}  # lazy policy: t -> (B, d)
    taken = np.array([sum(s != "base" for s in r.source) for r in rows], dtype=np.int64)

    def catch_up(upto: int) -> None:
        """Lazy reasoner: read the backlog of tokens in one forward, logging the hidden states it skipped."""
        if reason.fed >= upto:
            return
        first = reason.fed
        lazy_hidden["reason"][first] = reason.last_hidden
        hid = reason.feed(torch.tensor([[fed_tokens[t][i] for t in range(first, upto)] for i in range(n)]))
        for j in range(upto - first - 1):
            lazy_hidden["reason"][first + 1 + j] = hid[:, j]

    t = start
    while t < limit and not all(r.done for r in rows):
        if should_stop is not None and should_stop():
            raise GenerationCancelled("generation cancelled")
        a = base.logits()  # (B, V)
        b = m = None
        if not policy.lazy or reason.fed == t:
            b = reason.logits()
            m = chunk_metrics(a, b, None, k=k)
            score_now = score_values({name: v.cpu().numpy() for name, v in m.items()}, policy.score)
            h_base = m["entropy_base"].cpu().numpy()
        else:
            score_now, h_base = None, entropy(a).cpu().numpy()
        live = np.array([not r.done for r in rows])
        step = Step(t=t, score=score_now, entropy_base=h_base, history=[r.history for r in rows], taken=taken,
                    limit=limit)
        fire = policy.takeover(step) & live
        forced = policy.forced_token(t)
        if b is None and (fire.any() or forced is not None):
            catch_up(t)
            b = reason.logits()
            m = chunk_metrics(a, b, None, k=k)
        chosen = []
        for i, r in enumerate(rows):
            if r.done:
                chosen.append(pad)
                continue
            if forced is not None:
                tok, src = forced, "forced"
            elif fire[i]:
                tok, src = sample_token(b[i], sampling.temperature, sampling.top_p, r.generator(t)), "reason"
            else:
                tok, src = sample_token(a[i], sampling.temperature, sampling.top_p, r.generator(t)), "base"
            if not 0 <= tok < pair.vocab_size:
                raise InvalidInputError(f"Token id {tok} is outside the vocabulary (0..{pair.vocab_size - 1})")
            r.tokens.append(tok)
            r.source.append(src)
            taken[i] += src != "base"
            chosen.append(tok)
        fed_tokens[t] = chosen
        if m is not None:
            y = torch.tensor(chosen, device=a.device)
            steps[t] = {name: v.cpu().numpy() for name, v in {**m, **target_metrics(a, b, y)}.items()}
        else:
            lazy_hidden["base"][t] = base.last_hidden
        gate_values = h_base if policy.lazy else score_values(steps[t], policy.score)
        for i, r in enumerate(rows):
            if live[i]:
                r.history.append(float(gate_values[i]))
        for i, r in enumerate(rows):
            if live[i] and (chosen[i] in pair.eos_ids or _hits_stop(pair, r.tokens, sampling.stop)):
                r.done = True
        t += 1
        if progress is not None:
            progress(t, limit)
        if t >= limit or all(r.done for r in rows):
            break
        ids = torch.tensor(chosen).reshape(n, 1)
        base.feed(ids)
        if not policy.lazy:
            reason.feed(ids)
    if lazy_hidden["base"]:  # fill in the steps the reasoner skipped, in one batched pass
        catch_up(t - 1)
        lazy_hidden["reason"][t - 1] = reason.last_hidden
        _fill_lazy(pair, rows, steps, lazy_hidden, fed_tokens, k)
    out = []
    for i, r in enumerate(rows):
        ts = range(start, len(r.tokens))
        out.append({name: np.stack([steps[t][name][i] for t in ts]) if len(ts) else empty_metrics(k)[name]
                    for name in empty_metrics(k)})
    return out, sides


def _fill_lazy(pair: ModelPair, rows: list[_Row], steps: dict, lazy_hidden: dict, fed_tokens: dict, k: int) -> None:
    """Metrics of the steps where only the base ran, from both models' logged hidden states."""
    missing = sorted(lazy_hidden["base"])
    hidden = {s: torch.stack([lazy_hidden[s][t] for t in missing], dim=1) for s in SIDES}  # (B, M, d)
    for t in missing:
        steps[t] = {}
    for i in range(len(rows)):
        ys = torch.tensor([fed_tokens[t][i] for t in missing])
        arrays = metrics_from_hidden(pair, {s: hidden[s][i] for s in SIDES}, ys, k=k)
        for j, t in enumerate(missing):
            for name, v in arrays.items():
                steps[t].setdefault(name, np.zeros((len(rows),) + v.shape[1:], dtype=v.dtype))[i] = v[j]


def _hits_stop(pair: ModelPair, tokens: list[int], stop: Sequence[str]) -> bool:
    if not stop:
        return False
    tail = pair.decode(tokens[-(max(len(s) for s in stop) + 8):])
    return any(s in tail for s in stop)


# -- public API -------------------------------------------------------------------------------------


def _rows(pair: ModelPair, problems: list[Any], samples: int, policy: Policy, sampling: Sampling, k: int,
          kind: str = "generate", extra_request: dict[str, Any] | None = None, first_sample: int = 0) -> list[_Row]:
    rows = []
    for problem in problems:
        rec = problem_record(problem)
        prompt_ids = pair.prompt_ids(rec["prompt"])
        for s in range(first_sample, first_sample + samples):
            request = {"kind": kind, "pair": pair.fingerprint(), "prompt": rec["prompt"], "policy": policy.record(),
                       "sampling": sampling.record(s), "k": k, **(extra_request or {})}
            meta = make_meta(pair, kind=kind, request=request, problem=rec, policy=policy.record(),
                             sampling=sampling.record(s))
            seed = int(sampling.seed) * 1009 + s if sampling.temperature > 0 else None
            rows.append(_Row(rec, prompt_ids, meta, seed))
    return rows


def generate(pair: ModelPair, prompt: Any | Sequence[Any], policy: Policy | None = None, *,
             max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
             stop: Sequence[str] = (), samples: int = 1, k: int = DEFAULT_K, store: Any = None,
             progress: Callable[[int, int], None] | None = None,
             should_stop: Callable[[], bool] | None = None) -> Trace | list[Trace]:
    """Generate with the base model, letting `policy` hand single tokens to the reasoner.

    `prompt` is one problem (text, dict or Problem) -> one Trace, or a list -> a list of Traces
    (problem-major, `samples` rows each, all decoded in one batch). Metrics come from the distributions
    the engine computes anyway. With `store`, stored rows are returned without recomputation.
    """
    policy = policy or BaseOnly()
    sampling = Sampling(temperature, top_p, seed, max_new_tokens, tuple(stop))
    single = isinstance(prompt, (str, dict)) or hasattr(prompt, "prompt")
    problems = [prompt] if single else list(prompt)
    if samples < 1:
        raise InvalidInputError(f"samples must be ≥ 1, got {samples}")
    rows = _rows(pair, problems, samples, policy, sampling, k)
    traces: list[Trace | None] = [None] * len(rows)
    todo = []
    for i, r in enumerate(rows):
        if store is not None and r.meta["key"] in store:
            traces[i] = store.get(r.meta["key"])
        else:
            todo.append(i)
    if todo:
        t0 = time.perf_counter()
        batch = [rows[i] for i in todo]
        arrays, sides = _run(pair, batch, policy, sampling, k, progress=progress, should_stop=should_stop)
        elapsed = time.perf_counter() - t0
        for j, (i, r) in enumerate(zip(todo, batch)):
            r.meta["timings"] = {"generate_s": round(elapsed, 4), "batch": len(batch)}
            trace = assemble(pair, r.tokens, r.prompt_ids, arrays[j], r.source, r.meta)
            if len(batch) == 1:
                _hold(trace, sides)
            if store is not None:
                store.put(trace)
            traces[i] = trace
    return traces[0] if single and samples == 1 else traces  # type: ignore[return-value]


def _hold(trace: Trace, sides: dict[str, _Side]) -> None:
    """Keep a finished single-row run's caches for later branches."""
    if trace.key is None or len(trace) == 0:
        return
    fed = sides["base"].fed
    if sides["reason"].fed != fed:
        return
    prompt_len = {s: sides[s].cache.get_seq_length() - fed for s in SIDES}
    hidden = {s: sides[s].recorded() for s in SIDES}
    CACHES.put(trace.key, HeldCaches({s: sides[s].cache for s in SIDES}, prompt_len, fed,
                                     hidden if all(h is not None for h in hidden.values()) else None))


def branch(pair: ModelPair, trace: Trace, pos: int, token: int | None = None, policy: Policy | None = None, *,
           max_new_tokens: int | None = None, store: Any = None,
           progress: Callable[[int, int], None] | None = None,
           should_stop: Callable[[], bool] | None = None) -> Trace:
    """Keep `trace`'s first `pos` tokens, emit at `pos` the reasoner's choice (or `token`), continue with
    `policy` (BaseOnly by default) under the parent's sampling settings. Records parent and pos."""
    policy = policy or BaseOnly()
    if (trace.meta.get("request") or {}).get("pair") not in (None, pair.fingerprint()):
        raise PairMismatchError("This trace was made with a different model pair or prompt formats; "
                                "load the pair it records in meta['pair'] to branch it")
    if not isinstance(pos, (int, np.integer)) or not 0 <= pos <= len(trace):
        raise InvalidInputError(f"Branch position {pos!r} is outside the trace (0..{len(trace)})")
    if token is not None and not 0 <= int(token) < pair.vocab_size:
        raise InvalidInputError(f"Token id {token} is outside the vocabulary (0..{pair.vocab_size - 1})")
    parent_sampling = trace.meta.get("sampling") or {}
    sampling = Sampling(
        temperature=parent_sampling.get("temperature", 0.0), top_p=parent_sampling.get("top_p", 1.0),
        seed=parent_sampling.get("seed", 0),
        max_new_tokens=max_new_tokens or parent_sampling.get("max_new_tokens") or len(trace) + 256,
        stop=tuple(parent_sampling.get("stop", ())),
    )
    if pos >= sampling.max_new_tokens:
        raise InvalidInputError(f"Branch position {pos} is at or past max_new_tokens={sampling.max_new_tokens}")
    plan = _BranchPolicy(policy, pos, token)
    extra = {"parent": trace.key, "branch_pos": int(pos), "token": None if token is None else int(token)}
    rows = _rows(pair, [trace.meta.get("problem") or {"prompt": ""}], 1, plan, sampling, trace.k or DEFAULT_K,
                 kind="branch", extra_request=extra, first_sample=int(parent_sampling.get("sample", 0)))
    row = rows[0]
    row.meta.update(parent=trace.key, branch_pos=int(pos), policy=plan.record())
    if store is not None and row.meta["key"] in store:
        return store.get(row.meta["key"])
    if row.prompt_ids != trace.prompt_ids:
        raise PairMismatchError("The pair formats this problem differently from the trace's recorded prompt")
    prefix_ids = [int(x) for x in trace.token_ids[:pos]]
    row.tokens, row.source = list(prefix_ids), [str(x) for x in trace.source[:pos]]
    # the gate's running mean looks back over the shared prefix, exactly as if the child had written it
    gate_values = trace.metrics["entropy_base"] if plan.lazy else score_values(trace.metrics, plan.score)
    row.history = [float(x) for x in np.asarray(gate_values)[:pos]]
    t0 = time.perf_counter()
    sides = _resume(pair, trace, row, prefix_ids)
    k = trace.k or DEFAULT_K
    arrays, sides = _run(pair, [row], plan, sampling, k, sides=sides, start=pos, progress=progress,
                         should_stop=should_stop)
    row.meta["timings"] = {"generate_s": round(time.perf_counter() - t0, 4), "batch": 1}
    prefix = _prefix_arrays(trace, pos)
    child = assemble(pair, row.tokens, row.prompt_ids, {n: np.concatenate([prefix[n], v]) for n, v in arrays[0].items()},
                     row.source, row.meta)
    _hold(child, sides)
    if store is not None:
        store.put(child)
    return child


def _prefix_arrays(trace: Trace, pos: int) -> dict[str, np.ndarray]:
    out = {name: np.asarray(v)[:pos] for name, v in trace.metrics.items()}
    for side in SIDES:
        out[f"topk_{side}_ids"] = trace.topk[side][0][:pos]
        out[f"topk_{side}_probs"] = trace.topk[side][1][:pos]
    return out


def _resume(pair: ModelPair, trace: Trace, row: _Row, prefix_ids: list[int]) -> dict[str, _Side]:
    """Model states that have read the prompt and `prefix_ids`: cropped held caches, or one prefill each."""
    held = CACHES.get(trace.key)
    pos = len(prefix_ids)
    sides = {}
    for side in SIDES:
        p = len(row.prompt_ids[side])
        hidden = held.hidden[side] if held is not None and held.hidden is not None else None
        if hidden is not None and held.prompt_len[side] == p and pos <= held.n_tokens:
            # the cache holds prompt + prefix, and the parent's hidden state at pos predicts token pos
            cache = _cropped_copy(held.caches[side], p + pos)
            sides[side] = _Side.resumed(pair, side, cache, hidden[: pos + 1], pos)
        elif hidden is not None and held.prompt_len[side] == p and pos == held.n_tokens + 1:
            # the parent's last token was never fed: read it (one token per model)
            cache = _cropped_copy(held.caches[side], p + pos - 1)
            sides[side] = _Side.resumed(pair, side, cache, hidden, pos, last_token=prefix_ids[-1])
        else:
            # one prefill of prompt + prefix, keeping the hidden states of the prefix for later branches
            state = _Side(pair, side, [row.prompt_ids[side] + prefix_ids], record=pos + 1)
            state.fed = pos
            sides[side] = state
    return sides


@dataclass
class _BranchPolicy(Policy):
    """Emit the given token (or the reasoner's choice) at `pos`, then defer to `then`."""

    then: Policy = field(default_factory=BaseOnly)
    pos: int = 0
    token: int | None = None
    name = "branch"

    def __post_init__(self) -> None:
        self.score = self.then.score
        self.lazy = self.then.lazy  # type: ignore[misc]

    def record(self) -> dict[str, Any]:
        return {"name": self.then.name, "params": self.then.record()["params"],
                "branch": {"pos": self.pos, "token": self.token if self.token is not None else REASON}}

    def takeover(self, step: Step) -> np.ndarray:
        if step.t == self.pos:
            return np.full(len(step.taken), self.token is None)
        return self.then.takeover(step)

    def forced_token(self, t: int) -> int | None:
        return self.token if t == self.pos else self.then.forced_token(t)


def calibrate(pair: ModelPair, prompts: Sequence[Any], ratio: float = 0.05, *, window: int = 16,
              score: str = "cross_entropy", max_new_tokens: int = 256, temperature: float = 0.0,
              seed: int = 0, batch_size: int = 8, store: Any = None,
              progress: Callable[[int, int], None] | None = None) -> Gate:
    """Fit the Guided gate (tau, lam, window) on base rollouts of `prompts` (see REFERENCE.md)."""
    check_score(score)
    if not prompts:
        raise InvalidInputError("calibrate needs at least one prompt")
    scores = []
    for start in range(0, len(prompts), batch_size):
        traces = generate(pair, list(prompts[start:start + batch_size]), BaseOnly(), max_new_tokens=max_new_tokens,
                          temperature=temperature, seed=seed, store=store)
        scores += [score_values(t.metrics, score) for t in traces]
        if progress is not None:
            progress(min(start + batch_size, len(prompts)), len(prompts))
    return calibrate_gate(scores, ratio, window)


