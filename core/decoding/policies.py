"""When the reasoning model takes over: small policy objects, each with a name and recorded parameters.

A policy sees one decoding step of a batch (`Step`) and returns, per row, whether the reasoning model
emits this token. The engine (core/decoding.py) does everything else.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from core.spike_rules import Gate, gate_fires
from core.metrics import DEFAULT_SCORE, check_score
from core.errors import InvalidInputError

REASON = "reason"  # Forced({pos: REASON}): the reasoning model picks the token at pos


@dataclass
class Step:
    """What a policy may look at when deciding step t (response index) for B rows.

    score: (B,) the policy's score at t, or None for lazy policies (reasoner not run yet).
    entropy_base: (B,) base entropy at t. history: per row, the scores of earlier steps.
    taken: (B,) takeovers so far. limit: max_new_tokens.
    """

    t: int
    score: np.ndarray | None
    entropy_base: np.ndarray
    history: list[list[float]]
    taken: np.ndarray
    limit: int


class Policy:
    """Base class. `lazy` policies gate on base entropy only, so the engine runs the reasoner on demand."""

    name: ClassVar[str] = "policy"
    lazy: ClassVar[bool] = False
    score: str = DEFAULT_SCORE

    def takeover(self, step: Step) -> np.ndarray:  # (B,) bool
        raise NotImplementedError

    def forced_token(self, t: int) -> int | None:
        """A token id the user fixed at step t (only `Forced` has any)."""
        return None

    def record(self) -> dict[str, Any]:
        """Name and parameters, as stored in every trace's meta["policy"]."""
        params = {k: v for k, v in asdict(self).items()}  # type: ignore[call-overload]
        return {"name": self.name, "params": params}


def _check_rate(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0 and math.isfinite(value)):
        raise InvalidInputError(f"{name} must be a fraction in [0, 1], got {value!r}")
    return float(value)


def within_budget(taken: np.ndarray, t: int, budget: float, max_takeovers: int | None) -> np.ndarray:
    """(B,) bool: one more takeover keeps the count ≤ ceil(budget · (t+1)) and under the absolute cap."""
    ok = taken + 1 <= math.ceil(budget * (t + 1) - 1e-9)
    if max_takeovers is not None:
        ok &= taken < max_takeovers
    return ok


@dataclass
class BaseOnly(Policy):
    """The base model writes every token (the reasoner still scores each one)."""

    name: ClassVar[str] = "base_only"

    def takeover(self, step: Step) -> np.ndarray:
        return np.zeros(len(step.taken), dtype=bool)


@dataclass
class ReasonOnly(Policy):
    """The reasoning model writes every token, with its own prompt: the reference upper bound."""

    name: ClassVar[str] = "reason_only"

    def takeover(self, step: Step) -> np.ndarray:
        return np.ones(len(step.taken), dtype=bool)


@dataclass
class Guided(Policy):
    """Disagreement-guided takeover: s_t > tau and s_t > lam · mean(previous `window` scores),
    within `budget` (fraction of tokens so far) and `max_takeovers` (absolute cap, None = none)."""

    name: ClassVar[str] = "guided"
    tau: float = 0.0
    lam: float = 1.0
    window: int = 16
    budget: float = 0.1
    score: str = DEFAULT_SCORE
    max_takeovers: int | None = None

    def __post_init__(self) -> None:
        check_score(self.score)
        if self.score == "delta_logp":
            raise InvalidInputError("delta_logp depends on the emitted token, so it cannot gate a takeover; "
                                    "use cross_entropy, kl_base_reason, kl_reason_base, jsd or entropy_base")
        _check_rate("budget", self.budget)
        self.gate = Gate(self.tau, self.lam, self.window)

    @classmethod
    def from_gate(cls, gate: Gate, budget: float = 0.1, **kwargs: Any) -> Guided:
        return cls(tau=gate.tau, lam=gate.lam, window=gate.window, budget=budget, **kwargs)

    def record(self) -> dict[str, Any]:
        params = {"tau": self.tau, "lam": self.lam, "window": self.window, "budget": self.budget,
                  "score": self.score, "max_takeovers": self.max_takeovers}
        return {"name": self.name, "params": params}

    def takeover(self, step: Step) -> np.ndarray:
        assert step.score is not None
        fires = np.array([gate_fires(h, float(s), self.gate) for h, s in zip(step.history, step.score)])
        return fires & within_budget(step.taken, step.t, self.budget, self.max_takeovers)


@dataclass
class EntropyGated(Policy):
    """Take over where the base model is uncertain: entropy_base > threshold (nats), within `budget`.

    The reasoner is run only when a takeover is considered (lazy catch-up of its cache).
    """

    name: ClassVar[str] = "entropy_gated"
    lazy: ClassVar[bool] = True
    threshold: float = 1.0
    budget: float = 0.1
    max_takeovers: int | None = None

    def __post_init__(self) -> None:
        _check_rate("budget", self.budget)
        if not math.isfinite(self.threshold) or self.threshold < 0:
            raise InvalidInputError(f"threshold must be a non-negative entropy in nats, got {self.threshold!r}")

    def takeover(self, step: Step) -> np.ndarray:
        return (step.entropy_base > self.threshold) & within_budget(step.taken, step.t, self.budget,
                                                                     self.max_takeovers)


@dataclass
class RandomPositions(Policy):
    """Baseline: take over at random positions with probability `rate`. The draw at step t of batch row i
    depends only on (seed, i, t), so a branch (which starts mid-response) replays its parent's draws."""

    name: ClassVar[str] = "random_positions"
    rate: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        _check_rate("rate", self.rate)

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "params": {"rate": self.rate, "seed": self.seed}}

    def takeover(self, step: Step) -> np.ndarray:
        return np.array([np.random.default_rng([self.seed, row, step.t]).random() < self.rate
                         for row in range(len(step.taken))], dtype=bool)


@dataclass
class EarlyOnly(Policy):
    """Baseline: the reasoner writes the first ceil(rate · max_new_tokens) tokens, then the base."""

    name: ClassVar[str] = "early_only"
    rate: float = 0.05

    def __post_init__(self) -> None:
        _check_rate("rate", self.rate)

    def takeover(self, step: Step) -> np.ndarray:
        return np.full(len(step.taken), step.t < math.ceil(self.rate * step.limit - 1e-9))


@dataclass
class Forced(Policy):
    """Takeovers exactly where the user says: {pos: token_id} emits that token ("forced"),
    {pos: "reason"} lets the reasoning model choose there."""

    name: ClassVar[str] = "forced"
    at: dict[int, int | str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clean: dict[int, int | str] = {}
        for pos, what in dict(self.at).items():
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


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (BaseOnly, ReasonOnly, Guided, EntropyGated, RandomPositions, EarlyOnly, Forced)
}


def policy_from_record(record: dict[str, Any]) -> Policy:
    """Rebuild a policy from its `record()` (e.g. a trace's meta["policy"])."""
    name = record.get("name")
    if name not in POLICIES:
        raise InvalidInputError(f"Unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    params = dict(record.get("params") or {})
    if name == "forced":
        params["at"] = {int(k): v for k, v in params.get("at", {}).items()}
    return POLICIES[name](**params)
