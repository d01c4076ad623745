"""How long a verify-ahead block is: `BlockSizer` picks each block's length from the recent rate of changed drafts
and the measured cost of the reasoner's pass; `SIZERS` keeps what a run learned for the next run of the same pair,
policy and batch size (on a CPU). The decoding loop (engine.py) asks them; nothing here decodes."""

from __future__ import annotations

import copy
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Sequence

import numpy as np

from core.decoding.policy_base import Policy
from core.pair.loading import ModelPair

MAX_LOOKAHEAD = 64  # the adaptive block size never exceeds this
RATE_WINDOW = 256  # positions over which the change rate that sizes blocks is measured
CUTS = np.array([0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98])  # the base top-1 probabilities a block may end below


class BlockSizer:
    """Sizes verify-ahead blocks from the recent rate q of positions where a block had to stop (the
    emitted token was not the draft) and the cost of the reasoner's pass over n positions in base draft
    steps, c(n) = c0 + c1 n (fitted online: c0 is what one pass costs whatever its length, e.g. reading
    the weights; c1 grows with the rows x positions it computes). n minimises (n + c(n)) / E[positions
    committed per block], E = (1 - (1 - q)^n) / q.

    A block may also end early, at a draft where the base is unsure of its own token (its top-1 probability
    below a cut, in some live row): takeovers that change the text fall where the base is unsure (the paper's
    decision tokens), and a block that ends there wastes no drafts past a change. The cut is chosen with n
    from the recent positions' top-1 probabilities: a cut ending a share s of positions leaves a rate q(cut)
    of changes unforeseen, and (n, cut) minimise ((1 - (1 - s)^n) / s · (1 + c1) + c0) / E, E at rate s + q
    (drafting stops at an unsure position, or at n; a block commits up to its first stop or change). With no
    unsure position before its changes (e.g. random takeovers) the cut stays 0: the blocks above.

    The output depends on n and the cut only through float rounding (a block's matrix products are not one
    token's), which in float32 on a CPU stays far below the 1e-5 the tests allow. In bf16 on a GPU it can flip
    a near-tie, so there (`timed=False`) the cost line is fixed (c0 = 1, c1 = 0: one pass costs about one
    base step) and (n, cut) follow the outputs alone: a run repeats itself exactly, whatever the timings."""

    def __init__(self, timed: bool = True) -> None:
        self.timed = timed
        self.flags: deque[bool] = deque(maxlen=RATE_WINDOW)
        self.tops: deque[float] = deque(maxlen=RATE_WINDOW)  # the base's top-1 probability there (live rows' least)
        self.changes = 0
        self.moments = np.array([1.0, 1.0, 1.0, 1.0, 1.0])  # EMA of 1, n, n², y, n·y (y = pass cost / base step)

    def add(self, positions: int, changed: bool, tops: Sequence[float] | None = None) -> None:
        """A block committed `positions` positions; `changed`: it stopped at a changed one; `tops`: the base's
        top-1 probability at each (its least over live rows; None: sure of every one)."""
        for j in range(positions):
            flag = changed and j == positions - 1
            if len(self.flags) == self.flags.maxlen:
                self.changes -= self.flags[0]
            self.flags.append(flag)
            self.tops.append(1.0 if tops is None else float(tops[j]))
            self.changes += flag

    def observe(self, n: int, base_step_s: float, verify_s: float) -> None:
        """Timings of the last block of n positions: one base draft step, and the reasoner's pass."""
        if self.timed and base_step_s > 0:
            y = min(verify_s / base_step_s, 1e4)
            self.moments = 0.9 * self.moments + 0.1 * np.array([1.0, n, n * n, y, n * y])

    def cost(self) -> tuple[float, float]:
        """(c0, c1) of the least-squares line through the recent (n, cost) pairs (c1 = 0 without spread)."""
        w, sn, snn, sy, sny = self.moments
        var = snn / w - (sn / w) ** 2
        c1 = max(0.0, (sny / w - sn * sy / w**2) / var) if var > 1e-6 else 0.0
        return max(0.0, sy / w - c1 * sn / w), c1

    def plan(self) -> tuple[int, float]:
        """(n, cut): the next block's most positions, and the top-1 probability below which a draft ends it."""
        tops, flags = np.fromiter(self.tops, float, len(self.tops)), np.fromiter(self.flags, bool, len(self.flags))
        unsure = tops[None, :] < CUTS[:, None]  # (cuts, positions)
        total = len(flags) + 4  # a mild prior (1/16 for q) lets blocks grow after a few positions
        s = unsure.sum(1) / total
        r = s + ((flags & ~unsure).sum(1) + 0.25) / total
        c0, c1 = self.cost()
        n = np.arange(1, MAX_LOOKAHEAD + 1)
        drafts = np.where(s[:, None] > 0, (1 - (1 - s[:, None]) ** n) / np.maximum(s[:, None], 1e-12), n)
        per_token = (drafts * (1 + c1) + c0) * r[:, None] / (1 - (1 - r[:, None]) ** n)
        cut, size = np.unravel_index(np.argmin(per_token), per_token.shape)  # ties: the lower cut, the shorter block
        return int(size) + 1, float(CUTS[cut])


class SizerMemory:
    """What verify-ahead learned between runs on a CPU: per pair, policy (as recorded: a switch set counts as the
    policy it switches) and batch size, the last run's `BlockSizer` (its change rate, where the changes fell and the
    reasoner pass's cost). A short response, e.g. a switch's continuation, then starts with the blocks a long run
    settles at instead of the prior's (5-7 positions where 15-25 pay: benchmarks/RESULTS.md, "Peer"). Untimed sizers
    (GPUs) are never kept: their block sizes, and so bf16 rounding, must follow the run's own outputs alone. The
    explicit process-wide cache is `SIZERS`, at most `MAX_KEPT` sizers a pair; a pair's entries go with the pair."""

    MAX_KEPT = 32

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a pair's weakref callback may run inside (garbage collection)
        self._kept: dict[int, tuple[weakref.ref, OrderedDict[tuple[str, int], BlockSizer]]] = {}

    @staticmethod
    def _key(policy: Policy, rows: int) -> tuple[str, int]:
        return str(policy.record()["name"]), rows

    def start(self, pair: ModelPair, policy: Policy, rows: int, timed: bool) -> BlockSizer:
        """A sizer for a run: a copy of the kept one (timed only), else a fresh one."""
        if timed:
            with self._lock:
                ref, kept = self._kept.get(id(pair), (None, OrderedDict()))
                sizer = kept.get(self._key(policy, rows)) if ref is not None and ref() is pair else None
                if sizer is not None:
                    return copy.deepcopy(sizer)
        return BlockSizer(timed=timed)

    def keep(self, pair: ModelPair, policy: Policy, rows: int, sizer: BlockSizer) -> None:
        """Remember a finished run's sizer (timed only; the last run wins)."""
        if not sizer.timed:
            return
        with self._lock:
            ref, kept = self._kept.get(id(pair), (None, OrderedDict()))
            if ref is None or ref() is not pair:
                key = id(pair)
                ref, kept = weakref.ref(pair, lambda _, key=key: self._forget(key)), OrderedDict()
                self._kept[key] = (ref, kept)
            name = self._key(policy, rows)
            kept.pop(name, None)
            kept[name] = sizer
            while len(kept) > self.MAX_KEPT:
                kept.popitem(last=False)

    def _forget(self, key: int) -> None:
        with self._lock:
            entry = self._kept.get(key)
            if entry is not None and entry[0]() is None:
                del self._kept[key]

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


SIZERS = SizerMemory()  # the explicit process-wide cache of what verify-ahead learned (see SizerMemory)
