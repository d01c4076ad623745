"""When the reasoning model takes over: small policy objects, each declaring its parameters once.

A policy sees one decoding step of a batch (`Step`) and returns, per row, whether the reasoning model
emits this token; the engine (core/decoding/engine.py) does everything else. Each parameter is a
dataclass field made with `param(...)` (default, range, help), and `make_policy(name, **params)` is the
one way user input becomes a policy: the CLI's options and the app's widgets are built from
`list_policies()`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from core import settings
from core.annotate.spikes import Gate, gate_fires
from core.decoding.params import Param, declared_params, param
from core.decoding.router import check_router_pair, load_router, step_features
from core.errors import InvalidInputError
from core.scoring.registry import DEFAULT_SCORE, GATE_SCORES, check_gate_score, score_values
from core.trace import Trace

REASON = "reason"  # Forced({pos: REASON}): the reasoning model picks the token at pos


@dataclass(frozen=True)
class PolicySpec:
    """A policy as the edges see it: name, label, one-line help and declared parameters."""

    name: str
    label: str  # e.g. "Guided"
    help: str  # one line
    params: tuple[Param, ...]
    cls: type[Policy]
    lazy: bool  # gates on base entropy only: the reasoner runs on demand
    needs_gate: bool  # build with make_policy(name, gate=calibrate(pair, problems, ratio=, window=, score=))
    calibration: tuple[str, ...]  # core.settings names the calibration reads (Guided: ratio, window)
    internal: bool  # built by branch/force actions, not offered as a choice (Forced)

    @property
    def user_params(self) -> tuple[Param, ...]:
        """The parameters a user sets directly (not those a calibrated gate sets)."""
        return tuple(p for p in self.params if not p.from_gate)

    def param(self, name: str) -> Param:
        """The declared parameter `name`, or raise with the valid names."""
        for p in self.params:
            if p.name == name:
                return p
        raise InvalidInputError(f"Policy {self.name!r} has no parameter {name!r}; it takes: "
                                f"{', '.join(p.name for p in self.params) or 'none'}")


@dataclass
class Step:
    """What a policy may look at when deciding step t (response index) for B rows.

    score: (B,) the policy's score at t, or None for lazy policies (reasoner not run yet).
    entropy_base: (B,) base entropy at t. history: per row, the gate's values at earlier steps (the
    scores; base entropies for lazy policies). taken: (B,) takeovers so far. limit: max_new_tokens.
    rows: (B,) each row's identity (from its prompt and sample index, see `row_identity`): the same in
    any batch, order or branch of it, so per-row random draws do not depend on how rows are batched.
    top2: (B, 2) the base's two largest probabilities at t; hidden_base: (B, d) the base's last hidden
    state (the one predicting t). Lazy policies get both (gates on the base alone read them); None otherwise.
    """

    t: int
    score: np.ndarray | None
    entropy_base: np.ndarray
    history: list[list[float]]
    taken: np.ndarray
    limit: int
    rows: np.ndarray | None = None
    top2: np.ndarray | None = None
    hidden_base: np.ndarray | None = None


def row_identity(prompt: str, sample: int) -> int:
    """A row's identity for per-row random draws: a 64-bit hash of its prompt text and sample index."""
    digest = hashlib.blake2b(f"{int(sample)}\0{prompt}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class Policy:
    """Base class. Subclasses are dataclasses whose fields are `param(...)` declarations.

    `lazy` policies gate on base entropy only, so the engine runs the reasoner on demand. Write a custom
    policy by subclassing and implementing `takeover`; register it with `register_policy` to make it
    reachable from `make_policy` and stored records.
    """

    name: ClassVar[str] = "policy"
    label: ClassVar[str] = "Policy"
    help: ClassVar[str] = ""
    lazy: ClassVar[bool] = False
    calibration: ClassVar[tuple[str, ...]] = ()  # settings a calibration step reads before building
    internal: ClassVar[bool] = False
    # The one parameter equal-ρ calibration (core.decoding.calibration.equal_rho) sets from base rollouts, and
    # whether the gate fires where `signal` is above it (False: below). None: not a gate with a knob.
    knob: ClassVar[str | None] = None
    fires_below: ClassVar[bool] = False
    score: str = DEFAULT_SCORE

    def __post_init__(self) -> None:
        for p in declared_params(type(self)):
            setattr(self, p.name, p.check(getattr(self, p.name), self.name))

    def takeover(self, step: Step) -> np.ndarray:  # (B,) bool
        raise NotImplementedError

    def forced_token(self, t: int) -> int | None:
        """A token id the user fixed at step t (only `Forced` has any)."""
        return None

    def record(self) -> dict[str, Any]:
        """Name and parameters, as stored in every trace's meta["policy"]; `policy_from_record` inverts it."""
        return {"name": self.name, "params": {p.name: getattr(self, p.name) for p in declared_params(type(self))
                                              if not (p.quiet_default and getattr(self, p.name) == p.default)}}

    def diagnose(self, traces: Sequence[Trace]) -> str | None:
        """A notice for the user when this policy clearly did nothing in `traces` (0 takeovers), else None."""
        return None

    def check_pair(self, pair: Any) -> None:
        """Raise when this policy cannot run with `pair` (the engine asks before decoding; a router names its pair)."""

    def signal(self, trace: Trace, pair: Any = None) -> np.ndarray:
        """(T,) the value this gate compares with its knob at each position of `trace` (a base rollout), as
        the engine would see it there; what equal-ρ calibration takes quantiles of."""
        raise InvalidInputError(f"{self.label} has no per-position signal to calibrate a takeover rate on")


def within_budget(taken: np.ndarray, limit: int, budget: float | None, max_takeovers: int | None) -> np.ndarray:
    """(B,) bool: one more takeover keeps the count ≤ ceil(budget · limit) and < max_takeovers.

    None means no cap. The budget is a share of the whole response (`limit` = max_new_tokens), not of the
    tokens so far, so early takeovers are never starved.
    """
    ok = np.ones(len(taken), dtype=bool)
    if budget is not None:
        ok &= taken + 1 <= math.ceil(budget * limit - 1e-9)
    if max_takeovers is not None:
        ok &= taken < max_takeovers
    return ok


def _silent(policy: Policy, traces: Sequence[Trace], why: str) -> str | None:
    """The notice for a policy that made no takeover in `traces` (None when it made one, or no tokens)."""
    n_tokens = sum(len(t) for t in traces)
    if n_tokens == 0 or any(t.n_takeovers for t in traces):
        return None
    return f"{policy.label} made 0 takeovers in {len(traces)} trace(s) ({n_tokens} tokens): {why}"


_BUDGET_HELP = "Cap on takeovers as a share of max_new_tokens (empty = no cap, as in the paper)."
_MAX_HELP = "Cap on takeovers per response (empty = no cap)."
_SKIP_HELP = ("The gate never fires at the first k response positions (0 = the paper's gate). For a pair whose "
              "formats differ at the start of the response, e.g. a raw base beside a chat model without a "
              "thinking mode, where t = 0 is an artefact spike.")


@dataclass
class BaseOnly(Policy):
    """The base model writes every token (the reasoner still scores each one)."""

    name: ClassVar[str] = "base_only"
    label: ClassVar[str] = "BaseOnly"
    help: ClassVar[str] = "The base writes every token; the reasoner only scores."

    def takeover(self, step: Step) -> np.ndarray:
        return np.zeros(len(step.taken), dtype=bool)


@dataclass
class ReasonOnly(Policy):
    """The reasoning model writes every token, with its own prompt: the reference upper bound."""

    name: ClassVar[str] = "reason_only"
    label: ClassVar[str] = "ReasonOnly"
    help: ClassVar[str] = "The reasoner writes every token (upper bound)."

    def takeover(self, step: Step) -> np.ndarray:
        return np.ones(len(step.taken), dtype=bool)


@dataclass
class Guided(Policy):
    """Disagreement-guided takeover (the paper's gate): s_t > tau and s_t > lam · mean(previous `window`
    scores). No cap by default; `budget` / `max_takeovers` add one."""

    name: ClassVar[str] = "guided"
    label: ClassVar[str] = "Guided"
    help: ClassVar[str] = "Take over where the calibrated disagreement gate fires (the paper's policy)."
    calibration: ClassVar[tuple[str, ...]] = ("ratio", "window")
    tau: float = param(0.0, "Gate absolute threshold τ (set by calibration).", from_gate=True)
    lam: float = param(1.0, "Gate relative threshold λ (set by calibration).", low=0.0, from_gate=True)
    window: int = param(settings.WINDOW, settings.SETTINGS["window"].help, low=1, from_gate=True)
    budget: float | None = param(None, _BUDGET_HELP, low=0.0, high=1.0)
    score: str = param(DEFAULT_SCORE, "Disagreement score the gate reads.", choices=GATE_SCORES)
    max_takeovers: int | None = param(None, _MAX_HELP, low=0)
    skip_first: int = param(0, _SKIP_HELP, low=0, quiet_default=True)

    def __post_init__(self) -> None:
        check_gate_score(self.score)  # the clearer message for delta_logp
        super().__post_init__()
        self.gate = Gate(self.tau, self.lam, self.window)

    def takeover(self, step: Step) -> np.ndarray:
        assert step.score is not None
        if step.t < self.skip_first:
            return np.zeros(len(step.taken), dtype=bool)
        fires = np.array([gate_fires(h, float(s), self.gate) for h, s in zip(step.history, step.score)])
        return fires & within_budget(step.taken, step.limit, self.budget, self.max_takeovers)

    knob: ClassVar[str | None] = "tau"  # with lam: refit by the paper's rule at the ratio that realises ρ

    def signal(self, trace: Trace, pair: Any = None) -> np.ndarray:
        return np.asarray(score_values(trace.metrics, self.score), dtype=np.float64)

    def diagnose(self, traces: Sequence[Trace]) -> str | None:
        return _silent(self, traces, f"{self.score} never passed the gate (τ={self.tau:.3g}, "
                       f"λ={self.lam:.3g}); calibrate with a larger ratio r")


@dataclass
class EntropyGated(Policy):
    """Take over where the base model is uncertain: entropy_base > threshold (nats).

    The reasoner is run only when a takeover is considered (lazy catch-up of its cache).
    """

    name: ClassVar[str] = "entropy_gated"
    label: ClassVar[str] = "EntropyGated"
    help: ClassVar[str] = "Take over where the base's entropy exceeds a threshold (baseline)."
    lazy: ClassVar[bool] = True
    threshold: float = param(1.0, "Base entropy (nats) above which the reasoner takes over.", low=0.0)
    budget: float | None = param(None, _BUDGET_HELP, low=0.0, high=1.0)
    max_takeovers: int | None = param(None, _MAX_HELP, low=0)
    skip_first: int = param(0, _SKIP_HELP, low=0, quiet_default=True)

    def takeover(self, step: Step) -> np.ndarray:
        return (step.entropy_base > self.threshold) & (step.t >= self.skip_first) & within_budget(
            step.taken, step.limit, self.budget, self.max_takeovers)

    knob: ClassVar[str | None] = "threshold"

    def signal(self, trace: Trace, pair: Any = None) -> np.ndarray:
        return np.asarray(trace.metrics["entropy_base"], dtype=np.float64)

    def diagnose(self, traces: Sequence[Trace]) -> str | None:
        return _silent(self, traces, f"the base's entropy never exceeded threshold="
                       f"{self.threshold:g} nats; lower it (see the entropy_base column of a BaseOnly trace)")


def top_two(trace: Trace) -> np.ndarray:
    """(T, 2) the base's two largest probabilities at each position of `trace` (from its stored top-k)."""
    probs = np.asarray(trace.topk["base"][1], dtype=np.float64).reshape(len(trace), -1)
    if probs.shape[1] < 2:
        probs = np.concatenate([probs, np.zeros((len(trace), 2 - probs.shape[1]))], axis=1)
    return probs[:, :2]


def _top2(step: Step) -> np.ndarray:
    if step.top2 is None:
        raise InvalidInputError("this gate reads the base's top-2 probabilities: run it through the lazy engine path")
    return np.asarray(step.top2, dtype=np.float64)


@dataclass
class TopProb(Policy):
    """Nudging's gate: take over where the base's top-1 probability is below `gamma` (the base yields where
    it is unsure of its own best token). Lazy: the reasoner runs only where it fires."""

    name: ClassVar[str] = "top_prob"
    label: ClassVar[str] = "TopProb"
    help: ClassVar[str] = "Take over where the base's top-1 probability is below gamma (Nudging)."
    lazy: ClassVar[bool] = True
    gamma: float = param(0.3, "Base top-1 probability below which the reasoner takes over (Nudging: 0.3-0.4).",
                         low=0.0, high=1.0)
    budget: float | None = param(None, _BUDGET_HELP, low=0.0, high=1.0)
    max_takeovers: int | None = param(None, _MAX_HELP, low=0)
    skip_first: int = param(0, _SKIP_HELP, low=0, quiet_default=True)

    def takeover(self, step: Step) -> np.ndarray:
        return (_top2(step)[:, 0] < self.gamma) & (step.t >= self.skip_first) & within_budget(
            step.taken, step.limit, self.budget, self.max_takeovers)

    knob: ClassVar[str | None] = "gamma"
    fires_below: ClassVar[bool] = True

    def signal(self, trace: Trace, pair: Any = None) -> np.ndarray:
        return top_two(trace)[:, 0]

    def diagnose(self, traces: Sequence[Trace]) -> str | None:
        return _silent(self, traces, f"the base's top-1 probability never fell below gamma={self.gamma:g}; raise it")


@dataclass
class Margin(Policy):
    """Take over where the base's top-1 and top-2 probabilities are within `delta` of each other (a close
    call between two continuations). Lazy: the reasoner runs only where it fires."""

    name: ClassVar[str] = "margin"
    label: ClassVar[str] = "Margin"
    help: ClassVar[str] = "Take over where the base's top-1 minus top-2 probability is below delta."
    lazy: ClassVar[bool] = True
    delta: float = param(0.1, "Top-1 minus top-2 base probability below which the reasoner takes over.",
                         low=0.0, high=1.0)
    budget: float | None = param(None, _BUDGET_HELP, low=0.0, high=1.0)
    max_takeovers: int | None = param(None, _MAX_HELP, low=0)
    skip_first: int = param(0, _SKIP_HELP, low=0, quiet_default=True)

    def takeover(self, step: Step) -> np.ndarray:
        top = _top2(step)
        return ((top[:, 0] - top[:, 1]) < self.delta) & (step.t >= self.skip_first) & within_budget(
            step.taken, step.limit, self.budget, self.max_takeovers)

    knob: ClassVar[str | None] = "delta"
    fires_below: ClassVar[bool] = True

    def signal(self, trace: Trace, pair: Any = None) -> np.ndarray:
        top = top_two(trace)
        return top[:, 0] - top[:, 1]

    def diagnose(self, traces: Sequence[Trace]) -> str | None:
        return _silent(self, traces, f"the base's top-1/top-2 margin never fell below delta={self.delta:g}; raise it")


@dataclass
class RouterGate(Policy):
    """A learned gate (core.train_router): a small classifier over what the base alone has at step t (its last
    hidden state, entropy, top-1 probability, margin, relative position) fires where its probability exceeds
    `cut` (default: the card's cut for takeover rate `ratio`). Lazy: the reasoner runs only where it fires. A
    router made for another pair is refused."""

    name: ClassVar[str] = "router"
    label: ClassVar[str] = "Router"
    help: ClassVar[str] = "Take over where a learned router over the base's own state fires (core.train_router)."
    lazy: ClassVar[bool] = True
    knob: ClassVar[str | None] = "cut"
    path: str = param("router", "Folder of the trained router (router.safetensors + card.json).")
    ratio: float = param(settings.RATIO, "Takeover rate whose cut the router's card gives (when cut is empty).",
                         low=0.0, high=1.0, open_range=True)
    cut: float | None = param(None, "Router probability above which the reasoner takes over (empty = the card's "
                              "cut for ratio; set by equal-ρ calibration).", low=0.0, high=1.0)
    weights: str = param("unchecked", "SHA-256 of the router's weights (recorded; a changed file is refused).",
                         quiet_default=True)
    budget: float | None = param(None, _BUDGET_HELP, low=0.0, high=1.0)
    max_takeovers: int | None = param(None, _MAX_HELP, low=0)
    skip_first: int = param(0, _SKIP_HELP, low=0, quiet_default=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._loaded: Any = None

    @property
    def router(self) -> Any:
        """The router in `path`, read on first use (its weights' hash and, without a cut, the card's cut for
        `ratio` are filled in then; a file that is not the recorded one is refused)."""
        if self._loaded is None:
            loaded = load_router(self.path)
            sha = str(loaded.card["weights_sha256"])
            if self.weights not in ("unchecked", sha):
                raise InvalidInputError(f"the router in {self.path} is not the one recorded (weights {sha[:12]}..., "
                                        f"recorded {self.weights[:12]}...): it was retrained or replaced")
            self.weights = sha
            if self.cut is None:
                self.cut = loaded.cut_for(self.ratio)
            self._loaded = loaded
        return self._loaded

    def record(self) -> dict[str, Any]:
        self.router  # noqa: B018  (read first: the record names the weights and the cut)
        return super().record()

    def check_pair(self, pair: Any) -> None:
        check_router_pair(self.router.card, pair, self.path)

    def takeover(self, step: Step) -> np.ndarray:
        if step.hidden_base is None:
            raise InvalidInputError("the router reads the base's hidden state: run it through the lazy engine path")
        feats = step_features(step.hidden_base, step.entropy_base, _top2(step), step.t, step.limit)
        fires = self.router.net.prob(feats) > float(self.cut)
        return fires & (step.t >= self.skip_first) & within_budget(step.taken, step.limit, self.budget,
                                                                   self.max_takeovers)

    reads_base_state: ClassVar[bool] = True  # its signal: `prob` of the base's features along a trace

    def prob(self, features: np.ndarray) -> np.ndarray:
        """(N,) the router's probabilities from (N, F) features (core/decoding/router_features.py along a trace)."""
        return self.router.net.prob(features)

    def signal(self, trace: Trace, pair: Any = None) -> np.ndarray:
        raise InvalidInputError("the router's signal along a trace needs a forward of the base: "
                                "core.decoding.calibration.gate_signal(policy, trace, pair)")

    def diagnose(self, traces: Sequence[Trace]) -> str | None:
        return _silent(self, traces, f"the router's probability never exceeded cut={self.cut:g}; lower it or raise ratio")


@dataclass
class RandomPositions(Policy):
    """Baseline: take over at random positions with probability `rate`. The draw at step t of a row
    depends only on (seed, the row's identity, t): the same in any batch size or order, and a branch
    (which starts mid-response on its parent's row) replays its parent's draws."""

    name: ClassVar[str] = "random_positions"
    label: ClassVar[str] = "RandomPositions"
    help: ClassVar[str] = "Take over at random positions with probability rate (baseline)."
    rate: float = param(0.05, "Share of positions taken over.", low=0.0, high=1.0)
    seed: int = param(settings.SEED, "Seed of the position draws.", low=0)
    knob: ClassVar[str | None] = "rate"

    def takeover(self, step: Step) -> np.ndarray:
        rows = step.rows if step.rows is not None else range(len(step.taken))
        return np.array([np.random.default_rng([self.seed, int(row), step.t]).random() < self.rate
                         for row in rows], dtype=bool)

    def diagnose(self, traces: Sequence[Trace]) -> str | None:
        return _silent(self, traces, f"rate={self.rate:g} is too small for these lengths")


@dataclass
class EarlyOnly(Policy):
    """Baseline: the reasoner writes the first ceil(rate · max_new_tokens) tokens, then the base."""

    name: ClassVar[str] = "early_only"
    label: ClassVar[str] = "EarlyOnly"
    help: ClassVar[str] = "The reasoner writes the first rate · max_new_tokens tokens (baseline)."
    rate: float = param(0.05, "Share of max_new_tokens written by the reasoner first.", low=0.0, high=1.0)
    seed: int | None = param(None, "Dither the prefix (empty = off): each row's prefix is the whole number below or "
                             "above rate · max_new_tokens, drawn from (seed, row), so that the mean prefix is exactly "
                             "rate · max_new_tokens (a matched ρ below one token per response).", low=0,
                             quiet_default=True)
    knob: ClassVar[str | None] = "rate"

    def takeover(self, step: Step) -> np.ndarray:
        if self.seed is None:
            return np.full(len(step.taken), step.t < math.ceil(self.rate * step.limit - 1e-9))
        n = self.rate * step.limit
        low = math.floor(n + 1e-9)
        rows = step.rows if step.rows is not None else range(len(step.taken))
        extra = np.array([np.random.default_rng([self.seed, int(row)]).random() < n - low for row in rows])
        return step.t < low + extra

    def diagnose(self, traces: Sequence[Trace]) -> str | None:
        return _silent(self, traces, f"rate={self.rate:g} · max_new_tokens rounds to 0")


@dataclass
class Forced(Policy):
    """Takeovers exactly where the user says: {pos: token_id} emits that token ("forced"),
    {pos: "reason"} lets the reasoning model choose there."""

    name: ClassVar[str] = "forced"
    label: ClassVar[str] = "Forced"
    help: ClassVar[str] = "Emit given tokens (or the reasoner's choice) at given positions."
    internal: ClassVar[bool] = True
    at: dict[int, int | str] = param({}, "{position: token id or 'reason'}.")  # noqa: RUF009  (param gives a default_factory)

    def __post_init__(self) -> None:
        super().__post_init__()
        clean: dict[int, int | str] = {}
        for pos, what in dict(self.at).items():
            if isinstance(pos, str) and pos.isdigit():  # as read back from JSON
                pos = int(pos)
            if not isinstance(pos, (int, np.integer)) or pos < 0:
                raise InvalidInputError(f"Forced positions must be non-negative ints, got {pos!r}")
            if not (what == REASON or (isinstance(what, (int, np.integer)) and what >= 0)):
                raise InvalidInputError(f"Forced value at {pos} must be a token id or 'reason', got {what!r}")
            clean[int(pos)] = what if what == REASON else int(what)
        self.at = clean

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "params": {"at": {str(k): v for k, v in sorted(self.at.items())}}}

    def takeover(self, step: Step) -> np.ndarray:
        return np.full(len(step.taken), self.at.get(step.t) == REASON)

    def forced_token(self, t: int) -> int | None:
        value = self.at.get(t)
        return value if isinstance(value, int) else None


POLICIES: dict[str, type[Policy]] = {}


def register_policy(cls: type[Policy]) -> type[Policy]:
    """Add a policy class (a dataclass subclass of `Policy`) to the registry; usable as a decorator."""
    if not (isinstance(cls, type) and issubclass(cls, Policy) and hasattr(cls, "__dataclass_fields__")):
        raise InvalidInputError(f"register_policy needs a dataclass subclass of Policy, got {cls!r}")
    POLICIES[cls.name] = cls
    return cls


for _cls in (BaseOnly, Guided, EntropyGated, TopProb, Margin, RouterGate, RandomPositions, EarlyOnly, ReasonOnly, Forced):
    register_policy(_cls)


def policy_spec(name: str) -> PolicySpec:
    """The spec of the registered policy `name`, or raise with the valid names."""
    if name not in POLICIES:
        raise InvalidInputError(f"Unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    cls = POLICIES[name]
    params = declared_params(cls)
    return PolicySpec(name=name, label=cls.label, help=cls.help, params=params, cls=cls, lazy=cls.lazy,
                      needs_gate=any(p.from_gate for p in params), calibration=cls.calibration,
                      internal=cls.internal)


def list_policies(include_internal: bool = False) -> list[PolicySpec]:
    """Specs of the registered policies a user may choose (plus Forced with include_internal=True)."""
    specs = [policy_spec(name) for name in POLICIES]
    return [s for s in specs if include_internal or not s.internal]


def make_policy(name: str, *, gate: Gate | None = None, **params: Any) -> Policy:
    """The one constructor from user input: `make_policy("guided", gate=gate, budget=0.1)`.

    Unknown names or parameters raise InvalidInputError with the valid choices; values are checked
    against the declared ranges. A gate-based policy takes `gate=` (a calibrated `Gate`) or explicit
    tau/lam/window; unspecified parameters take their declared defaults.
    """
    spec = policy_spec(name)
    known = {p.name for p in spec.params}
    unknown = sorted(set(params) - known)
    if unknown:
        raise InvalidInputError(f"Policy {name!r} has no parameter {', '.join(map(repr, unknown))}; it takes: "
                                f"{', '.join(sorted(known)) or 'none'}")
    gated = [p.name for p in spec.params if p.from_gate]
    if gate is not None:
        if not spec.needs_gate:
            raise InvalidInputError(f"Policy {name!r} takes no gate; only {', '.join(gate_policies())} do")
        if set(gated) & set(params):
            raise InvalidInputError(f"Give either gate= or {'/'.join(gated)}, not both")
        params.update({p: getattr(gate, p) for p in gated})
    elif spec.needs_gate and "tau" not in params:
        raise InvalidInputError(f"Policy {name!r} needs a calibrated gate: make_policy({name!r}, gate="
                                f"calibrate(pair, problems, ratio=..., window=...)) or explicit tau/lam/window")
    return spec.cls(**{k: spec.param(k).check(v, name) for k, v in params.items()})


def gate_policies() -> list[str]:
    """Names of the policies built from a calibrated gate."""
    return [s.name for s in list_policies(include_internal=True) if s.needs_gate]


def policy_from_record(record: dict[str, Any]) -> Policy:
    """Rebuild a policy from its `record()` (e.g. a trace's meta["policy"]) through `make_policy`."""
    if not isinstance(record, dict):
        raise InvalidInputError(f"A policy record is a dict with 'name' and 'params', got {record!r}")
    return make_policy(str(record.get("name")), **dict(record.get("params") or {}))
