"""core.views.heatmap: colour scales against hand values, escaping of model text, markers, speed."""

from __future__ import annotations

import html
import re
import time
from html import unescape as html_unescape
from html.parser import HTMLParser

import numpy as np
import pytest
from fakes import fake_decode, make_trace, with_switch_points
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.errors import InvalidInputError
from core.views.heatmap import (
    NAN_COLOUR,
    SCALES,
    colour_scale,
    front_end_source,
    heatmap_css,
    legend_html,
    normalise,
    tag_colour,
    token_payload,
    token_tips,
    tokens_html,
)
from core.views.legend import SWITCH_POINT
from core.views.presentation import flip_changes, fmt_num, fmt_prob, tail

EVIL = "Hi <script>alert(1)</script> & <img src=x onerror=alert(1)> \"quoted\" 'single'\nnext"


class Spans(HTMLParser):
    """Collects every token span: attributes (unescaped by the parser) and its visible text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.spans: list[dict] = []
        self.segments: list[str] = []
        self._depth = 0  # depth inside the current token span
        self.tags_seen: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags_seen.append(tag)
        attrs = dict(attrs)
        if self._depth:
            self._depth += tag == "span"
            if tag == "br":
                self.spans[-1]["text"] += "<br>"
            return
        if tag == "span" and "tok" in (attrs.get("class") or "").split() and "data-pos" in attrs:
            self.spans.append({**attrs, "text": ""})
            self._depth = 1
        if tag == "div" and "seg" in (attrs.get("class") or "").split():
            self.segments.append(attrs["data-seg"])

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag == "span" and self._depth:
            self._depth -= 1

    def handle_endtag(self, tag):
        if self._depth and tag == "span":
            self._depth -= 1

    def handle_data(self, data):
        if self._depth:
            self.spans[-1]["text"] += data


def parse(fragment: str) -> Spans:
    parser = Spans()
    parser.feed(fragment)
    parser.close()
    return parser


# -- colour scales ---------------------------------------------------------------------------------


def test_linear_hand_values():
    colours = colour_scale([0.0, 1.0, 2.0, np.nan, np.inf])
    assert colours[0] == "#ffffff" and colours[2] == "#dc2626"  # the scale's two ends
    assert colours[3] == NAN_COLOUR and colours[4] == NAN_COLOUR
    assert colours[1] == "#fdb974"  # the midpoint stop (253, 186, 116), up to LUT rounding of one step
    np.testing.assert_allclose(normalise([2.0, 3.0, 4.0, 10.0], vmin=2.0, vmax=4.0), [0.0, 0.5, 1.0, 1.0])
    np.testing.assert_allclose(normalise([5.0, 5.0]), [0.0, 0.0])  # a constant row: no division by zero
    assert colour_scale([]) == []


def test_log_and_rank_hand_values():
    u = normalise([0.0, 1.0, 100.0], scale="log")
    np.testing.assert_allclose(u, [0.0, np.log1p(99 * 0.01) / np.log(100), 1.0])
    np.testing.assert_allclose(normalise([30.0, 10.0, 20.0, 20.0], scale="rank"), [1.0, 0.0, 0.5, 0.5])
    np.testing.assert_allclose(normalise([np.nan, 7.0], scale="rank"), [np.nan, 0.0])


def test_unknown_scale_lists_choices():
    with pytest.raises(InvalidInputError, match="linear, log, rank"):
        colour_scale([1.0], scale="sqrt")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.sampled_from(SCALES),
)
@example([0.0, 5e-324], "rank")  # two values the warp below merges (a full-suite run drew them)
def test_colour_is_monotone_in_value(values, scale):
    u = normalise(values, scale=scale)
    assert np.all((u >= 0) & (u <= 1))
    order = np.argsort(values, kind="stable")
    assert np.all(np.diff(u[order]) >= -1e-12)  # larger value, never a lighter colour
    if scale == "rank":  # invariant under any strictly increasing transform
        warped = np.arctan(np.asarray(values) / 1e3)
        if np.unique(warped).size == np.unique(values).size:  # rounding can merge neighbours (0 and 5e-324)
            np.testing.assert_allclose(u, normalise(warped, scale="rank"))


# -- token spans --------------------------------------------------------------------------------------


def test_one_span_per_token_in_order_with_escaped_text():
    trace = make_trace(text=EVIL, seed=3)
    out = tokens_html(trace, decode=fake_decode)
    assert "<script>" not in out and "<img" not in out
    spans = parse(out).spans
    assert [int(s["data-pos"]) for s in spans] == list(range(len(trace)))
    shown = "".join(s["text"] for s in spans)
    assert shown == trace.text.replace("\n", "↵<br>")  # newlines visible and line-broken
    assert "<br>" in out and "↵" in out


def test_bidirectional_controls_show_as_code_points_and_reorder_nothing():
    """A right-to-left override (U+202E) in one token mirrored every token after it in the app and the HTML
    export: each bidirectional control shows as its code point, and the other text is as it was."""
    text = "ab \u202ecd\u2066 e\u200ff"
    trace = make_trace(text=text, seed=3)
    out = tokens_html(trace, decode=fake_decode)
    assert not any(c in out for c in "\u202e\u2066\u200f")
    shown = "".join(s["text"] for s in parse(out).spans)
    assert shown == "ab U+202Ecd" + "U+2066 eU+200Ff"
    assert out.count('class="fp-ctl"') == 3


def test_markers_match_annotations():
    trace = make_trace(60, seed=7, annotate=True)
    spans = parse(tokens_html(trace, selected=5)).spans
    classes = [set(s["class"].split()) for s in spans]
    assert [i for i, c in enumerate(classes) if "spike" in c] == trace.annotations["spikes"]["positions"]
    assert [i for i, c in enumerate(classes) if "sel" in c] == [5]
    assert [i for i, c in enumerate(classes) if "src-reason" in c] == [
        i for i, s in enumerate(trace.source) if s == "reason"
    ]
    assert [i for i, c in enumerate(classes) if "src-forced" in c] == [20]  # make_trace forces n // 3
    planning = [i for i, t in enumerate(trace.annotations["tags"]) if t != "execute"]
    assert planning and [i for i, c in enumerate(classes) if "tag" in c] == planning
    assert [s["data-tag"] for s in spans if "data-tag" in s] == [trace.annotations["tags"][i] for i in planning]
    colours = {tag_colour(t) for t in ("plan", "reflect", "verify", "conclude")}
    assert {s["style"].split("--tag:")[1] for s in spans if "data-tag" in s} <= colours
    # explicit arguments override the layers; show_source=False hides the markers
    spans = parse(tokens_html(trace, spikes=[1, 2], tags=[""] * 60, show_source=False)).spans
    classes = [set(s["class"].split()) for s in spans]
    assert [i for i, c in enumerate(classes) if "spike" in c] == [1, 2]
    assert not any({"tag", "src-reason", "src-forced"} & c for c in classes)


def test_switch_points_carry_the_dotted_marker_and_leave_the_text_as_it_was():
    """Issue 31: every view that draws tokens (the live view, the Trace page's columns, the HTML export) marks where
    a flip changes the text (`flip_changes`: here the chosen points and the forced token) with one class, drawn as
    a dotted underline by the one stylesheet they all include; the escaped text is the same with or without it."""
    trace = with_switch_points(make_trace(text=EVIL, seed=3), [1, 4, 9])
    assert flip_changes(trace) == [1, 3, 4, 9]  # 3: make_trace's forced token
    out = tokens_html(trace, decode=fake_decode)
    spans = parse(out).spans
    assert [int(s["data-pos"]) for s in spans if "fp-matter" in s["class"].split()] == [1, 3, 4, 9]
    bare = tokens_html(trace, decode=fake_decode, switch_points=[])
    assert "fp-matter" not in bare and out.replace(" fp-matter", "") == bare  # nothing else changed
    assert "<script>" not in out and "<img" not in out
    assert "".join(s["text"] for s in spans) == trace.text.replace("\n", "↵<br>")
    given = parse(tokens_html(trace, switch_points=[2], tips=False)).spans
    assert [int(s["data-pos"]) for s in given if "fp-matter" in s["class"].split()] == [2]
    # a page of the trace: data-pos absolute, the page's share marked
    page = parse(tokens_html(tail(trace, 4), offset=4, tips=False)).spans
    assert [int(s["data-pos"]) for s in page if "fp-matter" in s["class"].split()] == [4, 9]
    # one rule, in the stylesheet every view includes (the live view's own sheet has none), and one legend entry
    rule = re.search(r"\.tok\.fp-matter:not\(\.sw\):not\(\.diff\) \{([^}]*)\}", heatmap_css())
    assert rule and "underline dotted #111827" in rule.group(1) and "text-decoration-thickness: 2px" in rule.group(1)
    assert "fp-matter" not in front_end_source("token_view.css")
    legend = legend_html()
    assert '<span class="tok fp-matter">switch point</span>' in legend and f"({SWITCH_POINT})" in legend


def test_background_follows_score():
    trace = make_trace(40, seed=2)
    for score in ("cross_entropy", "jsd", "delta_logp"):
        spans = parse(tokens_html(trace, score=score, tips=False)).spans
        backgrounds = [s["style"].split(";")[0].removeprefix("background:") for s in spans]
        from core.scoring.registry import score_values

        assert backgrounds == colour_scale(score_values(trace.metrics, score))
    with pytest.raises(InvalidInputError, match="cross_entropy"):
        tokens_html(trace, score="kll")


def test_a_negated_score_is_labelled_as_its_negative():
    """delta_logp colours by −Δlog p (higher = more disagreement): every label of those values says so."""
    from app.figures import trace_figure
    from core.scoring.registry import score_label
    from core.views.heatmap import legend_html
    from core.views.presentation import hover_data

    trace = make_trace(12, seed=3)
    assert score_label("delta_logp") == "Log-prob loss (base − reasoner)" and score_label("jsd") == "Jensen-Shannon divergence"
    assert "Log-prob loss (base − reasoner)" in html_unescape(legend_html(score="delta_logp"))
    assert trace_figure(trace, "delta_logp").layout.yaxis.title.text == "Log-prob loss (base − reasoner) [nats]"
    assert hover_data(trace, "delta_logp")["score_name"] == score_label("delta_logp")


def test_segments_are_marked():
    trace = make_trace(30, seed=1, annotate=True)
    parsed = parse(tokens_html(trace))
    assert parsed.segments == ["think", "answer"]
    out = tokens_html(trace)
    assert out.index('data-seg="answer"') > out.index('data-pos="19"') and out.index('data-seg="answer"') < out.index(
        'data-pos="20"'
    )
    with pytest.raises(InvalidInputError, match="tags has 3 entries for 30 tokens"):
        tokens_html(trace, tags=["a", "b", "c"])


def test_tips_carry_both_models_topk_escaped():
    trace = make_trace(12, seed=4, k=5)
    evil_decode = lambda i: f"<b>{i}</b>\"'&"  # noqa: E731
    out = tokens_html(trace, decode=evil_decode)
    assert "<b>" not in out
    spans = parse(out).spans
    tips = token_tips(trace, decode=evil_decode)
    for i, span in enumerate(spans):
        tip = span["data-tip"]  # the parser unescapes attributes: this is what the user sees
        assert tip == tips[i]
        for side in ("base", "reason"):
            top_id = int(trace.topk[side][0][i, 0])
            assert repr(evil_decode(top_id)) in tip
            assert fmt_prob(float(trace.topk[side][1][i, 0])) in tip
        assert fmt_num(trace.metrics['entropy_base'][i]) in tip and fmt_num(trace.metrics['kl_base_reason'][i]) in tip
        assert f"(rank {int(trace.metrics['rank_base'][i])})" in tip
    # without a decoder, ids are shown
    assert f"#{int(trace.topk['reason'][0][0, 0])}" in token_tips(trace)[0]
    assert "data-tip" not in tokens_html(trace, tips=False)


def test_payload_is_json_ready():
    import json

    trace = make_trace(6, seed=5, k=3)
    payload = token_payload(trace, decode=fake_decode)
    json.dumps(payload, allow_nan=False)
    assert [p["pos"] for p in payload] == list(range(6))
    assert payload[2]["top_reason"][0]["id"] == int(trace.topk["reason"][0][2, 0])
    assert payload[2]["top_reason"][0]["text"] == fake_decode(int(trace.topk["reason"][0][2, 0]))
    assert payload[2]["cross_entropy"] == pytest.approx(trace.metrics["cross_entropy"][2])


def test_legend_and_tag_colours():
    legend = legend_html(["plan", "", None, "<b>odd</b>", "plan", "execute", "reflect"])
    assert "<b>odd</b>" not in legend and html.escape("<b>odd</b>") in legend
    assert legend.count(">plan<") == 1 and ">reflect<" in legend and "execute" not in legend
    assert "spike" not in legend and "reasoner" in legend  # no spike swatch without a spike rule
    with_rule = legend_html(["plan"], spike_rule="top 5% by Cross-entropy per trace")
    assert 'class="tok spike"' in with_rule and "top 5% by Cross-entropy" in with_rule
    assert "Cross-entropy" in legend and "cross_entropy" not in legend  # the registry's label, not the name
    assert tag_colour("execute") is None and tag_colour(None) is None
    assert tag_colour("plan") == tag_colour("Plan") and tag_colour("weird") == tag_colour("weird")
    assert len({tag_colour(c) for c in ("plan", "reflect", "verify", "conclude")}) == 4
    assert ".fp-heatmap" in heatmap_css() and "url(" not in heatmap_css()


def test_render_time_grows_linearly_with_tokens():
    """No O(T²) work in the render: 4096 tokens cost about 4x what 1024 do (best of 3 each, CPU time,
    measured side by side; the bound leaves room for a noisy machine, a quadratic render gives ~16x)."""
    def best(n: int) -> float:
        trace = make_trace(n, seed=11, k=10, annotate=True)
        times = []
        for _ in range(3):
            start = time.process_time()
            out = tokens_html(trace, decode=fake_decode)
            times.append(time.process_time() - start)
        assert out.count('class="tok') == n
        return min(times)

    small, large = best(1024), best(4096)
    assert large / small < 8, f"1024 tokens {small:.3f} s, 4096 tokens {large:.3f} s"


# -- issue 11: one colour range across views, whole graphemes -----------------------------------------


def test_shared_range_gives_one_colour_per_value_across_views():
    from core.views.heatmap import value_range

    a, b = make_trace(20, seed=1), make_trace(20, seed=2)
    lo, hi = value_range(a.metrics["cross_entropy"], b.metrics["cross_entropy"])
    assert lo == pytest.approx(min(a.metrics["cross_entropy"].min(), b.metrics["cross_entropy"].min()))
    whole = tokens_html(a, vmin=lo, vmax=hi, tips=False)
    from core.views.presentation import tail

    part = tokens_html(tail(a, 7), vmin=lo, vmax=hi, offset=7, tips=False)  # the comparison's slice of `a`
    colours = dict(re.findall(r'data-pos="(\d+)" style="background:(#[0-9a-f]{6})', whole))
    sliced = dict(re.findall(r'data-pos="(\d+)" style="background:(#[0-9a-f]{6})', part))
    assert len(sliced) == 13 and all(colours[k] == v for k, v in sliced.items())
    own = dict(re.findall(r'data-pos="(\d+)" style="background:(#[0-9a-f]{6})', tokens_html(tail(a, 7), offset=7, tips=False)))
    assert own != sliced  # without the shared range the slice is rescaled (the old comparison's lie)
    ranked = normalise([1.0, 5.0], scale="rank", reference=[0.0, 1.0, 2.0, 5.0, 9.0])
    np.testing.assert_allclose(ranked, [0.25, 0.75])


def test_offset_shifts_positions():
    out = tokens_html(make_trace(5, seed=1), offset=100, tips=False)
    assert re.findall(r'data-pos="(\d+)"', out) == ["100", "101", "102", "103", "104"]


def test_grapheme_split_over_tokens_renders_whole_and_every_token_stays_clickable():
    from core.views.heatmap import grapheme_groups

    thumbs = "\U0001F44D"  # 👍
    tone = "\U0001F3FD"  # medium skin tone modifier: one grapheme with the thumb
    tokens = ["I", " like", " it", " " + thumbs, tone, "!", "", "", "é"]
    assert grapheme_groups(tokens) == [0, 1, 2, 3, 3, 5, 6, 6, 6]
    trace = make_trace(len(tokens), seed=3)
    trace.tokens = tokens
    out = tokens_html(trace, tips=False)
    assert re.findall(r'data-pos="(\d+)"', out) == [str(i) for i in range(len(tokens))]
    assert html.escape(" " + thumbs + tone) in out  # the whole grapheme in one span
    groups = re.findall(r'<span class="gph">(.*?)</span></span>', out)
    assert len(groups) == 2 and all(g.count("data-pos=") >= 2 for g in groups)


def test_tips_list_every_top_k_row_in_the_apps_format():
    """Issue 22 defect 5: the HTML export / _repr_html_ printed 1.000 / 0.000 and only a top-5 (the app: top-10)."""
    trace = make_trace(40, seed=5, k=10, sharpness=12.0)  # sharp: probabilities near 1 and near 0
    probs = np.concatenate([np.asarray(trace.topk[s][1], dtype=np.float64).reshape(-1) for s in ("base", "reason")])
    assert (probs > 0.9995).any() and (probs < 5e-4).any()
    for i, tip in enumerate(token_tips(trace)):
        rows = tip.split("reason top-")[1].splitlines()[1:]
        assert len(rows) == 10 and "top-10" in tip
        assert not re.search(r"(?<![\d.])(1\.000|0\.000)(?!\d)", tip), tip
        for j in range(10):
            assert fmt_prob(float(trace.topk["base"][1][i, j])) in rows[j]


def test_notes_are_marked_on_their_tokens_with_the_text_on_hover():
    trace = make_trace(12, seed=6).annotate(notes=[
        {"id": "a", "start": 2, "end": 3, "text": "<img src=x onerror=alert(1)> look", "bookmark": False},
        {"id": "b", "start": 7, "end": 7, "text": "", "bookmark": True}])
    spans = parse(tokens_html(trace, tips=False)).spans
    noted = {i: s for i, s in enumerate(spans) if "note" in s["class"].split()}
    assert sorted(noted) == [2, 3, 7] and "bm" in noted[7]["class"].split()
    assert noted[2]["data-note"] == "<img src=x onerror=alert(1)> look"  # attribute text, unescaped by the parser
    assert "<img" not in tokens_html(trace, tips=False)
    assert "✎ note: <img src=x onerror=alert(1)> look" in token_tips(trace)[3]
    page = tail(trace, 3, 8)  # a page of the trace keeps its notes, shifted
    assert sorted(i for i, s in enumerate(parse(tokens_html(page, tips=False)).spans)
                  if "note" in s["class"].split()) == [0, 4]


def test_grapheme_start_points_a_byte_piece_at_its_characters_first_token():
    """Issue 22 defect 6: a takeover at the second byte piece of an emoji starts the branch with "�"."""
    from core.views.heatmap import grapheme_start

    tokens = [" a", "", "", "😀", " b", "👍", "🏽", " c"]  # 😀 in three byte pieces; 👍🏽 one grapheme of two tokens
    assert [grapheme_start(tokens, i) for i in range(len(tokens))] == [0, 1, 1, 1, 4, 5, 5, 7]


def test_measured_effects_are_marked_on_exactly_their_tokens_with_the_sign_in_the_colour():
    """The "effects" layer (core.instruments.effects.attach_effects): a bar over each measured token, teal for
    an effect above 0 and brown below (the diverging scale), the numbers on hover, shifted with a page."""
    from core.views.colours import effect_colour
    from core.views.presentation import hover_data

    layer = [{"pos": 2, "effect": 0.5, "ci_low": 0.1, "ci_high": 0.8, "acc_with": 0.75, "acc_without": 0.25, "n": 8},
             {"pos": 9, "effect": -0.25, "ci_low": -0.6, "ci_high": 0.2, "acc_with": 0.25, "acc_without": 0.5, "n": 4},
             {"pos": 9, "effect": 1.0, "ci_low": 0.2, "ci_high": 1.0, "acc_with": 1.0, "acc_without": 0.0, "n": 1}]
    trace = make_trace(12, seed=6).annotate(effects=layer)
    spans = parse(tokens_html(trace, tips=False)).spans
    marked = {i: s for i, s in enumerate(spans) if "fx" in s["class"].split()}
    assert sorted(marked) == [2, 9]
    assert float(marked[2]["data-fx"]) == 0.5 and float(marked[9]["data-fx"]) == -0.25  # the n = 4 row wins at 9

    def rgb(span):
        colour = re.search(r"--fx:#([0-9a-f]{6})", span["style"]).group(1)
        return [int(colour[k:k + 2], 16) for k in (0, 2, 4)]

    (r1, g1, b1), (r2, g2, b2) = rgb(marked[2]), rgb(marked[9])
    assert g1 > r1 and b1 > r1  # teal: the reasoner's token helps
    assert r2 > b2 and r2 > g2  # brown: it hurts
    assert effect_colour(0.0) == "#e5e7eb" and effect_colour(5) == effect_colour(1) != effect_colour(-1)
    assert "effect +0.50 [+0.10, +0.80] · acc with 0.75 / without 0.25 · n = 8 per arm" in token_tips(trace)[2]
    assert "effect" not in token_tips(trace)[3]
    hover = hover_data(trace)
    assert set(hover["effects"]) == {"2", "9"} and hover["effects"]["9"]["effect"] == -0.25
    assert all(isinstance(v, float) for rec in hover["effects"].values() for v in rec.values())
    page = tail(trace, 3, 12)
    assert [i for i, s in enumerate(parse(tokens_html(page, tips=False)).spans) if "fx" in s["class"].split()] == [6]
    assert ".tok.fx" in heatmap_css() and "effect" in legend_html(effects=True) and "effect" not in legend_html()
    assert "fx" not in tokens_html(make_trace(12, seed=6), tips=False)
