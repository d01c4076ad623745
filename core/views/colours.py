"""The token view's colour scales: the score's white-to-red scale (linear, log-spread, percentile rank),
planning-tag colours, and the diverging scale of measured takeover effects. Pure functions of numbers."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pandas as pd

from core.errors import InvalidInputError

SCALES = ("linear", "log", "rank", "rank_shift")  # rank_shift: categorical colours (core/annotate/rank_shift.py), not the score
# White -> yellow -> orange -> red; dark enough at the top to see, light enough for black text.
_STOPS = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
_RGB = np.array([[255, 255, 255], [254, 240, 170], [253, 186, 116], [248, 113, 113], [220, 38, 38]], dtype=float)
_LUT_SIZE = 256


def _hex(x: float, stops: np.ndarray, rgb: np.ndarray) -> str:
    """The css colour at `x` on the piecewise-linear scale through `stops` (rows of `rgb`)."""
    return "#" + "".join(f"{round(float(np.interp(x, stops, rgb[:, c]))):02x}" for c in range(3))


_LUT = [_hex(x, _STOPS, _RGB) for x in np.linspace(0.0, 1.0, _LUT_SIZE)]
NAN_COLOUR = "transparent"
UNTAGGED = frozenset({"", "none", "execute", "execution", "other", "o"})  # tags that get no underline
# core.annotate.planning's categories first; other names get a stable colour from _PALETTE.
# "plan" green and "conclude" blue differ in hue and lightness (the old teal "conclude" read as "plan").
TAG_COLOURS = {"plan": "#16a34a", "reflect": "#db2777", "verify": "#d97706", "conclude": "#1d4ed8",
               "planning": "#16a34a", "check": "#d97706"}  # fmt: skip
_PALETTE = ("#059669", "#d97706", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#b91c1c", "#4338ca")
# Measured takeover effects (acc with the reasoner - without, in [-1, 1]): brown (the reasoner's token hurts)
# -> light grey (no effect) -> teal (it helps). Neither end is a colour of the score scale or the spike ring.
EFFECT_STOPS = np.array([-1.0, 0.0, 1.0])
EFFECT_RGB = np.array([[140, 81, 10], [229, 231, 235], [1, 102, 94]], dtype=float)


def check_scale(scale: str) -> str:
    """Return `scale` if known, else raise with the valid choices."""
    if scale not in SCALES:
        raise InvalidInputError(f"Unknown colour scale {scale!r}; choose one of: {', '.join(SCALES)}")
    return scale


def normalise(values: Any, vmin: float | None = None, vmax: float | None = None, scale: str = "linear",
              reference: Any = None) -> np.ndarray:
    """(T,) values -> (T,) in [0, 1] (NaN where not finite). vmin/vmax default to the finite range;
    "log" spreads the low end (log1p(99 u) / log 100), "rank" uses percentile ranks and ignores them.
    With `reference` (e.g. two traces pooled), "rank" ranks each value among the reference values, so
    views that share a reference give the same value the same colour."""
    check_scale(scale)
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    finite = np.isfinite(x)
    out = np.full(x.shape, np.nan)
    if not finite.any():
        return out
    if scale == "rank":
        if reference is None:
            ranks = pd.Series(x[finite]).rank(method="average").to_numpy() - 1.0
            out[finite] = ranks / max(finite.sum() - 1, 1)
            return out
        ref = np.sort(np.asarray(reference, dtype=np.float64).reshape(-1))
        ref = ref[np.isfinite(ref)]
        if ref.size == 0:
            out[finite] = 0.0
            return out
        below = np.searchsorted(ref, x[finite], side="left")
        upto = np.searchsorted(ref, x[finite], side="right")
        out[finite] = np.clip(((below + upto - 1) / 2.0) / max(ref.size - 1, 1), 0.0, 1.0)  # average rank
        return out
    lo = float(np.min(x[finite])) if vmin is None else float(vmin)
    hi = float(np.max(x[finite])) if vmax is None else float(vmax)
    u = np.clip((x[finite] - lo) / (hi - lo), 0.0, 1.0) if hi > lo else np.zeros(finite.sum())
    if scale == "log":
        u = np.log1p(99.0 * u) / np.log(100.0)
    out[finite] = u
    return out


def colour_scale(values: Any, vmin: float | None = None, vmax: float | None = None, scale: str = "linear",
                 reference: Any = None) -> list[str]:
    """(T,) values -> T css colours on a white-to-red scale; non-finite values are transparent."""
    u = normalise(values, vmin, vmax, scale, reference)
    idx = np.where(np.isfinite(u), np.rint(np.nan_to_num(u) * (_LUT_SIZE - 1)), -1).astype(np.int64)
    return [_LUT[i] if i >= 0 else NAN_COLOUR for i in idx.tolist()]


def value_range(*arrays: Any) -> tuple[float | None, float | None]:
    """The finite (min, max) over all `arrays` pooled ((None, None) when none is finite): one colour range
    for several views, so the same value gets the same colour in each."""
    lo, hi = None, None
    for values in arrays:
        x = np.asarray(values, dtype=np.float64).reshape(-1)
        x = x[np.isfinite(x)]
        if x.size:
            lo = float(x.min()) if lo is None else min(lo, float(x.min()))
            hi = float(x.max()) if hi is None else max(hi, float(x.max()))
    return lo, hi


def effect_colour(effect: float) -> str:
    """A measured effect in [-1, 1] (clipped) as a css colour on the diverging brown-grey-teal scale."""
    x = float(np.clip(effect, -1.0, 1.0)) if np.isfinite(effect) else 0.0
    return _hex(x, EFFECT_STOPS, EFFECT_RGB)


def gradient(kind: str = "score", steps: int = 9) -> str:
    """The css stops of a colour bar: the score scale (low to high) or the effect scale (-1 to +1)."""
    if kind == "effect":
        return ", ".join(effect_colour(x) for x in np.linspace(-1, 1, steps))
    return ", ".join(_LUT[round(x * (_LUT_SIZE - 1))] for x in np.linspace(0, 1, steps))


def tag_colour(tag: str | None) -> str | None:
    """Underline colour of a planning-tag category, or None for untagged tokens."""
    if tag is None or str(tag).lower() in UNTAGGED:
        return None
    name = str(tag).lower()
    return TAG_COLOURS.get(name) or _PALETTE[zlib.crc32(name.encode("utf-8")) % len(_PALETTE)]
