"""core/views/token_payload.py: the one token-view payload the app's component and the notebook widget draw
(same hover k, rank-shift colours and paging)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from fakes import fake_decode, make_trace, with_switch_points

from core import settings
from core.annotate import rank_shift
from core.annotate.spikes import spikes
from core.scoring.registry import DEFAULT_SCORE, METRICS
from core.views.token_payload import view_payload


def _positions(html: str) -> list[int]:
    return [int(p) for p in re.findall(r'data-pos="(\d+)"', html)]


def test_hover_k_is_the_setting_and_never_more_than_the_trace_keeps():
    wide = make_trace(12, seed=1, k=settings.HOVER_K + 5)
    narrow = make_trace(12, seed=2, k=3)
    assert np.asarray(view_payload(wide)["hover"]["top"]["base"]).shape == (12, settings.HOVER_K)
    assert np.asarray(view_payload(narrow)["hover"]["top"]["reason"]).shape == (12, 3)
    assert np.asarray(view_payload(wide, k=2)["hover"]["prob"]["base"]).shape == (12, 2)


def test_rank_shift_colours_tokens_by_category_and_keeps_the_default_score_for_hover():
    trace = spikes(make_trace(40, seed=3), top=0.1)
    view = view_payload(trace, rank_shift.NAME, decode=fake_decode)
    used = {c for c in rank_shift.colours(trace) if c != "transparent"}
    assert used and all(colour in view["html"] for colour in used)
    assert view["hover"]["score_name"] == METRICS[DEFAULT_SCORE].signed_label
    assert view["spikes"] == trace.spike_positions


def test_a_page_holds_its_tokens_at_absolute_positions_with_the_whole_traces_spikes():
    trace = spikes(make_trace(50, seed=4), top=0.2)
    for score in (DEFAULT_SCORE, rank_shift.NAME):
        whole = view_payload(trace, score)
        page = view_payload(trace, score, start=20, end=35)
        assert _positions(page["html"]) == list(range(20, 35)) and page["offset"] == 20 and page["n"] == 15
        assert page["spikes"] == whole["spikes"] == trace.spike_positions
        assert page["hover"]["tokens"] == trace.tokens[20:35]
    cats = rank_shift.colours(trace)
    page = view_payload(trace, rank_shift.NAME, start=20, end=35)
    spans = re.findall(r'<span[^>]*data-pos="(\d+)"[^>]*>', page["html"])
    assert len(spans) == 15 and all(cats[int(p)] in page["html"] for p in spans if cats[int(p)] != "transparent")


def test_the_html_marks_the_pages_switch_points_and_n_p_walk_the_whole_traces():
    """Issue 31: the payload's HTML carries the dotted marker (class fp-matter, from tokens_html) on exactly the
    page's share of `matters`, the whole trace's switch points that n / p walk (token_view.js adds no marker)."""
    trace = with_switch_points(make_trace(50, seed=4), [2, 21, 30, 44])
    marked = lambda html: [int(p) for p in re.findall(r'class="tok[^"]*\bfp-matter\b[^"]*" data-pos="(\d+)"', html)]
    whole = view_payload(trace)
    assert whole["matters"] == [2, 16, 21, 30, 44]  # 16: make_trace's forced token
    assert marked(whole["html"]) == whole["matters"]
    page = view_payload(trace, start=20, end=35)
    assert page["matters"] == whole["matters"] and marked(page["html"]) == [21, 30]


def test_a_trace_without_spikes_gets_the_default_top_share():
    trace = make_trace(200, seed=5)
    assert view_payload(trace)["spikes"] == spikes(trace, top=settings.SPIKE_TOP).spike_positions


def test_the_notebook_widget_draws_the_same_payload():
    widget = pytest.importorskip("core.notebook.widget")  # the `notebook` extra (anywidget)
    trace = spikes(make_trace(30, seed=6, k=settings.HOVER_K + 3), top=0.1)
    for score in (DEFAULT_SCORE, rank_shift.NAME):
        app_view = view_payload(trace, score, decode=fake_decode)
        notebook_view = widget.widget_view(trace, score, fake_decode)
        assert {k: v for k, v in notebook_view.items() if k not in ("height", "prob_mode")} == {
            k: v for k, v in app_view.items() if k != "legend"}


def test_a_stream_keeps_the_parents_coloured_tokens_before_the_switch_and_escapes_the_new_text():
    from core.views.token_payload import stream_html, stream_prefix

    trace = spikes(make_trace(20, seed=7), top=0.1)
    whole = view_payload(trace)
    out = stream_html(trace, 8, "<b>new</b> text")
    assert _positions(out) == list(range(8))  # the parent's tokens before the switch, as spans of the view
    for pos in range(8):  # coloured on the whole trace's scale, as in the full view
        span = re.search(rf'<span[^>]*data-pos="{pos}"[^>]*>', whole["html"]).group(0)
        assert span in out
    assert "<span class='fp-live'>&lt;b&gt;new&lt;/b&gt; text</span>" in out and "▍" in out
    assert "▍" not in stream_html(trace, 8, "x", done=True, prefix=stream_prefix(trace, 8))
    assert _positions(stream_html(trace, 0, "all new")) == []
