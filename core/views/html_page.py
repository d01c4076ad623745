"""The self-contained HTML page of traces (inline CSS and JS, no external resources): the HTML export and
a notebook's inline view. Every piece of model text goes through `core.views.heatmap` or `html.escape`."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.io.jsonsafe import dumps_strict
from core.io.notes import notes_html
from core.io.provenance import forkpoint_version, utc_now
from core.scoring.registry import DEFAULT_SCORE, check_score
from core.trace import Trace
from core.views.heatmap import (
    describe_spike_rule,
    heatmap_css,
    legend_html,
    text_html,
    tokens_html,
)

_PAGE_CSS = """
body { font: 14px system-ui, sans-serif; margin: 24px auto; max-width: 1100px; padding: 0 16px; color: #111; }
header h1 { margin: 0 0 4px; font-size: 22px; }
.muted { color: #6b7280; }
section.trace { border-top: 1px solid #e5e7eb; margin-top: 24px; padding-top: 12px; }
table.settings { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
table.settings td { border: 1px solid #e5e7eb; padding: 2px 8px; vertical-align: top; }
table.settings td:first-child { color: #6b7280; white-space: nowrap; }
pre.prompt, pre.record { white-space: pre-wrap; background: #f9fafb; padding: 8px; font-size: 12px; }
#fp-tip { position: fixed; display: none; z-index: 10000; max-width: 640px; white-space: pre; pointer-events: none;
  background: #111827; color: #f9fafb; font: 12px/1.35 ui-monospace, monospace; padding: 6px 8px; border-radius: 4px; }
#fp-tip.pinned { pointer-events: auto; outline: 2px solid #2563eb; }
"""

# Tooltips: the tip text is set with textContent, so nothing in it is ever parsed as HTML.
_PAGE_JS = """
(function () {
  var tip = document.getElementById("fp-tip"), pinned = null;
  function show(el, x, y) {
    tip.textContent = el.getAttribute("data-tip");
    tip.style.display = "block";
    var w = tip.offsetWidth, h = tip.offsetHeight;
    tip.style.left = Math.max(4, Math.min(x + 12, window.innerWidth - w - 8)) + "px";
    tip.style.top = (y + h + 24 > window.innerHeight ? Math.max(4, y - h - 12) : y + 16) + "px";
  }
  document.addEventListener("mouseover", function (e) {
    var el = e.target.closest && e.target.closest(".tok[data-tip]");
    if (el && !pinned) show(el, e.clientX, e.clientY);
  });
  document.addEventListener("mouseout", function (e) {
    var el = e.target.closest && e.target.closest(".tok[data-tip]");
    if (el && !pinned) tip.style.display = "none";
  });
  document.addEventListener("click", function (e) {
    var el = e.target.closest && e.target.closest(".tok[data-tip]");
    if (pinned) { pinned.classList.remove("sel"); tip.classList.remove("pinned"); }
    if (el && el !== pinned) {
      pinned = el; el.classList.add("sel"); tip.classList.add("pinned"); show(el, e.clientX, e.clientY);
    } else { pinned = null; tip.style.display = "none"; }
  });
})();
"""


def model_name(name: Any) -> str:
    """A model as a shared page names it: a hub id as it is, a local folder or file by its own name (an absolute
    path says where the user keeps files, not which model it is)."""
    text = str(name)
    if text.startswith(("/", "~", "\\")) or (len(text) > 2 and text[1] == ":" and text[2] in "\\/"):
        return Path(text.replace("\\", "/")).name or text
    return text


def _named(value: Any, key: str = "") -> Any:
    """`value` (a trace's meta) with every model spec's path (a base / reason record with an "id": the pair,
    the request's fingerprint) replaced by its name (model_name), for the page's record."""
    if isinstance(value, dict):
        out = {k: _named(v, str(k)) for k, v in value.items()}
        if key in ("base", "reason") and "id" in out:
            out.update({k: model_name(out[k]) for k in ("id", "gguf_file", "path") if out.get(k)})
        return out
    if isinstance(value, list):
        return [_named(v) for v in value]
    return value


def _model_text(side: Any) -> str:
    if not isinstance(side, dict):
        return str(side) if side is not None else "?"
    text = str(side.get("id") or "?")
    if side.get("revision"):
        text += f" @ {side['revision']}"
    if side.get("gguf_file"):
        text += f" ({side['gguf_file']})"
    return text


def settings_rows(trace: Trace, meta: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(label, value) rows of a trace's reproducibility record (`meta`, default the trace's), as plain
    (unescaped) text."""
    meta = trace.meta if meta is None else meta
    pair = meta.get("pair") or {}
    formats = meta.get("formats") or {}
    policy = meta.get("policy") or {}
    sampling = meta.get("sampling") or {}
    problem = meta.get("problem") or {}
    n = len(trace)
    takeovers = trace.n_takeovers
    forced = int(sum(str(s) == "forced" for s in trace.source))  # the user's tokens: not takeovers, not in ρ
    spikes = trace.annotations.get("spikes")
    rows = [
        ("key", str(trace.key)),
        ("kind", str(meta.get("kind"))),
        ("parent", f"{meta.get('parent')} at token {meta.get('branch_pos')}" if meta.get("parent") else "none"),
        ("problem", f"{problem.get('id')} (gold: {problem.get('gold')})"),
        ("base model", _model_text(pair.get("base"))),
        ("reasoning model", _model_text(pair.get("reason"))),
        ("dtype / device", f"{pair.get('dtype')} / {pair.get('device')}"),
        ("base prompt format", str(formats.get("base"))),
        ("reasoning prompt format", str(formats.get("reason"))),
        ("policy", f"{policy.get('name')} {_dumps(policy.get('params') or {})}"),
        ("sampling", ", ".join(f"{k}={v}" for k, v in sampling.items()) or "none"),
        ("seed", str(sampling.get("seed"))),
        ("answer / correct", f"{meta.get('answer')} / {meta.get('correct')}"),
        ("tokens / takeovers", f"{n} / {takeovers} (ρ = {takeovers / n if n else 0:.3f})"
                               + (f" · {forced} typed or forced" if forced else "")),
        ("spike rule", (describe_spike_rule(spikes.get("rule")) or "none") if isinstance(spikes, dict) else "none"),
        ("created", str(meta.get("created"))),
        ("versions", _dumps(meta.get("versions") or {})),
        ("schema", str(meta.get("schema"))),
    ]
    return rows


def html_page(
    traces: Sequence[Trace],
    score: str = DEFAULT_SCORE,
    decode: Callable[[int], str] | None = None,
    title: str = "forkpoint export",
    scale: str = "linear",
    model_paths: bool = False,
) -> str:
    """A self-contained HTML page (inline CSS/JS, no external resources) with each trace's heatmap. Models are
    named by hub id or file name; `model_paths=True` keeps a local model's absolute path."""
    check_score(score)
    esc = text_html  # element content; the one attribute below is html.escape'd
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{_PAGE_CSS}{heatmap_css()}</style></head><body>",
        f"<header><h1>{esc(title)}</h1><p class='muted'>{len(traces)} trace(s) · colour: {esc(score)} ({esc(scale)})"
        f" · exported {esc(utc_now())} by forkpoint {esc(forkpoint_version())}"
        " · hover a token for both models' top-k; click to pin</p></header>",
    ]
    for trace in traces:
        problem = trace.meta.get("problem") or {}
        meta = trace.meta if model_paths else _named(trace.meta)
        rows = "".join(f"<tr><td>{esc(label)}</td><td>{esc(value)}</td></tr>"
                       for label, value in settings_rows(trace, meta))
        parts += [
            f'<section class="trace" data-key="{html.escape(str(trace.key), quote=True)}">',
            f"<h2>{esc(str(problem.get('id', 'trace')))} <span class='muted'>{esc(str(trace.key))}</span></h2>",
            f'<table class="settings">{rows}</table>',
            "<details><summary>prompt</summary>"
            f"<pre class='prompt'>{esc(str(problem.get('prompt', '')))}</pre></details>",
            legend_html(trace.annotations.get("tags"), score=score, scale=scale,
                        spike_rule=describe_spike_rule((trace.annotations.get("spikes") or {}).get("rule"))),
            tokens_html(trace, score=score, decode=decode, scale=scale, css_tips=False),
            notes_html(trace),  # the notes layer (core/io/notes.py), escaped
            "<details><summary>full reproducibility record (JSON)</summary>"
            f"<pre class='record'>{esc(_dumps(meta, indent=1))}</pre></details>",
            "</section>",
        ]
    parts.append(f'<div id="fp-tip"></div><script>{_PAGE_JS}</script></body></html>')
    return "".join(parts)


def _dumps(value: Any, indent: int | None = None) -> str:
    return dumps_strict(value, ensure_ascii=False, indent=indent)
