"""Token heatmaps as HTML: the one renderer behind the HTML export and the app's token component.

Pure functions returning strings. All model text (tokens, top-k strings, tags, segment names) is
escaped here and nowhere else, so no caller has to remember to.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core import settings
from core.annotate.rank_shift import colours as rank_shift_colours
from core.errors import InvalidInputError
from core.scoring.registry import DEFAULT_SCORE, score_values
from core.trace import Trace, note_texts
from core.views.colours import (
    NAN_COLOUR,
    SCALES,
    TAG_COLOURS,
    check_scale,
    colour_scale,
    effect_colour,
    normalise,
    tag_colour,
    value_range,
)
from core.views.legend import describe_spike_rule, legend_html
from core.views.presentation import effect_line, effects_by_pos, flip_changes, fmt_num, fmt_prob

# The renderer's public names; the colour scales and the legend have their own modules (core/views/colours.py,
# legend.py) and stay importable from here.
__all__ = ["HEATMAP_CSS", "NAN_COLOUR", "SCALES", "TAG_COLOURS", "check_scale", "colour_scale", "describe_spike_rule",
           "effect_colour", "front_end_source", "grapheme_groups", "grapheme_start", "heatmap_css", "legend_html",
           "normalise", "tag_colour", "token_payload", "token_tips", "tokens_html", "value_range"]

# Scripts whose letters join (Arabic, Syriac, Thaana, N'Ko, Mongolian, Arabic presentation forms): an empty byte
# piece drawn with inline padding sits between two letters and Chromium shapes them apart (issue 22, defect 9).
_JOINING = re.compile("[\u0600-\u08ff\u1800-\u18af\ufb50-\ufdff\ufe70-\ufeff]")
_METRIC_LINES = (
    (("cross_entropy", "CE"), ("kl_base_reason", "KL(b‖r)"), ("kl_reason_base", "KL(r‖b)"), ("jsd", "JSD")),
    (("entropy_base", "H base"), ("entropy_reason", "H reason"), ("delta_logp", "Δlogp")),
)

HEATMAP_CSS = """
.fp-heatmap { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 14px;
  line-height: 1.9; white-space: pre-wrap; word-break: break-word; color: #111; }
.fp-heatmap .tok { position: relative; border-radius: 2px; padding: 1px 0; cursor: pointer; }
.fp-heatmap .tok.empty { padding: 1px 2px; }
.fp-heatmap .gph { white-space: nowrap; }
.fp-heatmap .gph .tok.empty { padding: 1px 1px; }
.fp-heatmap .gph.join .tok.empty { padding: 1px 0; }
.fp-heatmap .tok.tag { border-bottom: 3px solid var(--tag); }
.fp-heatmap .tok.spike { outline: 2px solid #7c3aed; outline-offset: -1px; }
.fp-heatmap .tok.sel { box-shadow: 0 0 0 3px #2563eb; }
.fp-heatmap .tok.src-reason { font-weight: 700; }
.fp-heatmap .tok.src-reason::before { content: "▲"; font-size: 0.6em; vertical-align: super; color: #1d4ed8; }
.fp-heatmap .tok.src-forced { font-weight: 700; }
.fp-heatmap .tok.src-forced::before { content: "◆"; font-size: 0.6em; vertical-align: super; color: #b45309; }
.fp-heatmap .tok.sw { text-decoration: underline double #dc2626; text-underline-offset: 3px; }
.fp-heatmap .tok.sw-base::before { content: "○"; font-size: 0.6em; vertical-align: super; color: #dc2626; }
.fp-heatmap .tok.diff { text-decoration: underline wavy #0284c7; text-decoration-skip-ink: none; text-underline-offset: 4px; }
/* where a flip changes the text (tokens_html's switch points): a dotted underline, apart from the colour
   (background), spikes (outline), tags (border below), effects (border above) and switches / diffs (their own
   underlines, which win) */
.fp-heatmap .tok.fp-matter:not(.sw):not(.diff) { text-decoration: underline dotted #111827;
  text-decoration-thickness: 2px; text-underline-offset: 4px; text-decoration-skip-ink: none; }
.fp-heatmap .tok.note::after { content: "✎"; font-size: 0.65em; vertical-align: super; color: #2563eb; font-weight: 700; }
.fp-heatmap .tok.note.bm::after { content: "🔖"; }
.fp-heatmap .tok.fx { border-top: 4px solid var(--fx); }
.fp-heatmap .nl { color: #9ca3af; }
.fp-ctl { font-size: 0.65em; color: #6b7280; border: 1px dotted #9ca3af; border-radius: 2px; }
.fp-heatmap .seg { border-left: 4px solid #9ca3af; padding: 2px 0 6px 8px; margin: 6px 0; }
.fp-heatmap .seg-think { border-left-color: #a78bfa; background: #faf5ff; }
.fp-heatmap .seg-answer { border-left-color: #34d399; background: #f0fdf4; }
.fp-heatmap .seg-label { font: 600 11px system-ui, sans-serif; color: #6b7280; text-transform: uppercase;
  letter-spacing: 0.05em; white-space: normal; }
.fp-heatmap.css-tips .tok:hover::after { content: attr(data-tip); position: absolute; left: 0; top: 1.8em;
  z-index: 1000; white-space: pre; background: #111827; color: #f9fafb; font-size: 12px; line-height: 1.35;
  font-weight: 400; padding: 6px 8px; border-radius: 4px; pointer-events: none; }
.fp-legend { font: 12px system-ui, sans-serif; display: flex; flex-wrap: wrap; gap: 14px; align-items: center;
  margin: 6px 0 10px; }
.fp-legend .bar { display: inline-block; width: 140px; height: 10px; border: 1px solid #ccc;
  vertical-align: middle; margin: 0 4px; }
.fp-legend .tok { font-family: ui-monospace, monospace; padding: 0 3px; }
"""


def heatmap_css() -> str:
    """The stylesheet for `tokens_html` and `legend_html` output (include it once per page)."""
    return HEATMAP_CSS


def grapheme_groups(tokens: Sequence[str]) -> list[int]:
    """Per token, the index of the first token of its group: tokens that together draw one user-perceived
    character (an emoji with a skin-tone modifier, a character split over byte pieces) share a group.

    A token starts a new group iff it begins on a grapheme boundary of the joined text and the token before
    it is not an empty byte piece (those belong to the character the next token completes)."""
    import regex

    text = "".join(tokens)
    bounds = {0, len(text)}
    pos = 0
    for m in regex.finditer(r"\X", text):
        pos = m.end()
        bounds.add(pos)
    out: list[int] = []
    offset, first, prev_empty = 0, 0, False
    for i, tok in enumerate(tokens):
        if i == 0 or (offset in bounds and not prev_empty):
            first = i
        out.append(first)
        offset += len(tok)
        prev_empty = tok == ""
    return out


def grapheme_start(tokens: Sequence[str], pos: int) -> int:
    """The first token of the character (grapheme) that token `pos` helps draw: `pos` itself unless it is a later
    byte piece of one; a takeover there would keep the earlier pieces and start the branch mid-character."""
    return grapheme_groups(tokens)[pos]


def _visible(text: str) -> str:
    return text.replace("\r", "␍").replace("\n", "↵").replace("\t", "⇥")


_BIDI = re.compile(f"[{settings.BIDI_CONTROLS}]")


def text_html(text: str) -> str:
    """Model or user text as element content that shows literally: escaped, and bidirectional controls as their
    code points (an override in a prompt or a token would mirror everything after it). Not for attributes."""
    out = html.escape(text, quote=True)
    return _BIDI.sub(lambda m: f'<span class="fp-ctl">U+{ord(m.group()):04X}</span>', out) if _BIDI.search(out) else out


def _token_html(text: str) -> str:
    """`text_html` of a token, with newlines shown as ↵ and a line break."""
    out = text_html(text.replace("\r\n", "\n"))
    return out.replace("\n", '<span class="nl">↵</span><br>') if "\n" in out else out


def _attr(text: str) -> str:
    """Escape for a double-quoted attribute value (html.escape, leaving ' alone: shorter tips)."""
    return html.escape(text, quote=False).replace('"', "&quot;")


def _fmt(value: float) -> str:
    return fmt_num(value)  # the app's format: 3 significant digits, never "0.000" for 1e-5


def _make_decoder(decode: Callable[[int], str] | None) -> Callable[[int], str]:
    cache: dict[int, str] = {}

    def show(token_id: int) -> str:
        if token_id not in cache:
            cache[token_id] = repr(_visible(decode(token_id))) if decode is not None else f"#{token_id}"
        return cache[token_id]

    return show


def token_tips(
    trace: Trace, score: str = DEFAULT_SCORE, decode: Callable[[int], str] | None = None, k: int | None = None
) -> list[str]:
    """Plain-text hover text per token (unescaped): metrics, ranks, both models' top-k (all the trace keeps,
    as the app lists them; probabilities in the app's format, never 1.000 / 0.000) and any note on it."""
    n = len(trace)
    show = _make_decoder(decode)
    m = {name: np.asarray(v, dtype=np.float64).tolist() for name, v in trace.metrics.items()}
    s = np.asarray(score_values(trace.metrics, score), dtype=np.float64).tolist()
    k = min(trace.k if k is None else k, trace.k)
    notes = trace.annotations.get("notes") or []
    note_text = note_texts(notes, n) if notes else [""] * n
    measured = effects_by_pos(trace.annotations.get("effects"))
    ids = {side: np.asarray(trace.topk[side][0])[:, :k].tolist() for side in ("base", "reason")}
    probs = {side: np.asarray(trace.topk[side][1], dtype=np.float64)[:, :k].tolist() for side in ("base", "reason")}
    token_ids = trace.token_ids.tolist()
    tips = []
    for i in range(n):
        lines = [
            f"#{i} {_visible(trace.tokens[i])!r}  id {token_ids[i]}  · {trace.source[i]}",
            f"{score}: {_fmt(s[i])}",
        ]
        for group in _METRIC_LINES:
            lines.append("  ".join(f"{label} {_fmt(m[name][i])}" for name, label in group if name in m))
        if "logp_base" in m:
            lines.append(
                f"log p base {_fmt(m['logp_base'][i])} (rank {int(m['rank_base'][i])})  "
                f"reason {_fmt(m['logp_reason'][i])} (rank {int(m['rank_reason'][i])})"
            )
            lines.append(f"reason's top token ranks {int(m['reason_top_rank_in_base'][i])} under base")
        if k:
            lines.append(f"{'base top-' + str(k):<26}reason top-{k}")
            for j in range(k):
                left = f"{show(ids['base'][i][j])} {fmt_prob(probs['base'][i][j])}"
                lines.append(f"{left:<26}{show(ids['reason'][i][j])} {fmt_prob(probs['reason'][i][j])}")
        if note_text[i]:
            lines.append(f"✎ note: {note_text[i]}")
        if i in measured:
            lines.append(effect_line(measured[i]))
        tips.append("\n".join(lines))
    return tips


def token_payload(
    trace: Trace, decode: Callable[[int], str] | None = None, k: int | None = None
) -> list[dict[str, Any]]:
    """Per token, a JSON-ready dict (pos, token, source, metrics, top-k of both models) for app components.

    Strings are raw model text: whoever puts them into HTML must escape them (tokens_html does)."""
    k = trace.k if k is None else min(k, trace.k)
    text = (lambda i: decode(i)) if decode is not None else (lambda i: None)
    frame = {name: np.asarray(v, dtype=np.float64).tolist() for name, v in trace.metrics.items()}
    out = []
    for i in range(len(trace)):
        row: dict[str, Any] = {
            "pos": i, "token": trace.tokens[i], "id": int(trace.token_ids[i]), "source": str(trace.source[i])
        }  # fmt: skip
        row.update({name: (v[i] if np.isfinite(v[i]) else None) for name, v in frame.items()})
        for side in ("base", "reason"):
            ids, probs = trace.topk[side]
            row[f"top_{side}"] = [
                {"id": int(t), "p": float(p), "text": text(int(t))} for t, p in zip(ids[i][:k], probs[i][:k])
            ]
        out.append(row)
    return out


def _positions(value: int | Iterable[int] | None) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, (int, np.integer)):
        return {int(value)}
    return {int(v) for v in value}


def _css_name(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", name.lower())[:40] or "none"


def tokens_html(
    trace: Trace,
    score: str = DEFAULT_SCORE,
    spikes: Iterable[int] | None = None,
    tags: Sequence[str | None] | None = None,
    selected: int | Iterable[int] | None = None,
    show_source: bool = True,
    *,
    decode: Callable[[int], str] | None = None,
    scale: str = "linear",
    vmin: float | None = None,
    vmax: float | None = None,
    k: int | None = None,
    segments: Sequence[str | None] | None = None,
    tips: bool = True,
    css_tips: bool = True,
    offset: int = 0,
    reference: Any = None,
    colours: Sequence[str] | None = None,
    marked: Iterable[int] | None = None,
    switch_points: Iterable[int] | None = None,
) -> str:
    """The response as one `<span class="tok" data-pos=i data-tip=...>` per token, coloured by `score`.

    spikes/tags/segments default to the trace's annotation layers (pass [] to hide spikes); selected
    positions get a ring; reasoner-emitted tokens are bold with a ▲ marker (◆ when forced); positions
switched by `core.takeover` (meta["switches"]) are double-underlined (○: a takeover switched off). Tokens that
    draw one grapheme together are wrapped in `<span class="gph">` with the whole grapheme on the last
    of them (the others stay clickable, empty). `offset` is added to data-pos (a page of a longer trace);
    vmin/vmax/reference fix the colour range across views (see `normalise`). `colours` (T css colours)
    replaces the score's colour scale, e.g. core.annotate.rank_shift.colours(trace) for the categorical rank-shift mode.
    css_tips adds a pure-CSS hover tooltip; turn it off when the page brings its own (JS) tooltip.
    `marked` positions get a wavy underline (tokens that differ from another column of a comparison).
    `switch_points` (default: `flip_changes(trace)`, where a flip changes the text; [] hides them) get a dotted
    underline (class `fp-matter`), in every view that draws tokens; the live view's n / p walk them. Tokens
    under a note (the trace's "notes" layer, core/io/notes.py) carry a ✎ marker (🔖 for a bookmark) and the
    note's text in `data-note` (escaped; shown on hover, never as HTML). Positions with a measured takeover effect
    (the trace's "effects" layer, core.instruments.effects.attach_effects) carry a bar over the token coloured on
    the diverging effect scale (`effect_colour`) and the effect in `data-fx`.
    (Longer than most functions here on purpose: the per-token work stays in one loop over the tokens,
    which is the app's render budget — benchmarks/bench_render.py.)
    """
    n = len(trace)
    values = score_values(trace.metrics, score)
    if colours is None and scale == "rank_shift":

        colours = rank_shift_colours(trace)
    colours = colour_scale(values, vmin, vmax, scale, reference) if colours is None else list(colours)
    if len(colours) != n:
        raise InvalidInputError(f"colours has {len(colours)} entries for {n} tokens")
    if spikes is None:
        spikes = trace.spike_positions
    spike_set = _positions(spikes)
    selected_set = _positions(selected)
    marked_set = _positions(marked)
    matter_set = _positions(flip_changes(trace) if switch_points is None else switch_points)
    notes = trace.annotations.get("notes") or []
    note_text = note_texts(notes, n) if notes else None
    bookmarked = {p for nt in notes if nt.get("bookmark") for p in range(int(nt["start"]), int(nt["end"]) + 1)}
    switched = {int(p): w for p, w in (trace.meta.get("switches") or {}).items()}  # core.takeover's switches
    measured = effects_by_pos(trace.annotations.get("effects"))
    if tags is None:
        tags = trace.annotations.get("tags")
    if segments is None:
        segments = trace.annotations.get("segments")
    for name, layer in (("tags", tags), ("segments", segments)):
        if layer is not None and len(layer) != n:
            raise InvalidInputError(f"{name} has {len(layer)} entries for {n} tokens")
    tip_text = token_tips(trace, score, decode, k) if tips else None
    groups = grapheme_groups(trace.tokens)
    texts = list(trace.tokens)
    for i in range(n):  # a grapheme drawn by several tokens: the whole of it on the group's last token
        if groups[i] != i and (i + 1 == n or groups[i + 1] != groups[i]):
            texts[i] = "".join(trace.tokens[groups[i] : i + 1])
            for j in range(groups[i], i):
                texts[j] = ""
    parts = [f'<div class="fp-heatmap{" css-tips" if tips and css_tips else ""}" data-score="{html.escape(score)}">']
    current_segment: str | None = None
    for i in range(n):
        if segments is not None and segments[i] != current_segment:
            if current_segment is not None:
                parts.append("</div>")
            current_segment = segments[i]
            label = html.escape(str(current_segment))
            parts.append(
                f'<div class="seg seg-{_css_name(str(current_segment))}" data-seg="{label}">'
                f'<div class="seg-label">{label}</div>'
            )
        grouped = (i + 1 < n and groups[i + 1] == groups[i]) or groups[i] != i
        if grouped and groups[i] == i:  # inline padding between pieces would break a joining script's shaping
            end = next((j for j in range(i + 1, n) if groups[j] != i), n)
            joins = _JOINING.search("".join(trace.tokens[i:end])) is not None
            parts.append('<span class="gph join">' if joins else '<span class="gph">')
        text = texts[i]
        classes = ["tok"]
        style = f"background:{colours[i]}"
        if not text:
            classes.append("empty")
        if i in spike_set:
            classes.append("spike")
        if i in selected_set:
            classes.append("sel")
        if show_source and trace.source[i] != "base":
            classes.append(f"src-{_css_name(str(trace.source[i]))}")
        if i in marked_set:
            classes.append("diff")
        if i in matter_set:
            classes.append("fp-matter")
        if note_text is not None and (note_text[i] or i in bookmarked):
            classes += ["note", "bm"] if i in bookmarked else ["note"]
        if i in switched:  # a user's switch: double underline; a takeover switched off keeps a ○
            classes += ["sw", "sw-base"] if switched[i] == "base" else ["sw"]
        if i in measured:
            classes.append("fx")
            style += f";--fx:{effect_colour(measured[i]['effect'])}"
        if tags is not None and (colour := tag_colour(tags[i])) is not None:
            classes.append("tag")
            style += f";--tag:{colour}"
        attrs = f' data-tag="{html.escape(str(tags[i]), quote=True)}"' if "tag" in classes else ""
        if "note" in classes:
            attrs += f' data-note="{_attr(note_text[i] or "🔖")}"'
        if i in measured:
            attrs += f' data-fx="{measured[i]["effect"]:+.3f}"'
        if tip_text is not None:
            attrs += f' data-tip="{_attr(tip_text[i])}"'
        cls = " ".join(classes)
        parts.append(f'<span class="{cls}" data-pos="{i + offset}" style="{style}"{attrs}>{_token_html(text)}</span>')
        if grouped and (i + 1 == n or groups[i + 1] != groups[i]):
            parts.append("</span>")
    if current_segment is not None:
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


def front_end_source(name: str) -> str:
    """A file of the token view's front end (`token_view.js`/`.css` beside this module), shared by the app's
    component and the notebook widget."""
    return (Path(__file__).resolve().parent / name).read_text(encoding="utf-8")
