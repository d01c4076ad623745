"""The decoding loop: the base writes, a policy lets the reasoner emit single tokens; each model keeps its
own KV cache behind its own prompt.

Verify-ahead: the base's tokens do not depend on the reasoner until a takeover, so the base drafts a
block of up to n tokens and the reasoner reads the whole block in one forward (as a speculative
decoder's verifier does). The policy then sees each position of the block in order, with exactly the
`Step` it would see in lock-step; at the first position where the emitted token differs from the draft
both caches are cropped back to it and the next block starts there. Draws are keyed by position, so the
output is the lock-step output (up to float rounding, see `BlockSizer`). n adapts to the recent rate of
such changes, and a block also ends at a draft the base is unsure of where that is where changes fall
(`lookahead=1` is lock-step). Lazy policies (gating on base entropy alone) draft until they fire and let the reasoner
catch up only then; their metrics are filled from logged hidden states in batched passes.

Rows may join late: a row whose known tokens reach past the current position replays them (its own
tokens, sources and gate values, as a parent's prefix) and is decided by the policy only from its first
unknown position on, so children that leave one parent at different positions share one batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from core.decoding.block_sizing import SIZERS
from core.decoding.policies import BaseOnly, Policy, Step
from core.decoding.token_record import TokenRecord
from core.decoding.sampling import Sampling, position_generator, sample_token
from core.decoding.state import ModelState
from core.errors import GenerationCancelled, InvalidInputError
from core.settings import Progress
from core.pair.loading import SIDES, ModelPair
from core.pair.placement import to_host
from core.scoring.metrics import (
    EMITTED,
    LogProbs,
    emitted_metrics,
    entropy_and_top2,
    top_probability,
    step_metrics,
)
from core.scoring.registry import score_values
from core.scoring.teacher_forced import empty_metrics, metrics_from_hidden

LOGIT_BYTES = 512 << 20  # on a CPU: at most this many bytes of logits and log-probs (both models) per block
LAZY_FLUSH = 512  # lazy policies: fill metrics at least every this many positions
DEFERRED_BYTES = 128 << 20  # lazy policies: ... and at least every this many bytes of kept base logits (CPU)
CARD_SHARE = 1 / 32  # on CUDA both bounds are this share of the card's memory (the deferred one a quarter of it)


def logit_budget(device: torch.device) -> tuple[int, int]:
    """(bytes of a verify-ahead block's logits, bytes of a lazy run's kept logits) on `device`. On a CUDA card a
    share of its total memory: at batch 32 and a 151,936-token vocabulary the CPU's bounds allow blocks of 3
    positions and a flush every 6 (an H200 run, benchmarks/RESULTS.md). Total, not free, memory: block sizes,
    and so bf16 rounding, must not change with what else the card holds."""
    if device.type != "cuda":
        return LOGIT_BYTES, DEFERRED_BYTES
    total = torch.cuda.get_device_properties(device).total_memory
    return max(LOGIT_BYTES, int(CARD_SHARE * total)), max(DEFERRED_BYTES, int(CARD_SHARE * total / 4))


@dataclass
class Row:
    """One response being decoded: its problem, prompts, meta, seed (None: greedy) and what it has so far."""

    problem: dict[str, Any]
    prompt_ids: dict[str, list[int]]
    meta: dict[str, Any]
    seed: int | None
    tokens: list[int] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    history: list[float] = field(default_factory=list)  # the gate's value at each earlier position
    done: bool = False
    room: int | None = None  # most response tokens that fit both models' contexts (None: no limit known)
    identity: int = 0  # `row_identity` of its prompt and sample: keys per-row policy draws


def check_lookahead(lookahead: int | None) -> int | None:
    """None (adaptive) or an int ≥ 1, else raise."""
    if lookahead is not None and (isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 1):
        raise InvalidInputError(f"lookahead must be None (adaptive) or an integer ≥ 1 (1 = lock-step), got {lookahead!r}")
    return lookahead


class Decoder:
    """Decodes B rows from response position `start` to completion (see the module docstring)."""

    def __init__(self, pair: ModelPair, rows: list[Row], policy: Policy, sampling: Sampling, k: int, *,
                 lookahead: int | None = None, states: dict[str, ModelState] | None = None, start: int = 0,
                 progress: Progress | None = None,
                 should_stop: Callable[[], bool] | None = None,
                 on_token: Callable[[int, int, str], None] | None = None) -> None:
        policy.check_pair(pair)  # e.g. a router made for another pair
        self.on_token = on_token if len(rows) == 1 else None  # streaming: (pos, token id, source) of a single row
        self.pair, self.rows, self.policy, self.sampling, self.k = pair, rows, policy, sampling, k
        if states is None:
            record = 1 if len(rows) == 1 else 0  # a single row's hidden states are held for branching
            states = {s: ModelState(pair, s, [r.prompt_ids[s] for r in rows], record) for s in SIDES}
        self.states, self.base, self.reason = states, states["base"], states["reason"]
        self.t = self.start = start
        self.limit = sampling.max_new_tokens
        self.pad = pair.tokenizer.pad_token_id or 0
        self.lookahead = check_lookahead(lookahead)
        self.progress, self.should_stop = progress, should_stop
        self.taken = np.array([sum(s == "reason" for s in r.source[:start]) for r in rows], dtype=np.int64)
        self.identities = np.array([r.identity for r in rows], dtype=np.uint64)
        self.record = TokenRecord(len(rows), start)
        self.fed = np.zeros((len(rows), 64), dtype=np.int64)  # emitted ids (pads for finished rows), column p - start
        self.sizer = SIZERS.start(pair, policy, len(rows), timed=torch.device(pair.device).type == "cpu")  # GPUs: see BlockSizer
        # lazy: p -> the base's (B, V) logits its token was drawn from (kept: no second head pass), and the
        # reasoner's (B, d) hidden states; flushed every LAZY_FLUSH positions or `logit_budget`'s bytes of logits
        self.deferred: dict[str, dict[int, torch.Tensor]] = {s: {} for s in SIDES}
        self.logit_bytes, deferred_bytes = logit_budget(torch.device(pair.device))
        self.flush_every = max(1, min(LAZY_FLUSH, deferred_bytes // (4 * len(rows) * pair.vocab_size)))
        # BaseOnly reads nothing of a step (no gate, no forced token): with an adaptive lookahead the reasoner
        # need not follow the base at all, so it reads the response once, after the run (or every LAZY_FLUSH
        # positions), as a teacher-forced pass; lookahead=1 keeps the documented lock-step reads
        self.blind = type(policy) is BaseOnly and self.lookahead is None
        self.lazy = policy.lazy or self.blind
        self.eos = torch.tensor(sorted(pair.eos_ids), dtype=torch.long)
        self.stop_chars = max((len(s) for s in sampling.stop), default=0)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> list[dict[str, np.ndarray]]:
        """Decode to the end; returns per-row arrays of the new positions (as `metrics_from_hidden`)."""
        while self.t < self.limit and not all(r.done for r in self.rows):
            self._check_stop()
            if self.blind:
                self._blind_step()
            elif self.lazy:
                self._lazy_step()
            else:
                self._block()
        if self.lazy:
            self._flush()
        elif self.lookahead is None:
            SIZERS.keep(self.pair, self.policy, len(self.rows), self.sizer)
        for state in self.states.values():  # as lock-step leaves them: the last token is never read
            state.crop(self.t - 1)
        empty = empty_metrics(self.k)
        return [self.record.row(i, len(r.tokens), empty) for i, r in enumerate(self.rows)]

    def _check_stop(self) -> None:
        if self.should_stop is not None and self.should_stop():
            raise GenerationCancelled("generation cancelled")

    def _live(self) -> np.ndarray:
        return np.array([not r.done for r in self.rows])

    def _replaying(self, p: int) -> np.ndarray:
        """(B,) rows that already know their token at p (a late-joining row's prefix)."""
        return np.array([p < len(r.tokens) for r in self.rows])

    def _ids(self, first: int, stop: int) -> torch.Tensor:
        """(B, stop - first) emitted ids of positions first .. stop - 1."""
        return torch.from_numpy(self.fed[:, first - self.start : stop - self.start].copy())

    def _read(self, state: ModelState, more: torch.Tensor | None = None, stop: int | None = None) -> torch.Tensor:
        """Bring `state` up to the emitted tokens before `stop` (default: all), plus `more` (B, m) drafts;
        returns (B, j + 1, d) hidden states, entry i predicting response position (fed before) + i."""
        ids = self._ids(state.fed, self.t if stop is None else stop)
        if more is not None:
            ids = torch.cat([ids, more], dim=1)
        before = state.last_hidden.unsqueeze(1)
        return before if ids.shape[1] == 0 else torch.cat([before, state.feed(ids)], dim=1)

    # -- verify-ahead blocks ------------------------------------------------------------------

    def _block_plan(self) -> tuple[int, float]:
        """(most positions of the next block, the base top-1 probability below which a draft ends it early)."""
        n, cut = (self.lookahead, 0.0) if self.lookahead is not None else self.sizer.plan()
        # (rows, V) float32 arrays alive per position while a block is scored: both models' logits, and
        # metrics.step_metrics' six work arrays (log-probs and probabilities of each, two scratch)
        per_position = 8 * len(self.rows) * self.pair.vocab_size * 4
        return max(1, min(n, self.limit - self.t, self.logit_bytes // per_position)), cut

    def _block(self) -> None:
        """Draft up to n base tokens, score them with the reasoner in one forward, commit up to the first change."""
        n, cut = self._block_plan()
        t0 = time.perf_counter()
        self._read(self.base)  # the token emitted last (at most one) is read now
        logits_a, drafts = self._draft(n, cut)  # (B, n, V), (B, n)
        n = drafts.shape[1]  # fewer when every row drafted its end
        t1 = time.perf_counter()
        hidden = self._read(self.reason, drafts[:, : n - 1])[:, -n:]  # (B, n, d): positions t .. t+n-1
        logits_b = self.reason.logits(hidden)
        b, v = logits_a.shape[0], logits_a.shape[-1]
        # the scoring path's maths (core.scoring.metrics), rows i * n + j; emitted-token metrics of the drafts
        metrics, logprobs = step_metrics(logits_a.reshape(b * n, v), logits_b.reshape(b * n, v), k=self.k)
        metrics.update(emitted_metrics(logprobs, drafts.reshape(-1)))
        metrics = {name: x.reshape((b, n) + x.shape[1:]) for name, x in to_host(metrics).items()}
        self.sizer.observe(n, (t1 - t0) / n, time.perf_counter() - t1)
        tops = []  # the base's top-1 probability at each committed position, its least over live rows
        for j in range(n):
            live = self._live()
            tops.append(metrics["topk_base_probs"][live, j, 0].min(initial=1.0))
            changed = self._verify_position(j, logprobs.rows(slice(j, None, n)), logits_b[:, j], drafts[:, j],
                                            {name: x[:, j] for name, x in metrics.items()})
            if changed or self.t >= self.limit or all(r.done for r in self.rows):
                self.sizer.add(j + 1, changed, tops)
                for state in (self.base, self.reason):
                    state.crop(self.t - 1)  # drop the drafts after the changed position
                return
        self.sizer.add(n, False, tops)

    def _draft(self, n: int, cut: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """The base's next n tokens (pads for finished rows) and the logits they were drawn from; fewer
        when every row has drafted an end of sequence or reached its room (a draft after it is never
        committed: the row ends there, or the block ends at the token that replaced it), or after a draft
        where a live row's base top-1 probability is below `cut` (a takeover there may change it)."""
        live = self._live()
        room = np.array([np.iinfo(np.int64).max if r.room is None else r.room for r in self.rows])
        ended = ~live
        logits, drafts = [], []
        for j in range(n):
            if j:
                self._check_stop()
            a = self.base.logits()  # (B, V)
            d = self._sample(a, self.t + j, live)
            logits.append(a)
            drafts.append(d)
            ended = ended | (self.t + j + 1 >= room)
            open_rows = ~ended & ~self._replaying(self.t + j)  # a replaying row's draft is not its token
            if len(self.eos):
                ended |= torch.isin(d, self.eos).numpy() & open_rows
            if ended.all() or j == n - 1:  # the last draft is read with the next block, once it is known to stand
                break
            if cut > 0 and (top_probability(a).cpu().numpy()[open_rows] < cut).any():
                break  # this draft is verified before the base drafts past it
            self.base.feed(d.unsqueeze(1))
        return torch.stack(logits, dim=1), torch.stack(drafts, dim=1)

    def _verify_position(self, j: int, logprobs: LogProbs, b: torch.Tensor, draft: torch.Tensor,
                         metrics: dict[str, np.ndarray]) -> bool:
        """Run the policy on block position j exactly as lock-step would; commit it; True if the emitted
        token of some row is not its draft (the block ends there)."""
        p, live = self.t, self._live()
        score = (np.full(len(self.rows), np.nan, dtype=np.float32) if self.policy.score in EMITTED
                 else score_values(metrics, self.policy.score))  # lock-step scores before the token is known
        step = Step(t=p, score=score, entropy_base=metrics["entropy_base"], history=[r.history for r in self.rows],
                    taken=self.taken, limit=self.limit, rows=self.identities)
        fire = np.asarray(self.policy.takeover(step), dtype=bool) & live
        tokens, sources = self._choose(p, draft.numpy(), b, fire, self.policy.forced_token(p), live)
        changed = bool((live & (tokens != draft.numpy())).any())
        if changed:  # the emitted-token metrics of this position are those of the new tokens
            metrics = {**metrics, **to_host(emitted_metrics(logprobs, torch.from_numpy(tokens)))}
        self._commit(p, tokens, sources, live, score_values(metrics, self.policy.score), metrics)
        return changed

    # -- lazy policies: the reasoner catches up when a takeover is considered --------------------

    def _lazy_step(self) -> None:
        """One position of a lazy policy: gate on base entropy; read the backlog into the reasoner only
        when it must emit; the metrics of skipped positions are filled by `_flush`."""
        p, live = self.t, self._live()
        a = self.base.logits()
        h, top2 = entropy_and_top2(a)
        # what the gate reads, in one copy from the device (the base's hidden state only for a gate that reads it)
        hidden = {"hidden": self.base.last_hidden.float()} if self.policy.reads_base_state else {}
        read = to_host({"h": h, "top2": top2, **hidden})
        h_base = read["h"]
        step = Step(t=p, score=None, entropy_base=h_base, history=[r.history for r in self.rows], taken=self.taken,
                    limit=self.limit, rows=self.identities, top2=read["top2"], hidden_base=read.get("hidden"))
        fire = np.asarray(self.policy.takeover(step), dtype=bool) & live & ~self._replaying(p)
        forced = self.policy.forced_token(p)
        b = None
        if fire.any() or forced is not None:
            self._log_reason(self._read(self.reason))
            b = self.reason.logits()
        tokens, sources = self._choose(p, self._sample(a, p, live).numpy(), b, fire, forced, live)
        self.deferred["base"][p] = a
        self._commit(p, tokens, sources, live, h_base, None)
        if self.t < self.limit and not all(r.done for r in self.rows):
            self.base.feed(torch.from_numpy(tokens).unsqueeze(1))
            if len(self.deferred["base"]) >= self.flush_every:
                self._flush()

    def _blind_step(self) -> None:
        """One position of BaseOnly: the base's draw, nothing to decide; the reasoner reads in `_flush`."""
        p, live = self.t, self._live()
        a, none = self.base.logits(), np.zeros(len(self.rows), dtype=bool)
        tokens, sources = self._choose(p, self._sample(a, p, live).numpy(), None, none, None, live)
        self.deferred["base"][p] = a
        self._commit(p, tokens, sources, live, np.zeros(len(self.rows), dtype=np.float32), None)
        if self.t < self.limit and not all(r.done for r in self.rows):
            self.base.feed(torch.from_numpy(tokens).unsqueeze(1))
            if len(self.deferred["base"]) >= self.flush_every:
                self._flush()

    def _log_reason(self, hidden: torch.Tensor) -> None:
        first = self.reason.fed - hidden.shape[1] + 1
        for i in range(hidden.shape[1]):
            self.deferred["reason"][first + i] = hidden[:, i]

    def _flush(self) -> None:
        """Metrics of the deferred positions, from the base's kept logits and the reasoner's logged hidden
        states (its head applied in batched passes)."""
        positions = sorted(self.deferred["base"])
        if not positions:
            return
        self._log_reason(self._read(self.reason, stop=positions[-1]))  # the last emitted token is never read
        logits = torch.stack([self.deferred["base"][p] for p in positions], dim=1)  # (B, M, V)
        hidden = torch.stack([self.deferred["reason"][p] for p in positions], dim=1)  # (B, M, d)
        targets = self._ids(positions[0], positions[-1] + 1)  # (B, M)
        b, m = targets.shape
        # every row's positions in one pass (per position, the same maths as row by row; B times fewer launches)
        arrays = metrics_from_hidden(self.pair, {"reason": hidden.reshape(b * m, -1)}, targets.reshape(-1), k=self.k,
                                     logits={"base": logits.reshape(b * m, -1)})
        self.record.write_block(positions[0], {name: v.reshape((b, m) + v.shape[1:]) for name, v in arrays.items()})
        self.deferred = {s: {} for s in SIDES}

    # -- shared by both -----------------------------------------------------------------------

    def _sample(self, logits: torch.Tensor, p: int, live: np.ndarray) -> torch.Tensor:
        """(B,) tokens drawn from (B, V) logits at position p (pads for finished rows)."""
        if self.sampling.temperature == 0.0:
            out = logits.argmax(-1).cpu()
        else:
            out = torch.tensor([sample_token(logits[i], self.sampling.temperature, self.sampling.top_p,
                                             position_generator(r.seed, p)) if live[i] else self.pad
                                for i, r in enumerate(self.rows)], dtype=torch.long)
        if not live.all():
            out[torch.from_numpy(~live)] = self.pad
        return out

    def _choose(self, p: int, draft: np.ndarray, b: torch.Tensor | None, fire: np.ndarray,
                forced: int | Sequence[int | None] | None, live: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Per row, the token emitted at p and who emitted it: a replayed known token, the user's (`forced`:
        one id for every row, or one per row), the reasoner's draw, or the draft."""
        tokens, sources = draft.copy(), ["base"] * len(self.rows)
        for i, r in enumerate(self.rows):
            own = forced[i] if isinstance(forced, (list, tuple)) else forced
            if not live[i]:
                tokens[i] = self.pad
            elif p < len(r.tokens):
                tokens[i], sources[i] = r.tokens[p], r.source[p]
            elif own is not None:
                tokens[i], sources[i] = own, "forced"
            elif fire[i]:
                tokens[i] = sample_token(b[i], self.sampling.temperature, self.sampling.top_p,
                                         position_generator(r.seed, p))
                sources[i] = "reason"
            if not 0 <= tokens[i] < self.pair.vocab_size:
                raise InvalidInputError(f"Token id {tokens[i]} is outside the vocabulary (0..{self.pair.vocab_size - 1})")
        return tokens, sources

    def _commit(self, p: int, tokens: np.ndarray, sources: list[str], live: np.ndarray, gate: np.ndarray,
                metrics: dict[str, np.ndarray] | None) -> None:
        """Position p is final: record it, extend each live row, check stops, report progress."""
        col = p - self.start
        if col >= self.fed.shape[1]:
            self.fed = np.concatenate([self.fed, np.zeros_like(self.fed)], axis=1)
        self.fed[:, col] = tokens
        if metrics is not None:
            self.record.write(p, metrics)
        for i, r in enumerate(self.rows):
            if not live[i]:
                continue
            if p < len(r.tokens):  # replayed: the row holds this token, its source and gate value already
                self.taken[i] += sources[i] == "reason"
                continue
            tok = int(tokens[i])
            r.tokens.append(tok)
            r.source.append(sources[i])
            self.taken[i] += sources[i] == "reason"
            r.history.append(float(gate[i]))
            if self.on_token is not None:
                self.on_token(p, tok, sources[i])
            if tok in self.pair.eos_ids or (self.stop_chars and self._hits_stop(r.tokens)) or (
                    r.room is not None and len(r.tokens) >= r.room):
                r.done = True
        self.t = p + 1
        if self.progress is not None:
            self.progress(self.t, self.limit)

    def _hits_stop(self, tokens: list[int]) -> bool:
        """Whether a stop string ends the text (only the last few tokens are decoded: O(1) per step)."""
        tail = self.pair.decode(tokens[-(self.stop_chars + 8):])
        return any(s in tail for s in self.sampling.stop)
