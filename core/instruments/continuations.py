"""Many continuations of one trace from one position, decoded as one batch by the child-trace kernel.

Row i keeps the trace's first `pos` tokens, lets `who[i]` ("reason" or "base") write token `pos`, and
continues under `then` (the trace's own policy, the base or the reasoner) with its own sampling seed. The
prompt and prefix are read once (or taken from the trace's held caches) and shared by every row.
Each row is a graded child trace of `trace` (meta parent / branch_pos / branch), keyed by its request, so a
store returns it on a re-run without decoding. The decoding is `core.decoding.takeover.decode_children`, the
kernel every child trace goes through; this module only names the rows (their requests keep the keys that
stores already hold). The callers are `core.instruments.effects` and the success curve.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from core import settings
from core.decoding.engine import Row
from core.decoding.policies import Policy, row_identity
from core.decoding.sampling import Sampling, row_seed
from core.decoding.takeover import WHO, Child, check_child, child_sampling, decode_children, resolve_then
from core.errors import InvalidInputError
from core.evaluation.grading import grade_trace, graded_put
from core.pair.loading import ModelPair
from core.record.meta import make_meta
from core.record.request import request
from core.trace import Trace

def _children(pair: ModelPair, trace: Trace, pos: int, who: Sequence[str], seeds: Sequence[int], then: str,
              temperature: float, max_new_tokens: int | None) -> tuple[list[Child], Policy, Sampling]:
    """The checked children of a batch of continuations, the policy after the switch and the sampling."""
    if len(who) != len(seeds):
        raise InvalidInputError(f"who has {len(who)} entries and seeds {len(seeds)}; give one of each per row")
    bad = [w for w in who if w not in WHO]
    if bad:
        raise InvalidInputError(f"Unknown who={bad[0]!r}; choose one of: {', '.join(WHO)}")
    check_child(pair, trace, pos, inside=True)
    policy = resolve_then(trace, then)
    sampling = child_sampling(trace, max_new_tokens=max_new_tokens, temperature=temperature, seed=0)  # rows seed themselves
    k = trace.k or settings.K
    pos = int(pos)
    return [Child(_row(pair, trace, pos, w, int(s), policy, sampling, k), {pos: w}, pos)
            for w, s in zip(who, seeds)], policy, sampling


def continuation_keys(pair: ModelPair, trace: Trace, pos: int, who: Sequence[str], seeds: Sequence[int], *,
                      then: str = "policy", temperature: float, max_new_tokens: int | None = None) -> list[str]:
    """The store keys `continue_batch` gives its rows, in row order (tokenising the prompt is all it does)."""
    children, *_ = _children(pair, trace, pos, who, seeds, then, temperature, max_new_tokens)
    return [c.row.meta["key"] for c in children]


def continue_batch(pair: ModelPair, trace: Trace, pos: int, who: Sequence[str], seeds: Sequence[int], *,
                   then: str = "policy", temperature: float, max_new_tokens: int | None = None, store: Any = None,
                   lookahead: int | None = None, should_stop: Callable[[], bool] | None = None,
                   on_trace: Callable[[Trace], Any] | None = None) -> list[Trace]:
    """One graded child trace per (who[i], seeds[i]), decoded together; stored ones are read back (None
    for a row whose key the store holds but cannot give, as an executor's skip-list does). `on_trace`
    runs on each new child before it is graded and stored."""
    children, policy, sampling = _children(pair, trace, pos, who, seeds, then, temperature, max_new_tokens)

    def finish(child: Trace) -> Trace:
        if on_trace is not None:
            on_trace(child)
        grade_trace(child)
        return child

    kids = decode_children(pair, trace, children, policy, sampling, store=store, on_trace=finish, hold_caches=False,
                           lookahead=lookahead, should_stop=should_stop)
    # a stored child of an older run gains the grade it lacked (a new one is graded and stored already)
    return [None if kid is None else graded_put(store, kid) for kid in kids]  # type: ignore[misc]


@dataclass(frozen=True, eq=False)
class ContinueJob:
    """A job kind for `core.scale`'s executors (see `core.scale.jobs`): `continue_batch`'s rows of one trace
    from one position, one decoding batch wherever it runs, so the rows are the same on any worker."""

    trace: Trace
    pos: int
    who: tuple[str, ...]
    seeds: tuple[int, ...]
    then: str = "policy"
    temperature: float = 0.0
    max_new_tokens: int | None = None

    @property
    def units(self) -> int:
        """Rows in the job: one continuation each."""
        return len(self.who)

    def keys(self, pair: ModelPair) -> list[str]:
        """The rows' store keys, in row order (no model forward)."""
        return continuation_keys(pair, self.trace, self.pos, self.who, self.seeds, then=self.then,
                                 temperature=self.temperature, max_new_tokens=self.max_new_tokens)

    def make(self, pair: ModelPair, store: Any, on_trace: Callable[[Trace], Any] | None = None) -> list[Trace | None]:
        """The graded rows (None where `store` holds the key but gives nothing back), new ones put in `store`."""
        return continue_batch(pair, self.trace, self.pos, self.who, self.seeds, then=self.then,
                              temperature=self.temperature, max_new_tokens=self.max_new_tokens, store=store,
                              on_trace=on_trace)


def _row(pair: ModelPair, trace: Trace, pos: int, who: str, seed: int, then: Policy, sampling: Sampling,
         k: int) -> Row:
    """The decoding row of one continuation, with its request (its store key) and meta."""
    problem = trace.meta.get("problem") or {"prompt": ""}
    prompt_ids = pair.prompt_ids(problem["prompt"])
    row_sampling = Sampling(sampling.temperature, sampling.top_p, seed, sampling.max_new_tokens, sampling.stop)
    policy = {**then.record(), "branch": {"pos": pos, "token": who}}
    asked = request("branch", pair.fingerprint(), prompt=problem["prompt"], policy=policy,
                    sampling=row_sampling.record(0), k=k, parent=trace.key, branch_pos=pos, token=None,
                    takeover={str(pos): who})
    meta = make_meta(pair, kind="branch", request=asked, problem=problem, policy=policy,
                     sampling=row_sampling.record(0), parent=trace.key, branch_pos=pos,
                     branch={"pos": pos, "who": who})
    room = pair.check_context(prompt_ids, sampling.max_new_tokens)
    parent_sample = int((trace.meta.get("sampling") or {}).get("sample", 0))
    # the trace's policy draws its per-row randomness (RandomPositions) as it did for the trace
    return Row(problem, prompt_ids, meta, row_seed(row_sampling, 0), room=room if room < sampling.max_new_tokens else None,
               identity=row_identity(problem["prompt"], parent_sample))
