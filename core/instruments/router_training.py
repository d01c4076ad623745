"""Training a learned gate (`core.train_router`): a small torch classifier over what the base alone has at
step t (core/decoding/router.py's features), fit on stored traces of one pair to one of two targets:

- "gate": where the paper's calibrated disagreement gate fires along these traces (τ, λ fit on them at
  `ratio`), so the router learns to find those positions without running the reasoner;
- "effect": where a measured takeover helped (effect > 0 in the `takeover_effects` rows that the store's
  continuations give; only measured positions are examples).

A quarter of the traces (by key) is held out; the card records the held-out AUROC and the cut per ρ.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core import settings
from core.analysis.failure import auroc
from core.annotate.spikes import calibrate_gate, gate_positions
from core.decoding.router import (
    CARD_RHOS,
    FEATURES,
    Router,
    RouterNet,
    keys_fingerprint,
    pair_fingerprint,
    save_router,
)
from core.decoding.router_features import trace_features
from core.errors import InvalidInputError
from core.instruments.effects import stored_effects
from core.scoring.registry import check_score, score_values
from core.trace import Trace

log = logging.getLogger(__name__)

TARGETS = ("gate", "effect")
HOLDOUT = 0.25  # share of traces held out for the card's AUROC


def gate_labels(traces: Sequence[Trace], ratio: float, window: int, score: str) -> list[np.ndarray]:
    """Per trace, (T,) bool: where the paper's gate, calibrated on these traces at `ratio`, fires."""
    scores = [np.asarray(score_values(t.metrics, score), dtype=np.float64) for t in traces]
    gate = calibrate_gate(scores, ratio, window)
    out = []
    for s in scores:
        y = np.zeros(len(s), dtype=bool)
        y[gate_positions(s, gate)] = True
        out.append(y)
    return out


def effect_labels(store: Any, traces: Sequence[Trace], score: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per trace, (measured positions, whether the reasoner's token there helped: effect > 0)."""
    out, kids = [], store.children_index()
    for t in traces:
        rows = stored_effects(store, t, score=score, children=kids.get(t.key, []))
        out.append((rows["pos"].to_numpy(dtype=np.int64), rows["effect"].to_numpy(dtype=np.float64) > 0))
    return out


def _split(keys: Sequence[str], seed: int) -> np.ndarray:
    """(n,) bool: held out (a quarter of the traces, by a seeded shuffle of their order; at least one each side)."""
    n = len(keys)
    order = np.random.default_rng(seed).permutation(n)
    held = np.zeros(n, dtype=bool)
    held[order[: max(1, round(HOLDOUT * n))]] = True
    if held.all():
        held[order[-1]] = False
    return held


def fit_router(x: np.ndarray, y: np.ndarray, *, hidden: int = 0, epochs: int = 300, lr: float = 0.05,
               weight_decay: float = 1e-3, seed: int = settings.SEED) -> RouterNet:
    """A `RouterNet` fit in torch by full-batch Adam on (N, F) features and (N,) labels (positives weighted up to
    balance the classes), returned as numpy arrays (routing needs no torch)."""
    if len(np.unique(y)) < 2:
        raise InvalidInputError(f"the router's training labels are all {bool(y[0]) if len(y) else '?'}: "
                                "no positions of both kinds (more traces, or another target)")
    torch.manual_seed(seed)
    xt, yt = torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))
    mean, scale = xt.mean(0), xt.std(0).clamp_min(1e-6)
    sizes = [x.shape[1], hidden, 1] if hidden else [x.shape[1], 1]
    layers = [torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
    body = torch.nn.Sequential(*[m for layer in layers for m in (layer, torch.nn.ReLU())][:-1])
    pos = float(yt.sum())
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor((len(yt) - pos) / max(pos, 1.0)))
    opt = torch.optim.Adam(body.parameters(), lr=lr, weight_decay=weight_decay)
    xs = (xt - mean) / scale
    for _ in range(epochs):
        opt.zero_grad()
        loss = loss_fn(body(xs).squeeze(-1), yt)
        loss.backward()
        opt.step()
    tensors = {"mean": mean.numpy(), "scale": scale.numpy()}
    for i, layer in enumerate(layers):
        tensors[f"w{i}"] = layer.weight.detach().numpy().copy()
        tensors[f"b{i}"] = layer.bias.detach().numpy().copy()
    return RouterNet(tensors)


def cuts_per_rho(probs: np.ndarray, rhos: Sequence[float] = CARD_RHOS) -> dict[str, float]:
    """{ρ: the probability above which a share ρ of `probs` lies} (the card's thresholds)."""
    return {f"{r:g}": float(np.quantile(probs, 1.0 - r)) for r in rhos} if len(probs) else {}


def train_router(pair: Any, traces: Sequence[Trace], target: str | Callable[[Trace], Any] = "gate", *, out: str | Path | None = None,
                 store: Any = None, ratio: float = settings.RATIO, window: int = settings.WINDOW,
                 score: str = settings.SCORE, hidden: int = 0, epochs: int = 300, seed: int = settings.SEED,
                 features: Callable[[Any, Trace], np.ndarray] = trace_features) -> Router:
    """Fit a router on `traces` (this pair's, e.g. its base rollouts) to `target` ("gate" or "effect", see the
    module doc, or a function trace -> (T,) bool labels); with `out`, save it there (router.safetensors + card.json). `hidden` = 0: logistic regression,
    else one hidden layer of that width. `features(pair, trace)` -> (T, F) (default: the base's own state,
    `trace_features`). The card names the pair, the features, the target, the training keys and their
    fingerprint, the held-out AUROC and the cut per ρ."""
    custom = callable(target)
    if not custom and target not in TARGETS:
        raise InvalidInputError(f"router target must be one of: {', '.join(TARGETS)} (or a function trace -> (T,) "
                                f"bool labels); got {target!r}")
    check_score(score)
    traces = [t for t in traces if len(t)]
    if len(traces) < 2:
        raise InvalidInputError(f"train_router needs at least 2 non-empty traces, got {len(traces)}")
    mine = pair.fingerprint()
    other = [t.key for t in traces if (t.meta.get("request") or {}).get("pair") not in (None, mine)]
    if other:
        raise InvalidInputError(f"{len(other)} of the traces were made with another model pair (first: {other[0]}); "
                                "a router learns one pair's base state")
    if custom:
        per_trace = [(np.arange(len(t)), np.asarray(target(t), dtype=bool).reshape(len(t))) for t in traces]
    elif target == "gate":
        per_trace = [(np.arange(len(t)), y) for t, y in zip(traces, gate_labels(traces, ratio, window, score))]
    else:
        if store is None:
            raise InvalidInputError("target 'effect' reads measured takeover effects from a store: pass store=")
        per_trace = effect_labels(store, traces, score)
    keep = [i for i, (pos, _) in enumerate(per_trace) if len(pos)]
    if len(keep) < 2:
        raise InvalidInputError(f"target {target!r}: fewer than 2 traces have labelled positions (for 'effect', "
                                "measure takeover effects on them first: `forkpoint effects`)")
    traces, per_trace = [traces[i] for i in keep], [per_trace[i] for i in keep]
    held = _split([t.key for t in traces], seed)
    xs, ys, every = [], [], []
    for t, (pos, y) in zip(traces, per_trace):
        full = features(pair, t)
        every.append(full)
        xs.append(full[pos])
        ys.append(np.asarray(y, dtype=bool))
    x_train = np.concatenate([x for x, h in zip(xs, held) if not h])
    y_train = np.concatenate([y for y, h in zip(ys, held) if not h])
    x_held = np.concatenate([x for x, h in zip(xs, held) if h])
    y_held = np.concatenate([y for y, h in zip(ys, held) if h])
    net = fit_router(x_train, y_train, hidden=hidden, epochs=epochs, seed=seed)
    held_auroc = auroc(net.prob(x_held), y_held)
    card = {
        "features": list(FEATURES), "n_features": int(x_train.shape[1]), "hidden": int(hidden),
        "target": getattr(target, "__name__", "custom") if custom else target,
        "target_params": ({"ratio": ratio, "window": window, "score": score} if target == "gate" else
                          {} if custom else {"score": score}),
        "training_keys": [t.key for t, h in zip(traces, held) if not h],
        "held_out_keys": [t.key for t, h in zip(traces, held) if h],
        "training_fingerprint": keys_fingerprint([t.key for t in traces]),
        "pair": pair_fingerprint(pair),
        "pair_models": {side: pair.specs[side].id for side in ("base", "reason")},
        "positives": {"train": int(y_train.sum()), "train_of": int(len(y_train)), "held_out": int(y_held.sum()),
                      "held_out_of": int(len(y_held))},
        "held_out_auroc": None if np.isnan(held_auroc) else float(held_auroc),
        "thresholds": cuts_per_rho(net.prob(np.concatenate(every))), "epochs": epochs, "seed": seed,
    }
    log.info("router (%s) on %d traces: held-out AUROC %.3f", target, len(traces), held_auroc)
    if out is not None:
        card = save_router(out, net, card)
    return Router(net, card)
