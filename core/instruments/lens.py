"""The logit lens: each layer's residual stream read through the model's own final norm and output head.

For response token t the model's prediction is made at the input position before it; the lens reads
the residual there after the embedding (layer 0) and after each block (layers 1 .. L), applies the
final norm and the head (`core.pair.forward.head`: soft-capping and logit scales included), and
reports the distribution. Layer L is exactly the model's own output, so it equals the trace's stored
distribution. Only the requested window is kept: (L + 1) x (2·window + 1) residual vectors per model
(the prefix before it is read once, as in decoding, and only its KV cache stays).

Where the final norm and the blocks live differs by architecture: `ARCHITECTURES` says, per
`config.model_type`; another architecture is refused with the supported list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from core.decoding.kvcache import growing_cache
from core.errors import InvalidInputError
from core.pair.forward import backbone, head
from core.pair.loading import SIDES, ModelPair
from core.trace import Trace


@dataclass(frozen=True)
class LensSpec:
    """Attribute paths (from the causal-LM object) of the block list and the final norm."""

    layers: str
    norm: str


_DECODER = LensSpec("model.layers", "model.norm")  # Llama-style: model.model.layers, model.model.norm
ARCHITECTURES: dict[str, LensSpec] = {
    "llama": _DECODER, "mistral": _DECODER, "mixtral": _DECODER,
    "qwen2": _DECODER, "qwen2_moe": _DECODER, "qwen3": _DECODER, "qwen3_moe": _DECODER,
    "gemma": _DECODER, "gemma2": _DECODER, "gemma3_text": _DECODER,
    "gpt2": LensSpec("transformer.h", "transformer.ln_f"),
}
LENS_COLUMNS = ["side", "pos", "layer", "token", "top_ids", "top_tokens", "top_probs", "entropy", "p_emitted",
           "rank_emitted", "other_token", "p_other", "rank_other", "p_reason_top", "kl_to_final"]


def lens_spec(model: Any) -> LensSpec:
    """The registry entry for `model`'s architecture, or raise naming the supported ones."""
    kind = getattr(model.config, "model_type", None)
    if kind not in ARCHITECTURES:
        raise InvalidInputError(f"The logit lens does not know where the final norm and head of a {kind!r} model "
                                f"live; supported: {', '.join(sorted(ARCHITECTURES))} (add it to "
                                "core.instruments.lens.ARCHITECTURES)")
    return ARCHITECTURES[kind]


def _attr(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


@torch.inference_mode()
def residuals(model: Any, ids: Sequence[int], first: int) -> torch.Tensor:
    """(L + 1, len(ids) - first, d) residual stream at input positions first .. len(ids) - 1: after the
    embedding, then after each block. Positions before `first` are read once into a KV cache, unrecorded."""
    spec = lens_spec(model)
    layers, dev = _attr(model, spec.layers), next(model.parameters()).device
    all_ids = torch.tensor([list(ids)], dtype=torch.long, device=dev)
    cache = growing_cache(model.config)
    if first:
        backbone(model, all_ids[:, :first], cache=cache)
    caught: list[torch.Tensor] = []

    def before(_module: Any, args: tuple, kwargs: dict) -> None:
        caught.append((args[0] if args else kwargs["hidden_states"])[0])

    def after(_module: Any, _args: tuple, out: Any) -> None:
        caught.append((out[0] if isinstance(out, tuple) else out)[0])

    hooks = [layers[0].register_forward_pre_hook(before, with_kwargs=True)]
    hooks += [layer.register_forward_hook(after) for layer in layers]
    try:
        backbone(model, all_ids[:, first:], cache=cache)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(caught)  # (L + 1, n, d)


def lens(pair: ModelPair, trace: Trace, pos: int, *, window: int = 0, k: int = 5) -> pd.DataFrame:
    """One row per (side, position, layer) for the response tokens pos - window .. pos + window.

    Columns: side, pos, layer (0 = embedding, L = the output), token (emitted), top_ids / top_tokens /
    top_probs (k each), entropy (nats), p_emitted, rank_emitted (0 = top), other_token (the other model's
    top choice at pos, from the trace), p_other, rank_other, p_reason_top (the reasoner's top choice),
    kl_to_final = KL(final ‖ layer), nats."""
    if not isinstance(pos, (int, np.integer)) or not 0 <= pos < len(trace):
        raise InvalidInputError(f"Position {pos!r} is outside the trace (0..{len(trace) - 1})")
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise InvalidInputError(f"window must be an integer ≥ 0, got {window!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InvalidInputError(f"k must be an integer ≥ 1, got {k!r}")
    first, last = max(0, int(pos) - window), min(len(trace) - 1, int(pos) + window)
    targets = torch.tensor(trace.token_ids[first:last + 1].tolist(), dtype=torch.long)
    top = {side: torch.tensor(trace.topk[side][0][first:last + 1, 0].tolist(), dtype=torch.long) for side in SIDES}
    frames = []
    for side in SIDES:
        model, prompt = pair.model(side), trace.prompt_ids[side]
        ids = list(prompt) + [int(x) for x in trace.token_ids[:last]]
        hidden = residuals(model, ids, len(prompt) - 1 + first)  # entry j predicts response token first + j
        other = top["reason" if side == "base" else "base"]
        frames.append(_table(pair, side, model, hidden, first, targets, other, top["reason"], min(k, pair.vocab_size)))
    return pd.concat(frames, ignore_index=True)[LENS_COLUMNS]


@torch.inference_mode()
def _table(pair: ModelPair, side: str, model: Any, hidden: torch.Tensor, first: int, targets: torch.Tensor,
           other: torch.Tensor, reason_top: torch.Tensor, k: int) -> pd.DataFrame:
    """The rows of one model from its (L + 1, n, d) residuals, one position's layers at a time, so at most
    (L + 1, V) log-probabilities exist at once."""
    norm = _attr(model, lens_spec(model).norm)
    parts = []
    for j in range(hidden.shape[1]):
        logp = torch.log_softmax(head(model, norm(hidden[:, j]), pair.vocab_size), dim=-1)  # (L + 1, V)
        probs = logp.exp()
        n_layers = logp.shape[0]
        ids = {name: torch.full((n_layers,), int(t[j])) for name, t in
               (("emitted", targets), ("other", other), ("reason_top", reason_top))}
        top_p, top_i = probs.topk(k, dim=-1)
        final = logp[-1:]
        parts.append(pd.DataFrame({
            "side": side, "pos": first + j, "layer": np.arange(n_layers),
            "token": pair.token_text(int(targets[j])),
            "top_ids": [list(map(int, r)) for r in top_i], "top_probs": [list(map(float, r)) for r in top_p],
            "top_tokens": [[pair.token_text(int(t)) for t in r] for r in top_i],
            "entropy": (-(probs * logp).sum(-1)).cpu().numpy(),
            "p_emitted": _at(probs, ids["emitted"]), "rank_emitted": _rank(probs, ids["emitted"]),
            "other_token": pair.token_text(int(other[j])),
            "p_other": _at(probs, ids["other"]), "rank_other": _rank(probs, ids["other"]),
            "p_reason_top": _at(probs, ids["reason_top"]),
            "kl_to_final": (final.exp() * (final - logp)).sum(-1).clamp_min(0).cpu().numpy(),
        }))
    return pd.concat(parts, ignore_index=True)


def _at(probs: torch.Tensor, ids: torch.Tensor) -> np.ndarray:
    """(R, V), (R,) -> (R,) the probability of ids[r] in row r."""
    return probs.gather(-1, ids[:, None].to(probs.device))[:, 0].cpu().numpy()


def _rank(probs: torch.Tensor, ids: torch.Tensor) -> np.ndarray:
    """(R, V), (R,) -> (R,) how many entries of each row exceed the entry at ids (0 = top)."""
    return (probs > probs.gather(-1, ids[:, None].to(probs.device))).sum(-1).cpu().numpy()


def commit_layer(frame: pd.DataFrame, side: str, pos: int, column: str = "rank_emitted") -> float:
    """The first layer from which `column` (a rank) stays 0 at `pos` on `side`: where that model commits
    to the token. NaN if it never does."""
    sel = frame[(frame["side"] == side) & (frame["pos"] == pos)].sort_values("layer")
    ranks = sel[column].to_numpy()
    if not len(ranks) or ranks[-1] != 0:
        return math.nan
    nonzero = np.flatnonzero(ranks != 0)
    return float(sel["layer"].iloc[nonzero[-1] + 1] if len(nonzero) else sel["layer"].iloc[0])
