"""The token view's legend: the score's colour bar, the spike rule, the markers, tag categories and the
effect scale; and a spike rule in words."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from core.annotate.rank_shift import legend_items
from core.scoring.registry import DEFAULT_SCORE, score_label
from core.views.colours import check_scale, gradient, tag_colour

SWITCH_POINT = "a flip there changes the text"  # what the dotted underline (tokens_html's `fp-matter`) means


def legend_html(
    tags: Iterable[str | None] | None = None,
    score: str = DEFAULT_SCORE,
    vmin: float | None = None,
    vmax: float | None = None,
    scale: str = "linear",
    spike_rule: str | None = None,
    range_note: str = "",
    effects: bool = False,
) -> str:
    """A legend: the colour bar for `score` (its registry label), the spike rule (only when one is given),
    selection/source markers, the switch points' dotted underline, the tag categories seen and (`effects`) the
    measured-effect marker's scale."""
    check_scale(scale)
    stops = gradient("score")
    lo = "low" if vmin is None or scale == "rank" else f"{vmin:.3g}"
    hi = "high" if vmax is None or scale == "rank" else f"{vmax:.3g}"
    scale_text = {"linear": "linear", "log": "log-spread", "rank": "percentile rank", "rank_shift": ""}[scale]
    note = f" · {range_note}" if range_note else ""
    parts = [
        '<div class="fp-legend">',
        (f'<span>{html.escape(score_label(score))} ({html.escape(scale_text)}{html.escape(note)}): {html.escape(lo)}'
         f'<span class="bar" style="background:linear-gradient(to right, {stops})"></span>{html.escape(hi)}</span>'),
    ]
    if scale == "rank_shift":  # categories, not a colour bar: where the reasoner's top token ranks under the base

        parts[1] = legend_items()
    if spike_rule:
        parts.append(f'<span class="fp-heatmap"><span class="tok spike">&nbsp;spike&nbsp;</span></span>'
                     f"<span>({html.escape(spike_rule)})</span>")
    parts += [
        '<span class="fp-heatmap"><span class="tok src-reason">reasoner</span></span>',
        '<span class="fp-heatmap"><span class="tok src-forced">forced</span></span>',
        '<span class="fp-heatmap"><span class="tok sel">selected</span></span>',
        f'<span class="fp-heatmap"><span class="tok fp-matter">switch point</span></span><span>({SWITCH_POINT})</span>',
    ]
    if effects:
        parts.append('<span class="fp-heatmap"><span class="tok fx" style="--fx:#01665e">effect</span></span>'
                     f'<span>−1<span class="bar" style="background:linear-gradient(to right, {gradient("effect")})">'
                     "</span>+1 (accuracy with the reasoner's token − with the base's)</span>")
    seen: dict[str, str] = {}
    for tag in tags or ():
        colour = tag_colour(tag)
        if colour is not None and str(tag) not in seen:
            seen[str(tag)] = colour
    for tag, colour in sorted(seen.items()):
        parts.append(
            f'<span class="fp-heatmap"><span class="tok tag" style="--tag:{colour}">{html.escape(tag)}</span></span>'
        )
    parts.append("</div>")
    return "".join(parts)


def describe_spike_rule(rule: Any) -> str | None:
    """A spike rule as recorded in annotations["spikes"]["rule"], in words ("top 5% by cross_entropy per
    trace", "gate τ=…, λ=…, W=…"); None when there is no rule."""
    if not isinstance(rule, dict):
        return None
    score = score_label(str(rule.get("score", DEFAULT_SCORE)))
    gate = rule.get("gate")
    if isinstance(gate, dict):
        return f"calibrated gate on {score}: τ={float(gate['tau']):.3g}, λ={float(gate['lam']):.3g}, W={int(gate['window'])}"
    if rule.get("top") is not None:
        floor = rule.get("floor")
        extra = f", score > {float(floor):g}" if floor is not None else ""
        return f"top {100 * float(rule['top']):g}% by {score} per {rule.get('per', 'trace')}{extra}"
    return None
