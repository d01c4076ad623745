"""What every takeover policy is: the `Policy` base class, the `Step` it decides from, and the helpers that
gates share (the takeover budget, the "made no takeover" notice, per-row identities).

The concrete policies live in `policies.py` (the registry, Guided and the baselines) and `lazy_gates.py` (the
gates on the base alone); both build on this module.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from core.decoding.params import declared_params
from core.errors import InvalidInputError
from core.scoring.registry import DEFAULT_SCORE
from core.trace import Trace


@dataclass
class Step:
    """What a policy may look at when deciding step t (response index) for B rows.

    score: (B,) the policy's score at t, or None for lazy policies (reasoner not run yet).
    entropy_base: (B,) base entropy at t. history: per row, the gate's values at earlier steps (the
    scores; base entropies for lazy policies). taken: (B,) takeovers so far. limit: max_new_tokens.
    rows: (B,) each row's identity (from its prompt and sample index, see `row_identity`): the same in
    any batch, order or branch of it, so per-row random draws do not depend on how rows are batched.
    top2: (B, 2) the base's two largest probabilities at t (lazy policies get it; None otherwise);
    hidden_base: (B, d) the base's last hidden state (the one predicting t), for a lazy policy that declares
    `reads_base_state` (the router); None otherwise.
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
    reads_base_state: ClassVar[bool] = False  # its gate reads the base's last hidden state (Step.hidden_base)
    calibration: ClassVar[tuple[str, ...]] = ()  # settings a calibration step reads before building
    internal: ClassVar[bool] = False
    # The one parameter equal-ρ calibration (core.decoding.calibration.equal_rho) sets from base rollouts, and
    # whether the gate fires where `signal` is above it (False: below). None: not a gate with a knob.
    knob: ClassVar[str | None] = None
    fires_below: ClassVar[bool] = False
    # How a calibration set this policy's thresholds ({"ratio": r, "window": W, "problems": n} or {"rho": ρ, ...}),
    # kept per instance and written to each trace's meta["calibration"]; not a parameter, so not in its key.
    fit: ClassVar[dict[str, Any] | None] = None
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


def no_takeover_notice(policy: Policy, traces: Sequence[Trace], why: str) -> str | None:
    """The notice for a policy that made no takeover in `traces` (None when it made one, or no tokens)."""
    n_tokens = sum(len(t) for t in traces)
    if n_tokens == 0 or any(t.n_takeovers for t in traces):
        return None
    return f"{policy.label} made 0 takeovers in {len(traces)} trace(s) ({n_tokens} tokens): {why}"


BUDGET_HELP = "Cap on takeovers as a share of max_new_tokens (empty = no cap, as in the paper)."
MAX_HELP = "Cap on takeovers per response (empty = no cap)."
SKIP_HELP = ("The gate never fires at the first k response positions (0 = the paper's gate). For a pair whose "
              "formats differ at the start of the response, e.g. a raw base beside a chat model without a "
              "thinking mode, where t = 0 is an artefact spike.")

