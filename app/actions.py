"""What the app's buttons do, as plain functions over core: build policies, generate, branch, grade, store.

No streamlit here; callers pass a `progress(done, total)` callback and turn ForkpointError into messages.
Policies come only from core's registry (`list_policies`, `make_policy`); grading and storing only through
`core.evaluation.grading.graded_put`; batches only through `core.decoding.generate_many`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import core
from core import settings
from core.decoding import branch, generate_many
from core.decoding.takeover import takeover
from core.decoding.policies import Policy, list_policies, make_policy
from core.errors import InvalidInputError
from core.evaluation.grading import grade_trace, graded_put
from core.evaluation.problems import Problem
from core.io.store import TraceStore
from core.settings import Progress
from core.trace import Trace

log = logging.getLogger(__name__)


def policy_names() -> list[str]:
    """The policies the Generate page offers: core's registry, in its order (internal ones left out)."""
    return [spec.name for spec in list_policies()]


def graded(trace: Trace) -> Trace:
    """Fill meta answer/correct from the problem's gold answer (core's rule; in place, also returned)."""
    grade_trace(trace)
    return trace


def first_trace(pair: core.ModelPair, store: TraceStore, problem: Problem,
                max_new_tokens: int = settings.MAX_NEW_TOKENS) -> Trace:
    """The greedy BaseOnly trace of `problem` (from the store when it is already there)."""
    return generate_many(pair, [problem], make_policy("base_only"), max_new_tokens=max_new_tokens, store=store,
                         on_trace=grade_trace)[0]


def run_branch(pair: core.ModelPair, store: TraceStore, parent: Trace, pos: int, token: int | None = None,
               max_new_tokens: int | None = None, progress: Progress | None = None, rest: Sequence[int] = (),
               temperature: float | None = None, seed: int | None = None) -> Trace:
    """Take over at `pos` (the reasoner's choice, or `token`; `rest` forces the following tokens too, for
    a typed string), continue with the base (at this branch's temperature/seed if given), grade, store."""
    limit = None
    if max_new_tokens is not None:
        limit = max(int(max_new_tokens), pos + 1 + len(rest))
    policy = make_policy("forced", at={pos + 1 + i: int(t) for i, t in enumerate(rest)}) if rest else None
    child = branch(pair, parent, int(pos), token=token, policy=policy, max_new_tokens=limit, store=store,
                   progress=progress, temperature=temperature, seed=seed)
    return graded_put(store, child)


FAN_MAX = 3  # alternatives side by side with the open trace (the comparison shows up to three others)


def run_fan(pair: core.ModelPair, store: TraceStore, parent: Trace, pos: int, n: int, temperature: float,
            then: str = "policy", progress: Progress | None = None) -> tuple[list[Trace], set[str]]:
    """n sampled alternatives from token `pos` on (the reasoner writes `pos`, `then` the rest), each graded and
    stored: core.takeover(samples=n) decodes them in one batch (a sample that redraws the parent is left out).
    Returns them and the keys of those made now (the others were in the store already)."""
    if not 1 <= int(n) <= FAN_MAX:
        raise InvalidInputError(f"Alternatives: 1..{FAN_MAX}, got {n}")
    if not float(temperature) > 0:
        raise InvalidInputError(f"Alternatives need a temperature above 0 (they are sampled), got {temperature}")
    at = {int(pos): "reason"}
    new: set[str] = set()

    def seen(child: Trace) -> None:  # the kernel shows each new child here once, before storing it
        new.add(child.key)
        grade_trace(child)

    made = takeover(pair, parent, at, then=then, samples=int(n), temperature=float(temperature), store=store,
                    on_trace=seen, progress=progress)  # one engine batch; a sample with the parent's tokens is the parent
    return [graded_put(store, t) for t in made if t.key != parent.key], new


def run_generate(pair: core.ModelPair, store: TraceStore, problems: Sequence[Problem], policy: Policy, *,
                 max_new_tokens: int = settings.MAX_NEW_TOKENS, temperature: float = settings.TEMPERATURE,
                 top_p: float = settings.TOP_P, seed: int = settings.SEED, samples: int = settings.SAMPLES,
                 batch_size: int = settings.BATCH_SIZE, k: int = settings.K,
                 progress: Progress | None = None) -> list[Trace]:
    """Run `policy` on `problems` (core's batch loop); each trace is graded and stored. progress in rows."""
    if not problems:
        raise InvalidInputError("Choose at least one problem")
    return generate_many(pair, list(problems), policy, samples=samples, batch_size=batch_size,
                         max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, k=k,
                         store=store, on_trace=grade_trace, progress=progress)
