"""What a view shows of a trace beside its scores: spikes under the rule on screen and planning tags, computed
when missing. The token view, `Trace._repr_html_`, the app and every export annotate through `annotated`."""

from __future__ import annotations

from typing import Any

from core import settings
from core.annotate.spikes import spikes
from core.annotate.tag_layer import TAGS_BY, current_tags
from core.scoring.registry import DEFAULT_SCORE
from core.trace import Trace


def annotated(trace: Trace, score: str = DEFAULT_SCORE, top: float | None = None, gate: Any = None) -> Trace:
    """The trace with what the user sees: spikes (under `top` or `gate`; else the trace's own layer; else
    the top settings.SPIKE_TOP) and planning tags / think-answer segments (computed when missing, or when
    the stored tags are another tagger's: `tag_layer.current_tags`; spaCy loads only then)."""
    out = trace
    if gate is not None:
        out = spikes(out, score=score, gate=gate)
    elif top is not None or "spikes" not in out.annotations:
        out = spikes(out, score=score, top=settings.SPIKE_TOP if top is None else top)
    stale = "tags" in out.annotations and current_tags(out) is None
    if stale or "tags" not in out.annotations or "segments" not in out.annotations:
        # spaCy: heavy, loaded only when tags must be computed
        from core.annotate.planning import annotate_tags

        tagged = annotate_tags(out)
        out = out.annotate(**{k: tagged.annotations[k] for k in ("tags", "segments")
                              if k not in out.annotations or (stale and k == "tags")})
        if stale:
            out.annotations.pop(TAGS_BY, None)  # the tags are the default tagger's now, not the stored ones'
    return out
