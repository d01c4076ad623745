"""Calibrating the Guided gate: one path, keyed by the pair's fingerprint.

The gate (tau, lam, window) is fit on BaseOnly rollouts of *this* pair: made for the given prompts
(stored ones reused, by request key, which includes the fingerprint), or, without prompts, read from
the store's existing rollouts whose recorded fingerprint is this pair's. Rollouts of another pair are
never used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


from core import settings
from core.annotate.spikes import Gate, calibrate_gate
from core.decoding.generation import generate_many
from core.decoding.policies import BaseOnly, Policy, make_policy, policy_spec
from core.errors import InvalidInputError
from core.pair.loading import ModelPair
from core.scoring.registry import check_score, score_values
from core.record.problems import problem_record
from core.trace import Trace

ROLLOUT_LIMIT = 256  # most stored rollouts read when calibrating from the store alone


def _candidate_keys(store: Any) -> list[str]:
    """Keys of stored BaseOnly `generate` traces (any pair), newest first when the store knows."""
    df = store.summaries()
    if df.empty:
        return []
    rows = df[(df["policy"] == BaseOnly.name) & (df["kind"] == "generate")]
    if "created" in rows:
        rows = rows.sort_values("created", ascending=False, kind="stable")
    return [str(k) for k in rows["key"]]


def _is_this_pair(trace: Trace, pair: ModelPair) -> bool:
    return (trace.meta.get("request") or {}).get("pair") == pair.fingerprint()


def base_rollouts(pair: ModelPair, store: Any, limit: int | None = None) -> list[Trace]:
    """The store's BaseOnly rollouts made with this pair (models and prompt formats), at most `limit`."""
    if store is None:
        return []
    out = []
    for key in _candidate_keys(store):
        trace = store.get(key)
        if _is_this_pair(trace, pair):
            out.append(trace)
            if limit is not None and len(out) >= limit:
                break
    return out


def has_base_rollouts(pair: ModelPair, store: Any) -> bool:
    """Whether the store holds any BaseOnly rollout of this pair (what calibrating from the store needs)."""
    return bool(base_rollouts(pair, store, limit=1))


def calibrate(pair: ModelPair, prompts: Sequence[Any] | None = None, ratio: float = settings.RATIO, *,
              window: int = settings.WINDOW, score: str = settings.SCORE,
              max_new_tokens: int = settings.MAX_NEW_TOKENS, temperature: float = settings.TEMPERATURE,
              top_p: float = settings.TOP_P, seed: int = settings.SEED, batch_size: int = settings.BATCH_SIZE,
              store: Any = None,
              progress: Callable[[int, int], None] | None = None, limit: int = ROLLOUT_LIMIT,
              executor: Any = None) -> Gate:
    """Fit the Guided gate (tau, lam, window) on this pair's base rollouts, by the paper's rule:
    tau = (1 - r) quantile of the scores, lam = E[s | s > tau] / E[s] (docs/REPRODUCE.md).

    With `prompts`: rollouts of those prompts (stored ones reused; made by `executor` when given, e.g. on
    Ray workers; the gate is always fit here). Without: the store's rollouts of this pair (at most
    `limit`); none there raises InvalidInputError saying how to make them.
    """
    check_score(score)
    if prompts is not None:
        if not len(prompts):
            raise InvalidInputError("calibrate needs at least one prompt")
        traces = generate_many(pair, list(prompts), BaseOnly(), batch_size=batch_size, max_new_tokens=max_new_tokens,
                               temperature=temperature, top_p=top_p, seed=seed, store=store, progress=progress,
                               executor=executor)
    else:
        traces = base_rollouts(pair, store, limit=limit)
        if not traces:
            raise InvalidInputError(
                "No base rollouts of this model pair in the store to calibrate the gate on; make some by "
                "passing problems (core.calibrate(pair, problems, store=store)) or running BaseOnly on them")
    return calibrate_gate([score_values(t.metrics, score) for t in traces], ratio, window)


def build_policy(pair: ModelPair | None, name: str, params: dict[str, Any] | None = None, *,
                 calibrate_on: Sequence[Any] = (), ratio: float = settings.RATIO, store: Any = None,
                 max_new_tokens: int = settings.MAX_NEW_TOKENS, temperature: float = settings.TEMPERATURE,
                 top_p: float = settings.TOP_P, seed: int = settings.SEED, batch_size: int = settings.BATCH_SIZE,
                 progress: Callable[[int, int], None] | None = None, executor: Any = None) -> Policy:
    """`make_policy(name, **params)`, calibrating the gate first when the policy needs one and `params` give
    no tau: on base rollouts of `calibrate_on` at `ratio`, with the window and score from `params`.
    The CLI, the app and the notebook build every policy through here."""
    spec = policy_spec(name)
    params = dict(params or {})
    if not spec.needs_gate or "tau" in params:
        return make_policy(name, **params)
    if pair is None or not len(calibrate_on):
        raise InvalidInputError(f"{spec.label} needs problems to calibrate its gate on (or explicit tau/lam/window)")
    from_gate = {p.name for p in spec.params if p.from_gate}
    window = int(params.get("window", settings.WINDOW))
    gate = calibrate(pair, list(calibrate_on), ratio=ratio, window=window, score=str(params.get("score", settings.SCORE)),
                     max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                     batch_size=batch_size, store=store, progress=progress, executor=executor)
    return make_policy(name, gate=gate, **{k: v for k, v in params.items() if k not in from_gate})


def has_thinking_mode(tokenizer: Any) -> bool:
    """Whether a chat model can open a thought: its chat template or vocabulary knows "<think>"."""
    template = getattr(tokenizer, "chat_template", None) or ""
    template = template if isinstance(template, str) else " ".join(map(str, getattr(template, "values", lambda: [])()))
    if "<think>" in template or "enable_thinking" in template:
        return True
    try:
        return "<think>" in tokenizer.get_vocab()
    except (AttributeError, TypeError):
        return False


def first_token_advice(pair: ModelPair) -> str:
    """What to do when t = 0 is the largest spike of most base rollouts, for this pair: `+think` only helps
    a reasoner with a thinking mode whose format does not open its thought already; any other pair (a
    raw base beside a chat model without thinking, or formats that differ otherwise) needs the gates'
    `skip_first` so that the artefact at the start is never taken over."""
    fmt = pair.formats["reason"]
    described = fmt.describe()
    tokenizer = pair.prompt_tokenizers.get("reason", pair.tokenizer)
    skip = ("set the gate's skip_first (CLI: --skip-first 1; reproduce: --skip-first 1) so that the gate never "
            "fires at the format artefact at t = 0")
    if described["kind"] == "chat" and described["prefill"] != "think" and has_thinking_mode(tokenizer):
        return (f"the reasoner's format {fmt.spec!r} does not open its thought: use a +think format (e.g. "
                f"paper-think, or chat:think+think), or {skip}")
    why = ("the reasoner's format already opens its thought" if described["prefill"] == "think" else
           "the reasoner has no thinking mode, so +think would not help" if described["kind"] == "chat" else
           "the reasoner reads a raw prompt (+think applies to chat formats only)")
    return f"{why}; {skip}"


def holdout(pool: Sequence[Any], chosen: Sequence[Any], n: int) -> tuple[list[Any], bool]:
    """Calibration problems for a gate that will run on `chosen`: up to `n` problems of `pool` that are not
    among `chosen` (held out), and False; when `pool` has none left, the first `n` of `chosen` and True
    (in-sample: the caller should say so)."""
    def ident(p: Any) -> tuple[str, str]:
        rec = problem_record(p)
        return str(rec["id"]), rec["prompt"]

    used = {ident(p) for p in chosen}
    rest = [p for p in pool if ident(p) not in used][:n]
    return (rest, False) if rest else (list(chosen)[:n], True)


def first_token_takeover_share(traces: Sequence[Trace]) -> float:
    """Share of the takeovers (tokens the reasoner wrote) in `traces` that are at t = 0 (NaN when there are none)."""
    firsts = sum(int(len(t) > 0 and bool(t.takeovers[0])) for t in traces)
    total = sum(t.n_takeovers for t in traces)
    return firsts / total if total else float("nan")
