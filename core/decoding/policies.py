"""When the reasoning model takes over: small policy objects, each declaring its parameters once.

A policy sees one decoding step of a batch (`Step`) and returns, per row, whether the reasoning model
emits this token; the engine (core/decoding/engine.py) does everything else. Each parameter is a
dataclass field made with `param(...)` (default, range, help), and `make_policy(name, **params)` is the
one way user input becomes a policy: the CLI's options and the app's widgets are built from
`list_policies()`.

This module holds the registry (`POLICIES`, `make_policy`, `list_policies`, `policy_from_record`), Guided and the
baselines; the base class is in `policy_base.py` and the gates on the base alone (EntropyGated, TopProb, Margin,
RouterGate) in `lazy_gates.py`. Their names are importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from core import settings
from core.annotate.spikes import Gate, gate_fires
from core.decoding.lazy_gates import EntropyGated, Margin, RouterGate, TopProb, top_two
from core.decoding.params import Param, declared_params, param
from core.decoding.policy_base import (
    BUDGET_HELP,
    MAX_HELP,
    SKIP_HELP,
    Policy,
    Step,
    no_takeover_notice,
    row_identity,
    within_budget,
)
from core.errors import InvalidInputError
from core.scoring.registry import DEFAULT_SCORE, GATE_SCORES, check_gate_score, score_values
from core.trace import Trace

__all__ = [
    "POLICIES", "REASON", "BaseOnly", "EarlyOnly", "EntropyGated", "Forced", "Guided", "Margin", "Param", "Policy",
    "PolicySpec", "RandomPositions", "ReasonOnly", "RouterGate", "Step", "TopProb", "gate_policies", "list_policies",
    "make_policy", "param", "policy_from_record", "policy_spec", "register_policy", "row_identity", "top_two",
    "within_budget",
]  # fmt: skip

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
    budget: float | None = param(None, BUDGET_HELP, low=0.0, high=1.0)
    score: str = param(DEFAULT_SCORE, "Disagreement score the gate reads.", choices=GATE_SCORES)
    max_takeovers: int | None = param(None, MAX_HELP, low=0)
    skip_first: int = param(0, SKIP_HELP, low=0, quiet_default=True)

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
        return no_takeover_notice(self, traces, f"{self.score} never passed the gate (τ={self.tau:.3g}, "
                       f"λ={self.lam:.3g}); calibrate with a larger ratio r")


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
        return no_takeover_notice(self, traces, f"rate={self.rate:g} is too small for these lengths")


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
        return no_takeover_notice(self, traces, f"rate={self.rate:g} · max_new_tokens rounds to 0")


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
    elif spec.needs_gate and not explicit_gate(params):
        raise InvalidInputError(f"Policy {name!r} needs a calibrated gate: make_policy({name!r}, gate="
                                f"calibrate(pair, problems, ratio=..., window=...)) or explicit tau/lam/window")
    policy = spec.cls(**{k: spec.param(k).check(v, name) for k, v in params.items()})
    if gate is not None and gate.ratio is not None:
        policy.fit = {"ratio": gate.ratio, "window": gate.window}
    return policy


GATE_THRESHOLDS = ("tau", "lam")  # a calibrated Gate's two thresholds (its window has a default)


def explicit_gate(params: Mapping[str, Any]) -> bool:
    """Whether `params` set a gate policy's thresholds by hand; one without the other is refused (the missing one
    would silently take its declared default, not a calibrated value)."""
    given = [name for name in GATE_THRESHOLDS if name in params]
    if len(given) == 1:
        raise InvalidInputError(f"tau and lam (--tau, --lam) go together: give both, or neither to calibrate the "
                                f"gate on problems; only {given[0]} was given")
    return bool(given)


def gate_policies() -> list[str]:
    """Names of the policies built from a calibrated gate."""
    return [s.name for s in list_policies(include_internal=True) if s.needs_gate]


def policy_from_record(record: dict[str, Any]) -> Policy:
    """Rebuild a policy from its `record()` (e.g. a trace's meta["policy"]) through `make_policy`."""
    if not isinstance(record, dict):
        raise InvalidInputError(f"A policy record is a dict with 'name' and 'params', got {record!r}")
    return make_policy(str(record.get("name")), **dict(record.get("params") or {}))
