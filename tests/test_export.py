"""core.export: lossless JSONL, long CSV/Parquet, self-contained and escaped HTML, foreign imports."""

from __future__ import annotations

import json
import re
import os
import shutil
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from core.metrics import METRICS
from core.errors import InvalidInputError, ModelLoadError
from core.io.exports import (
    FORMATS,
    export,
    forkpoint_version,
    read_jsonl,
    sidecar_path,
)
from core.io.imports import import_jsonl, read_foreign_jsonl
from core.io.store import TraceStore
from fakes import fake_decode, make_trace

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
        assert read == original
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
    assert read_jsonl(export(empty, tmp_path / "e.jsonl"))[0] == empty


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
        with pytest.raises(InvalidInputError, match="already exists; pass overwrite=True"):
            export(traces[:1], path)
        assert path.read_bytes() == before
        export(traces[:1], path, overwrite=True)
        assert path.read_bytes() != before
    # format given explicitly wins over the suffix
    export(traces, tmp_path / "data.txt", "jsonl")
    assert len(read_jsonl(tmp_path / "data.txt")) == 3
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp files left behind


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


@pytest.mark.browser
def test_html_tooltip_in_browser(tmp_path, traces):
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(chromium):
        pytest.skip("no chromium")
    path = export(traces, tmp_path / "t.html", decode=fake_decode)
    args = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"]  # fmt: skip
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=args)
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


# -- foreign import ------------------------------------------------------------------------------------


FOREIGN = [
    '{"id": "a", "prompt": "What is 2+2?", "response": "4", "answer": "4"}',
    "",
    '{"id": "b", "prompt": "Add 1 and 1.", "response": [5, 6, 7]}',
    "not json at all",
    '{"id": "c", "prompt": "", "response": "x"}',
    '{"id": "d", "prompt": "p", "response": ""}',
    '["a", "list"]',
    '{"id": "a", "prompt": "dup", "response": "r"}',
    '{"prompt": "no id", "response": "r"}',
    '{"id": 7, "prompt": "numeric id", "response": "r", "answer": 3, "source": "gsm8k"}',
    '{"id": "e", "prompt": "p", "response": [1, -2]}',
]


def write_foreign(path, extra: bytes = b""):
    path.write_bytes("\n".join(FOREIGN).encode("utf-8") + b"\n" + extra)
    return path


def test_read_foreign_jsonl_reports_bad_lines(tmp_path):
    records, errors = read_foreign_jsonl(write_foreign(tmp_path / "f.jsonl", b'{"id": "z", "prompt": "\xff"}\n'))
    assert [(r.line, r.id) for r in records] == [(1, "a"), (3, "b"), (10, "7")]
    assert records[1].response == [5, 6, 7] and records[0].answer == "4" and records[2].answer == "3"
    assert records[2].extra == {"source": "gsm8k"}
    assert [line for line, _ in errors] == [4, 5, 6, 7, 8, 9, 11, 12]
    reasons = dict(errors)
    assert "not valid JSON" in reasons[4] and "prompt" in reasons[5] and "response" in reasons[6]
    assert "JSON object" in reasons[7] and "duplicate id 'a' (first on line 1)" == reasons[8]
    assert "id" in reasons[9] and "token ids" in reasons[11] and "UTF-8" in reasons[12]
    with pytest.raises(InvalidInputError, match="No such file"):
        read_foreign_jsonl(tmp_path / "nope.jsonl")


def test_import_jsonl_with_fake_scorer(tmp_path):
    calls, progress = [], []

    def fake_score(pair, problem, response):  # core.scoring.score takes a problem dict as its prompt
        calls.append((pair, problem["prompt"], response, problem))
        if problem["id"] == "b":
            raise ModelLoadError("token id 7 is outside the vocabulary")
        return make_trace(text=response if isinstance(response, str) else "x y", seed=len(calls),
                          meta={"problem": problem, "kind": "score"})  # fmt: skip

    store = TraceStore(tmp_path / "store")
    result = import_jsonl("PAIR", write_foreign(tmp_path / "f.jsonl"), store, score_fn=fake_score,
                          progress=lambda done, total: progress.append((done, total)))  # fmt: skip
    assert [c[3]["id"] for c in calls] == ["a", "b", "7"] and calls[0][0] == "PAIR"
    assert calls[0][3] == {"id": "a", "prompt": "What is 2+2?", "gold": "4"}
    assert progress == [(1, 3), (2, 3), (3, 3)]
    assert len(result.keys) == 2 and all(k in store for k in result.keys)
    assert (3, "ModelLoadError: token id 7 is outside the vocabulary") in result.errors
    assert [line for line, _ in result.errors] == sorted(line for line, _ in result.errors)
    stored = store.get(result.keys[1])
    assert stored.meta["kind"] == "import" and stored.meta["import"]["line"] == 10
    assert stored.meta["problem"]["gold"] == "3"
