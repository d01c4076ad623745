"""A learned gate's model at run time: the features the base alone has at step t, the small classifier over
them, and its files (weights as safetensors, a JSON card naming the pair, features, target and training
traces). `core.train_router` (core/instruments/router_training.py) makes one; the `router` policy reads it.

Features at response position t, in this order: the base's last hidden state (d values, the one predicting
t), its entropy (nats), its top-1 probability, its top-1 minus top-2 margin, and t / max_new_tokens. They are
standardised with the training set's mean and spread, which the weights file carries. Routing needs numpy
only (no torch: the policy registry imports this module); the features along a stored trace need a forward of
the base (core/decoding/router_features.py).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load, save

from core.errors import InvalidInputError, PairMismatchError
from core.io.atomic import write_atomic

FEATURES = ("hidden", "entropy_base", "top1_prob", "margin", "relative_position")
CARD_FORMAT = "forkpoint-router"
CARD_VERSION = 1
WEIGHTS_FILE, CARD_FILE = "router.safetensors", "card.json"
CARD_RHOS = (0.01, 0.02, 0.05, 0.1, 0.2)  # the card's cut per ρ (on the training positions)


def pair_fingerprint(pair: Any) -> str:
    """A short, stable hash of the pair's fingerprint (models and prompt formats): what a router card names."""
    text = json.dumps(pair.fingerprint(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def keys_fingerprint(keys: list[str]) -> str:
    """A hash of the training traces' keys (order-free)."""
    return hashlib.sha256("\n".join(sorted(map(str, keys))).encode()).hexdigest()[:16]


def step_features(hidden: np.ndarray, entropy: np.ndarray, top2: np.ndarray, t: np.ndarray | int,
                  limit: int) -> np.ndarray:
    """(N, d + 4) float32 features from (N, d) hidden states, (N,) entropies, (N, 2) top-2 probabilities and
    the positions t (an int or (N,)) of a run with `limit` = max_new_tokens."""
    n = hidden.shape[0]
    top2 = np.asarray(top2, dtype=np.float64).reshape(n, 2)
    pos = np.broadcast_to(np.asarray(t, dtype=np.float64), (n,)) / max(1, int(limit))
    extra = np.stack([np.asarray(entropy, dtype=np.float64).reshape(n), top2[:, 0], top2[:, 0] - top2[:, 1], pos], 1)
    return np.concatenate([np.asarray(hidden, dtype=np.float32), extra.astype(np.float32)], axis=1)


class RouterNet:
    """The classifier as numpy arrays: logistic regression (one layer) or one hidden ReLU layer over standardised
    features -> a logit. Tensors: mean, scale, w0, b0 (and w1, b1 with a hidden layer); w has shape (out, in)."""

    def __init__(self, tensors: dict[str, np.ndarray]) -> None:
        self.tensors = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
        self.layers = sum(1 for k in self.tensors if k.startswith("w"))

    def logit(self, x: np.ndarray) -> np.ndarray:
        """(N,) logits from (N, F) features."""
        t = self.tensors
        h = (np.asarray(x, dtype=np.float64) - t["mean"]) / t["scale"]
        for i in range(self.layers):
            h = h @ t[f"w{i}"].T + t[f"b{i}"]
            if i < self.layers - 1:
                h = np.maximum(h, 0.0)
        return h.reshape(len(h), -1)[:, 0]

    def prob(self, x: np.ndarray) -> np.ndarray:
        """(N,) probabilities that the gate should fire, from (N, F) features."""
        z = self.logit(x)
        return 0.5 * (1.0 + np.tanh(0.5 * z))  # a sigmoid without overflow


@dataclass
class Router:
    """A trained router: its net and its card (see `save_router`)."""

    net: RouterNet
    card: dict[str, Any]

    def cut_for(self, ratio: float) -> float:
        """The probability cut the card gives for takeover rate `ratio` (the nearest ρ it lists, log scale)."""
        cuts = {float(r): float(c) for r, c in self.card["thresholds"].items()}
        near = min(cuts, key=lambda r: abs(math.log(r) - math.log(ratio)))
        return cuts[near]


def save_router(path: str | Path, net: RouterNet, card: dict[str, Any]) -> dict[str, Any]:
    """Write `path`/router.safetensors and `path`/card.json (a folder; replaced files are written atomically);
    returns the card as written (with its format, version and the weights' hash)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    blob = save({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in net.tensors.items()})
    write_atomic(out / WEIGHTS_FILE, lambda fh: fh.write(blob), what="router weights", binary=True)
    card = {**card, "format": CARD_FORMAT, "version": CARD_VERSION, "weights_sha256": hashlib.sha256(blob).hexdigest()}
    text = json.dumps(card, indent=1, sort_keys=True, default=str) + "\n"
    write_atomic(out / CARD_FILE, lambda fh: fh.write(text), what="router card")
    return card


def read_card(path: str | Path) -> dict[str, Any]:
    """The JSON card of the router in folder `path`, checked for format; InvalidInputError naming what is wrong."""
    file = Path(path) / CARD_FILE
    try:
        card = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(f"{path!s} is not a router folder: {CARD_FILE} is missing (make one with "
                                "`forkpoint router train` or core.train_router)") from None
    except (OSError, ValueError) as err:
        raise InvalidInputError(f"cannot read the router card {file}: {err}") from err
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        raise InvalidInputError(f"{file} is not a forkpoint router card")
    if card.get("version") != CARD_VERSION:
        raise InvalidInputError(f"{file}: router card version {card.get('version')!r}; this forkpoint reads {CARD_VERSION}")
    return card


def load_router(path: str | Path, pair: Any = None) -> Router:
    """The router in folder `path` (safetensors only). With `pair`, refuse a router made for another pair
    (PairMismatchError naming both); weights that do not match the card's hash are refused too."""
    card = read_card(path)
    if pair is not None:
        check_router_pair(card, pair, path)
    blob = (Path(path) / WEIGHTS_FILE).read_bytes()
    if hashlib.sha256(blob).hexdigest() != card.get("weights_sha256"):
        raise InvalidInputError(f"{Path(path) / WEIGHTS_FILE} does not match its card (changed after training?)")
    net = RouterNet(load(blob))
    if net.tensors["mean"].shape != (int(card["n_features"]),):
        raise InvalidInputError(f"{Path(path) / WEIGHTS_FILE}: {net.tensors['mean'].shape[0]} features, the card "
                                f"says {card['n_features']}")
    return Router(net, card)


def check_router_pair(card: dict[str, Any], pair: Any, path: str | Path = "the router") -> None:
    """Raise PairMismatchError unless the router card was made for this pair (models and prompt formats)."""
    mine = pair_fingerprint(pair)
    if card.get("pair") != mine:
        names = card.get("pair_models") or {}
        raise PairMismatchError(
            f"the router in {path!s} was trained for another model pair (base {names.get('base')!r}, reasoner "
            f"{names.get('reason')!r}; fingerprint {card.get('pair')}), not this one (fingerprint {mine}): a "
            "router reads one base model's hidden states; train one for this pair with `forkpoint router train`")

