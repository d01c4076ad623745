"""The gates that read the base model alone: EntropyGated (entropy), TopProb (Nudging's top-1 probability),
Margin (top-1 minus top-2) and RouterGate (a learned router over the base's state).

All are lazy: the engine runs the reasoner only where they fire (and fills its metrics afterwards). They are
registered in `policies.py`'s registry like every other policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from core import settings
from core.decoding.params import param
from core.decoding.policy_base import (
    BUDGET_HELP,
    MAX_HELP,
    SKIP_HELP,
    Policy,
    Step,
    no_takeover_notice,
    within_budget,
)
from core.decoding.router import check_router_pair, load_router, step_features
from core.errors import InvalidInputError
from core.trace import Trace


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
    budget: float | None = param(None, BUDGET_HELP, low=0.0, high=1.0)
    max_takeovers: int | None = param(None, MAX_HELP, low=0)
    skip_first: int = param(0, SKIP_HELP, low=0, quiet_default=True)

    def takeover(self, step: Step) -> np.ndarray:
        return (step.entropy_base > self.threshold) & (step.t >= self.skip_first) & within_budget(
            step.taken, step.limit, self.budget, self.max_takeovers)

    knob: ClassVar[str | None] = "threshold"

    def signal(self, trace: Trace, pair: Any = None) -> np.ndarray:
        return np.asarray(trace.metrics["entropy_base"], dtype=np.float64)

    def diagnose(self, traces: Sequence[Trace]) -> str | None:
        return no_takeover_notice(self, traces, f"the base's entropy never exceeded threshold="
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
    budget: float | None = param(None, BUDGET_HELP, low=0.0, high=1.0)
    max_takeovers: int | None = param(None, MAX_HELP, low=0)
    skip_first: int = param(0, SKIP_HELP, low=0, quiet_default=True)

    def takeover(self, step: Step) -> np.ndarray:
        return (_top2(step)[:, 0] < self.gamma) & (step.t >= self.skip_first) & within_budget(
            step.taken, step.limit, self.budget, self.max_takeovers)

    knob: ClassVar[str | None] = "gamma"
    fires_below: ClassVar[bool] = True

    def signal(self, trace: Trace, pair: Any = None) -> np.ndarray:
        return top_two(trace)[:, 0]

    def diagnose(self, traces: Sequence[Trace]) -> str | None:
        return no_takeover_notice(self, traces, f"the base's top-1 probability never fell below gamma={self.gamma:g}; raise it")


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
    budget: float | None = param(None, BUDGET_HELP, low=0.0, high=1.0)
    max_takeovers: int | None = param(None, MAX_HELP, low=0)
    skip_first: int = param(0, SKIP_HELP, low=0, quiet_default=True)

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
        return no_takeover_notice(self, traces, f"the base's top-1/top-2 margin never fell below delta={self.delta:g}; raise it")


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
    budget: float | None = param(None, BUDGET_HELP, low=0.0, high=1.0)
    max_takeovers: int | None = param(None, MAX_HELP, low=0)
    skip_first: int = param(0, SKIP_HELP, low=0, quiet_default=True)

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

    reads_base_state: ClassVar[bool] = True  # its signal along a trace: `prob` of the base's features there

    def prob(self, features: np.ndarray) -> np.ndarray:
        """(N,) the router's probabilities from (N, F) features (core/decoding/router_features.py along a trace)."""
        return self.router.net.prob(features)

    def signal(self, trace: Trace, pair: Any = None) -> np.ndarray:
        raise InvalidInputError("the router's signal along a trace needs a forward of the base: "
                                "core.decoding.calibration.gate_signal(policy, trace, pair)")

    def diagnose(self, traces: Sequence[Trace]) -> str | None:
        return no_takeover_notice(self, traces, f"the router's probability never exceeded cut={self.cut:g}; lower it or raise ratio")
