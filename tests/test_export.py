"""core.export: lossless JSONL, long CSV/Parquet, self-contained and escaped HTML (imports: test_imports.py)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from fakes import fake_decode, make_trace, with_switch_points

from core.errors import InvalidInputError, OutputExistsError
from core.scoring.registry import METRICS
from core.views.exports import (
    FORMATS,
    annotated,
    export,
    forkpoint_version,
    read_jsonl,
    sidecar_path,
)
from tests.browser import CHROMIUM, CHROMIUM_ARGS, require_chromium

EVIL = "Sure <script>alert(1)</script> and <img src=x onerror=alert(1)> done\n</pre></details><b>x"


@pytest.fixture
def traces():
    a = make_trace(25, seed=1, annotate=True)
    b = make_trace(text=EVIL, seed=2, meta={"problem": {"id": "<i>p2</i>", "prompt": EVIL, "gold": "<b>4</b>"}})
    c = make_trace(10, seed=3)
    c.metrics["logp_base"][:3] = np.nan  # target metrics can be NaN (not known yet)
    return [a, b, c]


class Tags(HTMLParser):
    """Names of the real tags in a page and any attribute that would fetch a resource."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.loading: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        self.names.add(tag)
        self.loading += [(tag, name) for name, _ in attrs if name in {"src", "href", "srcset", "action", "data"}]


def _strict_json(line: str):
    def no_constants(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(line, parse_constant=no_constants)


# -- JSONL -----------------------------------------------------------------------------------------


def test_jsonl_round_trip(tmp_path, traces):
    path = export(traces, tmp_path / "t.jsonl")
    back = read_jsonl(path)
    assert len(back) == 3
    for original, read in zip(traces, back):
        assert read == annotated(original)  # lossless, plus the annotations the user sees
        for name in METRICS:
            assert read.metrics[name].dtype == original.metrics[name].dtype
        assert read.topk["base"][1].dtype == np.float32
        np.testing.assert_array_equal(read.topk["reason"][1], original.topk["reason"][1])  # exact, not close
    assert np.isnan(back[2].metrics["logp_base"][:3]).all()
    lines = path.read_text(encoding="utf-8").splitlines()
    for line in lines:
        record = _strict_json(line)  # NaN is written as null: strict readers can parse it
        assert record["forkpoint_trace"] == 1
        assert record["exported_by"]["forkpoint"] == forkpoint_version()
        assert record["meta"]["pair"]["base"]["revision"] == "abc123"


def test_jsonl_empty_trace_round_trip(tmp_path):
    empty = make_trace(0, seed=9)
    assert read_jsonl(export(empty, tmp_path / "e.jsonl"))[0] == annotated(empty)


def test_read_jsonl_names_bad_line(tmp_path, traces):
    path = export(traces[:2], tmp_path / "t.jsonl")
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text(lines[0] + "\n\n" + lines[1][:-40] + "\n", encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"line 3"):
        read_jsonl(path)
    path.write_text(lines[0] + "\n" + json.dumps({"id": 1}) + "\n", encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"line 2: .*forkpoint_trace"):
        read_jsonl(path)
    record = json.loads(lines[0])
    record["forkpoint_trace"] = 99
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"line 1: .*newer"):
        read_jsonl(path)
    with pytest.raises(InvalidInputError, match="No such file"):
        read_jsonl(tmp_path / "missing.jsonl")


# -- formats and overwriting ----------------------------------------------------------------------------


def test_format_validation_and_overwrite(tmp_path, traces):
    with pytest.raises(InvalidInputError, match="jsonl, csv, parquet, html"):
        export(traces, tmp_path / "t.xlsx")
    with pytest.raises(InvalidInputError, match="Unknown export format 'xml'"):
        export(traces, tmp_path / "t.jsonl", "xml")
    with pytest.raises(InvalidInputError, match="No traces"):
        export([], tmp_path / "t.jsonl")
    for fmt in FORMATS:
        path = tmp_path / f"out.{fmt}"
        export(traces, path)
        before = path.read_bytes()
        with pytest.raises(OutputExistsError, match="already exists; overwrite=True"):
            export(traces[:1], path)
        assert path.read_bytes() == before
        export(traces[:1], path, overwrite=True)
        assert path.read_bytes() != before
    # format given explicitly wins over the suffix
    export(traces, tmp_path / "data.txt", "jsonl")
    assert len(read_jsonl(tmp_path / "data.txt")) == 3
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp files left behind


def test_every_format_in_the_table_writes_exactly_its_files(tmp_path, traces):
    """FORMATS is the one table: each row's writer makes the file under its suffix plus its sidecars and nothing
    else; the CLI's --format choices and the app's download buttons read the same rows."""
    from click import Choice

    from app.downloads import export_file_bytes, file_name, mime_type
    from core.cli.store import export as export_command

    for name, spec in FORMATS.items():
        folder = tmp_path / name
        out = export(traces, folder / f"t{spec.suffix}")
        assert sorted(folder.iterdir()) == sorted(spec.paths(out)), name
        assert file_name(["abcdefgh12"], name) == "forkpoint-abcdefgh" + (".zip" if spec.sidecars else spec.suffix)
        assert mime_type(name) == ("application/zip" if spec.sidecars else spec.mime)
        data = export_file_bytes(traces, name)
        if spec.sidecars:  # one zip of the file and its sidecars
            import io
            import zipfile

            names = zipfile.ZipFile(io.BytesIO(data)).namelist()
            assert names == [p.name for p in spec.paths(tmp_path / f"traces{spec.suffix}")], name
        else:  # the file itself (same kind: its first bytes; the provenance time may differ)
            assert data[:4] == out.read_bytes()[:4] and len(data) > 100, name
    assert FORMATS["csv"].paths(tmp_path / "x.csv") == [tmp_path / "x.csv", sidecar_path(tmp_path / "x.csv")]
    (option,) = [p for p in export_command.params if p.name == "fmt"]
    assert isinstance(option.type, Choice) and list(option.type.choices) == list(FORMATS)


# -- CSV / Parquet ---------------------------------------------------------------------------------------


def test_csv_long_format(tmp_path, traces):
    path = export(traces, tmp_path / "t.csv")
    frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    assert len(frame) == sum(len(t) for t in traces)
    expected_cols = ["trace_key", "pos", "token_id", "token", *METRICS, "source"]
    assert list(frame.columns[: len(expected_cols)]) == expected_cols
    topk_cols = {"topk_base_ids", "topk_base_probs", "topk_reason_ids", "topk_reason_probs"}
    assert {"tag", "segment", "spike", *topk_cols} <= set(frame.columns)
    for trace in traces:
        rows = frame[frame["trace_key"] == trace.key].reset_index(drop=True)
        ref = trace.frame()
        np.testing.assert_allclose(rows["cross_entropy"], ref["cross_entropy"], rtol=1e-12)
        np.testing.assert_array_equal(rows["rank_reason"], ref["rank_reason"])
        ids = [json.loads(v) for v in rows["topk_reason_ids"]]
        assert ids == trace.topk["reason"][0].tolist()
        probs = np.array([json.loads(v) for v in rows["topk_base_probs"]])
        np.testing.assert_allclose(probs, trace.topk["base"][1], rtol=1e-7)
    with open(path, encoding="utf-8", newline="") as fh:  # tokens with newlines, quotes and markup survive
        assert pd.read_csv(fh, keep_default_na=False)["token"].tolist()[25:] == traces[1].tokens + traces[2].tokens
    sidecar = json.loads(sidecar_path(path).read_text(encoding="utf-8"))
    assert sidecar["forkpoint_version"] == forkpoint_version()
    assert [t["key"] for t in sidecar["traces"]] == [t.key for t in traces]
    assert sidecar["traces"][0]["meta"]["sampling"]["seed"] == 1
    assert sidecar["traces"][0]["annotations"]["spikes"]["rule"]["score"] == "cross_entropy"


def test_the_long_frame_of_many_traces_is_their_frames_one_after_another(traces):
    """`long_frame` makes one frame of traces that carry the same layers (an export of 5,600 demo traces built
    5,600 frames: 6.2 s of its 40 s per 1,500), and pandas' alignment of one frame per trace where they differ
    or one is empty: both equal, value for value and dtype for dtype, the concatenation of each trace's own
    long frame."""
    from core.views.exports import long_frame

    same = [annotated(make_trace(n, seed=s, annotate=True)) for s, n in enumerate((12, 30, 7))]
    switched = annotated(make_trace(9, seed=7, annotate=True, meta={"switches": {"3": "reason"}}))
    unsegmented = annotated(make_trace(8, seed=9, annotate=True))
    del unsegmented.annotations["segments"]
    empty = annotated(make_trace(0, seed=8, annotate=True))
    for group in (same, [*same, switched], [*traces, *same], [*same, unsegmented], [*same, empty], [empty], []):
        want = pd.concat([long_frame([t]) for t in group], ignore_index=True) if group else pd.DataFrame()
        pd.testing.assert_frame_equal(long_frame(group), want, check_exact=True)
    assert "segment" in long_frame(same) and "segment" not in long_frame([unsegmented])
    assert long_frame([*same, unsegmented])["segment"].isna().sum() == 8  # aligned: NaN where a layer is missing
    assert len(long_frame(same)) == 49 and long_frame(same)["trace_key"].tolist()[:12] == [same[0].key] * 12


def test_parquet_long_format(tmp_path, traces):
    path = export(traces, tmp_path / "t.parquet")
    table = pq.read_table(path)
    assert table.num_rows == sum(len(t) for t in traces)
    frame = table.to_pandas()
    assert {"trace_key", "pos", "token", "source", *METRICS, "topk_base_ids", "topk_reason_probs"} <= set(frame.columns)
    assert all(len(v) == 5 for v in frame["topk_base_ids"])
    np.testing.assert_allclose(frame["jsd"][:25], traces[0].metrics["jsd"])
    assert frame["spike"][:25].sum() == len(traces[0].annotations["spikes"]["positions"])
    header = json.loads(table.schema.metadata[b"forkpoint"])
    assert header["forkpoint_version"] == forkpoint_version() and header["format"] == "parquet"
    assert header["traces"][1]["meta"]["pair"]["reason"]["id"] == "fake/reason-0.1B"


# -- HTML ---------------------------------------------------------------------------------------------


def test_html_escapes_all_model_text(tmp_path, traces):
    evil_decode = lambda i: "<img src=x onerror=alert(2)>" if i % 2 else fake_decode(i)  # noqa: E731
    page = export(traces, tmp_path / "t.html", decode=evil_decode).read_text(encoding="utf-8")
    for raw in ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "<img src=x onerror=alert(2)>",
                "<i>p2</i>", "<b>4</b>", "</pre></details><b>x"]:  # fmt: skip
        assert raw not in page, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<script") == 1  # only the page's own tooltip script
    assert len(re.findall(r"<img", page)) == 0


def test_html_names_local_models_by_their_file_name_unless_asked(tmp_path):
    """Issue 31: a shared HTML page names a local model by its folder / file name, not the user's absolute path
    (in the settings table and the JSON record); html_page(model_paths=True) keeps the path."""
    from core.views.html_page import html_page

    local = {"id": "/home/someone/models/SmolLM2-135M", "revision": None, "gguf_file": "/srv/m/smol.Q8_0.gguf"}
    trace = make_trace(6, seed=4, meta={"pair": {"base": local, "reason": {"id": "org/reasoner-1B"}},
                                        "request": {"pair": {"base": local, "reason": {"id": "org/reasoner-1B"}}}})
    page = html_page([trace])
    assert "/home/someone" not in page and "/srv/m" not in page
    assert "SmolLM2-135M (smol.Q8_0.gguf)" in page and "org/reasoner-1B" in page
    kept = html_page([trace], model_paths=True)
    assert "/home/someone/models/SmolLM2-135M" in kept and "/srv/m/smol.Q8_0.gguf" in kept


def test_html_shows_bidirectional_controls_as_code_points_everywhere(tmp_path):
    """A right-to-left override in the prompt (or anywhere in the record) mirrored the rest of its line on the
    page: the page holds no bidirectional control at all, each is shown as its code point; the hover card gets
    the same set to escape (token_view.js `visible`)."""
    from core import settings
    from core.views.html_page import html_page
    from core.views.token_payload import view_payload

    trace = make_trace(text="ok \u202eyes\u2066 no", seed=4,
                       meta={"problem": {"id": "p\u202e1", "prompt": "How many? \u202eevil\u202c done"}})
    page = html_page([trace])
    assert not re.search(f"[{settings.BIDI_CONTROLS}]", page)
    assert "How many? <span class=\"fp-ctl\">U+202E</span>evil<span class=\"fp-ctl\">U+202C</span> done" in page
    assert view_payload(trace)["hover"]["bidi"] == settings.BIDI_CONTROLS


def test_html_is_self_contained_with_settings(tmp_path, traces):
    page = export(traces, tmp_path / "t.html", score="jsd").read_text(encoding="utf-8")
    assert not re.search(r"https?://", page)
    tags = Tags()
    tags.feed(page)
    assert tags.names <= {"html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "p", "section",
                          "table", "tr", "td", "details", "summary", "pre", "div", "span", "br", "script"}  # fmt: skip
    assert not tags.loading, tags.loading  # no tag fetches anything
    assert "@import" not in page and "url(" not in page
    assert page.count('class="tok') >= sum(len(t) for t in traces)
    assert page.count("data-pos=") == sum(len(t) for t in traces)
    for needle in ["fake/base-0.1B @ abc123", "fake/reason-0.1B @ def456", "float64 / cpu", "chat:think",
                   "temperature=0.6", "top_p=0.95", "guided", forkpoint_version(), 'data-score="jsd"']:  # fmt: skip
        assert needle in page, needle
    assert "data-tip=" in page and 'id="fp-tip"' in page and "spike" in page
    with pytest.raises(InvalidInputError, match="Unknown score"):
        export(traces, tmp_path / "u.html", score="nope")


def test_html_export_marks_the_switch_points_as_the_live_view_does(tmp_path):
    """Issue 31 (D3b): the exported page marks where a flip changes the text, each trace its own `flip_changes`,
    with the live view's marker (class fp-matter, its dotted rule in the page's style) and a legend entry."""
    from core.views.legend import SWITCH_POINT
    from core.views.presentation import flip_changes

    a = with_switch_points(make_trace(20, seed=8), [2, 11])
    b = with_switch_points(make_trace(text=EVIL, seed=2), [1])
    text = export([a, b], tmp_path / "t.html", decode=fake_decode).read_text(encoding="utf-8")
    sections = text.split('<section class="trace"')[1:]
    assert len(sections) == 2
    for trace, section in zip([a, b], sections):
        marked = [int(p) for p in re.findall(r'class="tok[^"]*\bfp-matter\b[^"]*" data-pos="(\d+)"', section)]
        assert marked == flip_changes(trace) and marked
        assert f'<span class="tok fp-matter">switch point</span></span><span>({SWITCH_POINT})</span>' in section
    assert flip_changes(a) == [2, 6, 11]  # 6: make_trace's forced token
    assert ".fp-heatmap .tok.fp-matter:not(.sw):not(.diff) { text-decoration: underline dotted" in text
    assert "<script>alert(1)" not in text


@pytest.mark.browser
def test_html_export_draws_the_switch_points_dotted_in_browser(tmp_path):
    """Issue 31 (D3b) in Chromium: a switch point of the exported page is underlined dotted over its heatmap
    colour; a token elsewhere is not underlined."""
    playwright = pytest.importorskip("playwright.sync_api")
    require_chromium()
    path = export(with_switch_points(make_trace(20, seed=8), [2, 11]), tmp_path / "t.html", decode=fake_decode)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto(path.as_uri())
        look = """(pos) => { const s = getComputedStyle(document.querySelector(`.fp-heatmap .tok[data-pos="${pos}"]`));
            return [s.textDecorationLine, s.textDecorationStyle, s.textDecorationThickness, s.backgroundColor]; }"""
        line, style, thickness, background = page.evaluate(look, 11)
        assert (line, style, thickness) == ("underline", "dotted", "2px")
        assert background not in ("", "rgba(0, 0, 0, 0)")  # on its heatmap colour
        assert page.evaluate(look, 3)[0] == "none"
        browser.close()


@pytest.mark.browser
def test_html_tooltip_in_browser(tmp_path, traces):
    playwright = pytest.importorskip("playwright.sync_api")
    require_chromium()
    path = export(traces, tmp_path / "t.html", decode=fake_decode)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        requests: list[str] = []
        dialogs: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(path.as_uri())
        page.locator('.tok[data-pos="3"]').first.hover()
        tip = page.locator("#fp-tip")
        assert tip.is_visible()
        assert "base top-5" in tip.text_content() and "reason top-5" in tip.text_content()
        page.locator('.tok[data-pos="5"]').nth(1).click()  # the trace whose text carries <script>/<img>
        assert tip.is_visible() and dialogs == []
        browser.close()
    assert requests == [path.as_uri()]


# -- annotations in every format (issue 11: "annotated" exports carried none) -----------------------------


def _expected(trace, top=0.1):
    from core.annotate.spikes import spikes
    from core.views.heatmap import tag_colour

    spiked = spikes(trace, top=top)
    pos = set(spiked.annotations["spikes"]["positions"])
    tags = annotated(trace).annotations["tags"]
    return [i in pos for i in range(len(trace))], [t if tag_colour(t) else "" for t in tags], spiked


def test_every_format_carries_spikes_tags_and_topk_strings(tmp_path, traces):
    trace = make_trace(text="First, let me plan. Check the sum. So the answer is 4.", seed=5)
    spike, tag, spiked = _expected(trace)
    assert any(spike) and any(tag)  # the fixture must exercise both columns
    kw = {"decode": fake_decode, "top": 0.1}
    line = json.loads(export(trace, tmp_path / "a.jsonl", **kw).read_text(encoding="utf-8"))
    assert line["spike"] == spike and line["tag"] == tag
    assert line["annotations"]["spikes"] == spiked.annotations["spikes"]
    assert line["annotations"]["spikes"]["rule"] == {"score": "cross_entropy", "top": 0.1, "per": "trace", "floor": 0.01}
    assert line["topk"]["base"]["tokens"][2] == [fake_decode(int(i)) for i in trace.topk["base"][0][2]]
    assert line["topk"]["base"]["ids"] == trace.topk["base"][0].tolist()  # JSONL keeps the ids too
    for fmt in ("csv", "parquet"):
        path = export(trace, tmp_path / f"a.{fmt}", **kw)
        frame = pd.read_csv(path, keep_default_na=False) if fmt == "csv" else pd.read_parquet(path)
        assert [bool(x) if fmt == "parquet" else x in (True, "True") for x in frame["spike"]] == spike, fmt
        assert list(frame["tag"]) == tag, fmt
        toks = frame["topk_reason_tokens"][3]
        toks = json.loads(toks) if fmt == "csv" else list(toks)
        assert toks == [fake_decode(int(i)) for i in trace.topk["reason"][0][3]], fmt
        probs = frame["topk_reason_probs"][3]
        probs = json.loads(probs) if fmt == "csv" else list(probs)
        np.testing.assert_allclose(probs, trace.topk["reason"][1][3], rtol=1e-6)
    page = export(trace, tmp_path / "a.html", **kw).read_text(encoding="utf-8")
    spans = re.findall(r'<span class="([^"]*)" data-pos="(\d+)"', page)
    assert sorted(int(p) for c, p in spans if "spike" in c.split()) == [i for i, s in enumerate(spike) if s]
    assert sorted(int(p) for c, p in spans if "tag" in c.split()) == [i for i, t in enumerate(tag) if t]
    assert "spike rule</td><td>top 10% by Cross-entropy per trace, score &gt; 0.01" in page
    assert "spike rule</td><td>none" not in page


def test_export_gate_rule_is_described(tmp_path):
    from core.annotate.spikes import Gate

    trace = make_trace(30, seed=8)
    page = export(trace, tmp_path / "g.html", gate=Gate(tau=0.5, lam=1.2, window=4)).read_text(encoding="utf-8")
    assert "calibrated gate on Cross-entropy: τ=0.5, λ=1.2, W=4" in page


def test_html_export_marks_notes_on_their_tokens(tmp_path):
    """Issue 22: notes visible where they belong, in the HTML export too (marker, text in the hover tip)."""
    from core.io.notes import add_note, attach_notes
    from core.io.store import TraceStore
    from core.views.exports import export

    store = TraceStore(tmp_path / "s")
    trace = make_trace(20, seed=8)
    store.put(trace)
    add_note(store, trace.key, 4, 5, "<b>why</b> here", n_tokens=len(trace))
    export(attach_notes(store, store.get(trace.key)), tmp_path / "t.html")  # as the CLI and the Export page do
    text = (tmp_path / "t.html").read_text(encoding="utf-8")
    assert re.findall(r'class="tok[^"]*\bnote\b[^"]*" data-pos="(\d+)"', text) == ["4", "5"]
    assert "<b>why</b>" not in text and "✎ note: &lt;b&gt;why&lt;/b&gt; here" in text
