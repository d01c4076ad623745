"""A learned gate's model at run time: the features the base alone has at step t, the small classifier over
them, and its files (weights as safetensors, a JSON card naming the pair, features, target and training
traces). `core.train_router` (core/instruments/router_training.py) makes one; the `router` policy reads it.

Features at response position t, in this order: the base's last hidden state (d values, the one predicting
t), its entropy (nats), its top-1 probability, its top-1 minus top-2 margin, and t / max_new_tokens. They are
standardised with the training set's mean and spread, which the weights file carries.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load, save

from core.errors import InvalidInputError, PairMismatchError
from core.io.atomic import write_atomic
from core.pair.forward import backbone, head
from core.scoring.metrics import entropy_and_top2

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


class RouterNet(torch.nn.Module):
    """Logistic regression (hidden=0) or one hidden layer over standardised features -> a logit."""

    def __init__(self, n_features: int, hidden: int = 0) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("scale", torch.ones(n_features))
        self.body = (torch.nn.Linear(n_features, 1) if hidden == 0 else
                     torch.nn.Sequential(torch.nn.Linear(n_features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body((x - self.mean) / self.scale).squeeze(-1)

    def prob(self, x: np.ndarray) -> np.ndarray:
        """(N,) probabilities that the gate should fire, from (N, F) features."""
        with torch.no_grad():
            return torch.sigmoid(self(torch.from_numpy(np.asarray(x, dtype=np.float32)))).double().numpy()


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
    blob = save({k: v.contiguous() for k, v in net.state_dict().items()})
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
    state = load(blob)
    net = RouterNet(int(card["n_features"]), int(card.get("hidden", 0)))
    net.load_state_dict(state)
    net.eval()
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


def trace_features(pair: Any, trace: Any, chunk: int = 128) -> np.ndarray:
    """(T, F) the features the engine would hand the router at each position of `trace` (the base's path is
    the trace's tokens), from one teacher-forced forward of the base."""
    n = len(trace)
    prompt = list(trace.prompt_ids["base"])
    if n == 0:
        return np.zeros((0, 0), dtype=np.float32)
    ids = torch.tensor([prompt + [int(x) for x in trace.token_ids]], dtype=torch.long, device=pair.device)
    hidden, _ = backbone(pair.base, ids)
    hidden = hidden[0, len(prompt) - 1 : len(prompt) - 1 + n]
    h, top = [], []
    for start in range(0, n, chunk):
        e, t2 = entropy_and_top2(head(pair.base, hidden[start : start + chunk], pair.vocab_size))
        h.append(e.cpu().numpy())
        top.append(t2.cpu().numpy())
    limit = int((trace.meta.get("sampling") or {}).get("max_new_tokens") or n)
    return step_features(hidden.float().cpu().numpy(), np.concatenate(h), np.concatenate(top), np.arange(n), limit)
