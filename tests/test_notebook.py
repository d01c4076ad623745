"""The notebook view: `Trace._repr_html_`, the anywidget widget (Python model, and its ESM in real Chromium on a
static page with a fake model bridged to the Python widget), and docs/example.ipynb run by a kernel."""

from __future__ import annotations

import functools
import html
import http.server
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import core
from core.errors import InvalidInputError
from tests.browser import chromium_page, require_chromium

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is 2+3?"
RESPONSE = "2+3 = 5. Wait, 5. The answer is 5."
SYNCED = ("score", "scores", "views", "selected", "selection_label", "choices", "tree", "notes", "can_note", "status")

notebook = pytest.importorskip("core.notebook.widget")  # the `notebook` extra (anywidget)


@pytest.fixture(scope="module")
def trace(qwen_pair):
    return core.score(qwen_pair, PROMPT, RESPONSE)


def _widget(qwen_pair, trace, **kw):
    return core.widget(qwen_pair, trace, max_new_tokens=len(trace) + 6, **kw)


# -- one renderer ------------------------------------------------------------------------------------


def test_import_core_does_not_load_the_widget_stack():
    code = "import json, sys, core; print(json.dumps(sorted(m for m in ('anywidget', 'ipywidgets') if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    assert core.widget is notebook.widget  # lazily exported


def test_the_esm_is_the_apps_token_view_plus_the_controls():
    view_js = (ROOT / "core" / "views" / "token_view.js").read_text(encoding="utf-8")
    esm = notebook.esm()
    body = re.sub(r"^export\s+default\s+function\s*\w*\s*\(", "function fpTokenView(", view_js, count=1, flags=re.MULTILINE)
    assert esm.startswith(body)  # the app's renderer, verbatim but for the renamed default export
    assert esm.count("export default") == 1 and "function fpTokenView(" in esm
    assert (ROOT / "core" / "views" / "token_view.css").read_text(encoding="utf-8") in notebook.css()


def test_repr_html_is_the_export_page(trace):
    out = trace._repr_html_()
    assert out.startswith("<iframe") and 'srcdoc="' in out
    page = html.unescape(re.search(r'srcdoc="([^"]*)"', out).group(1))
    assert page.startswith("<!DOCTYPE html>") and 'id="fp-tip"' in page  # the export's page with its hover script
    assert page.count('class="tok') >= len(trace) and f'data-pos="{len(trace) - 1}"' in page
    assert "http://" not in page and "https://" not in page and "<link" not in page  # offline
    from core.views.display import page_html

    again = page_html(trace)
    strip = functools.partial(re.sub, r"exported [^·]*·", "")
    assert strip(again) == strip(page)


def test_repr_html_escapes_model_text():
    from tests.fakes import make_trace

    evil = make_trace(text='x <script>alert(1)</script> "q" & y', seed=2)
    out = evil._repr_html_()
    assert "<script>alert" not in out  # inside the srcdoc attribute everything is escaped
    page = html.unescape(re.search(r'srcdoc="([^"]*)"', out).group(1))
    assert "<script>alert" not in page and "&lt;script&gt;" in page


# -- the Python model: state in, branches out ---------------------------------------------------------


def test_widget_model_state_in_branches_out(qwen_pair, trace):
    w = _widget(qwen_pair, trace)
    from core.scoring.registry import SCORES

    assert [s for s, _ in w.scores] == [*SCORES, "rank_shift"]
    assert len(w.views) == 1 and w.views[0]["data"]["html"].count("data-pos=") == len(trace)
    assert w.views[0]["data"]["hover"]["tokens"] == trace.tokens
    assert w.selection is None and w.choices == [] and w.tree[0]["key"] == trace.key
    # metric selector
    from core.scoring.registry import METRICS

    w.score = "jsd"
    assert w.views[0]["data"]["hover"]["score_name"] == METRICS["jsd"].label
    np.testing.assert_allclose(w.views[0]["data"]["hover"]["score"], np.round(trace.metrics["jsd"], 3), atol=1e-3)
    w.score = "rank_shift"  # the categorical colouring mode
    from core.annotate import rank_shift

    body = w.views[0]["data"]["html"]
    assert [m for m in re.findall(r"background:([^;\"]+)", body)] == rank_shift.colours(trace)
    w.score = "jsd"
    w.score = "nope"
    assert w.score == "jsd" and "unknown score" in w.status
    # a click
    w.selected = {"view": 0, "pos": 4}
    sel = w.selection
    assert (sel.pos, sel.token_id, sel.token, sel.trace) == (4, int(trace.token_ids[4]), trace.tokens[4], trace)
    assert w.choices[0][1] is None and len(w.choices) > 2
    forced = w.choices[2][1]
    # "take over" from the front end: a request with the chosen entry
    w.request = {"action": "take_over", "view": 0, "pos": 4, "choice": 0, "n": 1}
    assert len(w.branches) == 1
    child = w.branches[0]
    ref = core.branch(qwen_pair, trace, 4, max_new_tokens=len(trace) + 6)
    assert child.key == ref.key and np.array_equal(child.token_ids, ref.token_ids)
    assert child.meta["parent"] == trace.key and child.meta["branch_pos"] == 4 and child.source[4] == "reason"
    assert [v["key"] for v in w.views] == [trace.key, child.key]  # the branch beside the original
    # a forced token, chosen on the branch itself: the tree grows a level
    w.selected = {"view": 1, "pos": 6}
    token = w.choices[2][1]
    w.request = {"action": "take_over", "view": 1, "pos": 6, "choice": 2, "n": 2}
    grandchild = w.branches[1]
    assert grandchild.meta["parent"] == child.key and int(grandchild.token_ids[6]) == token
    assert grandchild.source[6] == "forced"
    assert [(r["depth"], r["key"]) for r in w.tree] == [(0, trace.key), (1, child.key), (2, grandchild.key)]
    assert [r["shown"] for r in w.tree] == [False, False, True]
    # show another branch, and back
    w.request = {"action": "show", "key": child.key, "n": 3}
    assert [v["key"] for v in w.views] == [trace.key, child.key]
    w.show(trace.key)
    assert len(w.views) == 1
    # the Python API does the same
    direct = w.take_over(2, token=forced)
    assert direct.token_ids[2] == forced and direct in w.branches
    # errors become a status, never an exception in the comm handler
    w.request = {"action": "take_over", "view": 0, "pos": 10_000, "choice": 0, "n": 4}
    assert w.status.startswith("error:") and len(w.branches) == 3
    w.request = {"action": "fly", "n": 5}
    assert "choose one of" in w.status
    with pytest.raises(InvalidInputError, match="No trace"):
        w.trace("0" * 32)


def test_widget_flips_takeovers_and_forces_alternatives(qwen_pair, trace):
    """The switchboard in the notebook: a "flip" request switches the clicked token's takeover (the same
    child as core.takeover), streamed into the status line; flipping it back shows the original alone;
    a "force" request (a top-k alternative in the hover card) forces that token."""
    w = _widget(qwen_pair, trace)
    statuses = []
    w.observe(lambda change: statuses.append(change["new"]), names="status")
    w.request = {"action": "flip", "view": 0, "pos": 3, "n": 1}
    child = w.branches[-1]
    ref = core.takeover(qwen_pair, trace, {3: "reason"}, max_new_tokens=len(trace) + 6)
    assert child.key == ref.key and np.array_equal(child.token_ids, ref.token_ids) and child.source[3] == "reason"
    assert [v["key"] for v in w.views] == [trace.key, child.key]
    assert any(s.startswith("#3: ") for s in statuses), "the new tokens never streamed into the status"
    assert "#3 reasoner" in w.status and "takeover" in w.status
    w.request = {"action": "flip", "view": 1, "pos": 3, "n": 2}  # switched off again: back to the original
    assert len(w.views) == 1 and w.views[0]["key"] == trace.key
    alt = int(trace.topk["base"][0][5][1])
    w.request = {"action": "force", "view": 0, "pos": 5, "token": alt, "n": 3}
    forced = w.branches[-1]
    assert int(forced.token_ids[5]) == alt and forced.source[5] == "forced"


def test_widget_edits_and_continues_with_typed_text(qwen_pair, trace):
    """An "edit" request types text at a token: the typed tokens are forced (no takeover), the policy writes on,
    and the child is core.takeover's with that text."""
    w = _widget(qwen_pair, trace)
    w.request = {"action": "edit", "view": 0, "pos": 2, "text": " so then", "n": 1}
    child = w.branches[-1]
    ids = qwen_pair.encode(" so then")
    ref = core.takeover(qwen_pair, trace, {2: " so then"}, max_new_tokens=len(trace) + 6)
    assert child.key == ref.key and child.token_ids[2:2 + len(ids)].tolist() == ids
    assert set(child.source[2:2 + len(ids)]) == {"forced"} and child.n_takeovers == int(np.sum(child.source == "reason"))
    assert "forced" in w.status and [v["key"] for v in w.views] == [trace.key, child.key]
    w.request = {"action": "edit", "view": 0, "pos": 2, "text": "", "n": 2}
    assert w.status.startswith("error:") and "non-empty" in w.status


def test_widget_notes_and_store(qwen_pair, trace, tmp_path):
    from core.io.notes import read_notes

    store = core.TraceStore(tmp_path / "store")
    w = _widget(qwen_pair, trace, store=store)
    assert w.can_note
    w.selected = {"view": 0, "pos": 3}
    w.request = {"action": "note", "view": 0, "pos": 3, "text": "look here", "n": 1}
    assert w.status == "note saved"
    assert [(n.start, n.text) for n in read_notes(store, trace.key)] == [(3, "look here")]
    assert w.notes[0]["text"] == "look here" and w.notes[0]["view"] == 0
    marked = re.findall(r'class="tok[^"]*\bnote\b[^"]*" data-pos="(\d+)"', w.views[0]["data"]["html"])
    assert marked == ["3"] and w.views[0]["data"]["hover"]["notes"][3] == "look here"  # marked, text on hover
    child = w.take_over(3)
    assert child.key in store  # branches are stored
    w.request = {"action": "note", "view": 0, "pos": 3, "text": "   ", "n": 2}
    assert w.status.startswith("error:") and "needs text" in w.status
    # a branch of a problem with a gold answer is graded before it is stored, as in the app
    golden = core.score(qwen_pair, {"prompt": PROMPT, "gold": "5"}, RESPONSE)
    graded = _widget(qwen_pair, golden, store=store).take_over(4)
    assert store.get(graded.key).meta["correct"] in (True, False)
    # a malformed request from the front end is a status line, not an exception in the kernel
    w.request = {"action": "take_over", "pos": "x", "view": 0, "n": 3}
    assert w.status.startswith("error: bad widget request")
    no_store = _widget(qwen_pair, trace)
    assert not no_store.can_note
    with pytest.raises(InvalidInputError, match="store"):
        no_store.add_note(1, "x")


# -- the front end in real Chromium ---------------------------------------------------------------------

_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><link rel="stylesheet" href="widget.css"></head>
<body><div id="root"></div><script type="module">
import widget from "./widget.js";
const state = await (await fetch("state.json")).json();
const listeners = {}, pending = {};
window.__sent = [];
const model = {
  get: (k) => state[k],
  set: (k, v) => { state[k] = v; pending[k] = v; },
  on: (ev, fn) => { (listeners[ev] = listeners[ev] || []).push(fn); },
  off: (ev, fn) => { listeners[ev] = (listeners[ev] || []).filter((f) => f !== fn); },
  save_changes: async () => {
    const changes = { ...pending };
    for (const k of Object.keys(pending)) delete pending[k];
    window.__sent.push(changes);
    const next = JSON.parse(await window.pySync(JSON.stringify(changes)));
    for (const [k, v] of Object.entries(next)) {
      if (JSON.stringify(state[k]) !== JSON.stringify(v)) {
        state[k] = v;
        (listeners["change:" + k] || []).forEach((f) => f());
      }
    }
  },
};
widget.render({ model, el: document.getElementById("root") });
window.__ready = true;
</script></body></html>"""


def _state(w) -> str:
    return json.dumps({k: getattr(w, k) for k in SYNCED})


@pytest.fixture()
def served(tmp_path):
    """A static folder over HTTP (ES modules need a real origin)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.browser
def test_widget_front_end_in_chromium(qwen_pair, trace, served, tmp_path_factory):
    require_chromium()
    folder, url = served
    store = core.TraceStore(tmp_path_factory.mktemp("widget_store"))
    w = _widget(qwen_pair, trace, store=store)
    (folder / "widget.js").write_text(w._esm, encoding="utf-8")
    (folder / "widget.css").write_text(w._css, encoding="utf-8")
    (folder / "state.json").write_text(_state(w), encoding="utf-8")
    (folder / "index.html").write_text(_PAGE, encoding="utf-8")

    def py_sync(changes: str) -> str:  # the kernel side: apply the front end's changes, answer with the state
        for key, value in json.loads(changes).items():
            setattr(w, key, value)
        return _state(w)

    errors: list[str] = []
    profile = tmp_path_factory.mktemp("chromium_profile")
    with chromium_page(profile, viewport={"width": 1400, "height": 1000}, timeout_ms=30_000) as page:
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.expose_function("pySync", py_sync)
        page.goto(f"{url}/index.html")
        page.wait_for_function("window.__ready === true")
        toks = page.locator(".fp-w-view .tok[data-pos]")
        assert toks.count() == len(trace)
        # hover: the app's card with both top-k lists
        toks.nth(3).hover()
        card = page.locator(".fp-card")
        card.wait_for(state="visible")
        assert "#3" in card.locator(".fp-card-title").inner_text()
        assert card.locator("table.fp-top").count() == 2
        # metric selector -> Python rebuilds the view -> the card shows the new metric
        page.select_option(".fp-w-score", "jsd")
        page.wait_for_function("document.querySelector('.fp-w-score').value === 'jsd' && window.__sent.length >= 1")
        assert w.score == "jsd"
        page.mouse.move(0, 0)
        toks.nth(2).hover()
        from core.scoring.registry import METRICS

        page.wait_for_function(f"document.querySelector('.fp-card-score').textContent.startsWith({json.dumps(METRICS['jsd'].label)})")
        # click a token: selection in Python, choices in the page
        toks.nth(5).click()
        page.locator('.fp-w-view .tok.sel[data-pos="5"]').wait_for()
        assert w.selection is not None and w.selection.pos == 5
        page.locator(".fp-w-choice option").nth(len(w.choices) - 1).wait_for(state="attached")
        assert page.locator(".fp-w-choice option").count() == len(w.choices)
        forced = w.choices[2][1]
        # force a token and branch: core.branch runs in Python; the branch shows beside the original
        page.select_option(".fp-w-choice", "2")
        page.click(".fp-w-branch")
        page.locator(".fp-w-view").nth(1).wait_for()
        assert len(w.branches) == 1 and int(w.branches[0].token_ids[5]) == forced
        assert page.locator(".fp-w-view").nth(1).get_attribute("data-key") == w.branches[0].key
        assert page.locator(".fp-w-view").nth(1).locator(".tok[data-pos]").count() == len(w.branches[0])
        assert page.locator(".fp-w-node").count() == 2
        assert "forced" in page.locator(".fp-w-node.shown").inner_text()
        # a note on a token of the branch: saved in the store, listed under the views
        page.locator(".fp-w-view").nth(1).locator('.tok[data-pos="2"]').click()
        page.fill(".fp-w-note", "the branch <i>starts</i> to differ")
        page.click(".fp-w-addnote")
        page.locator(".fp-w-noterow").wait_for()
        assert "the branch <i>starts</i> to differ" in page.locator(".fp-w-noterow").inner_text()
        assert page.locator(".fp-w-notes i").count() == 0  # shown as text, never as HTML
        from core.io.notes import read_notes

        assert [n.text for n in read_notes(store, w.branches[0].key)] == ["the branch <i>starts</i> to differ"]
        (ROOT / "test-output" / "browser").mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ROOT / "test-output" / "browser" / "notebook_widget.png"), full_page=True)
        # the tree: back to the original alone
        page.locator(".fp-w-node").first.click()
        page.wait_for_function("document.querySelectorAll('.fp-w-view').length === 1")
        assert "showing the original" in page.locator(".fp-w-status").inner_text()
    assert not errors, errors


# -- the example notebook, run by a kernel ---------------------------------------------------------------


@pytest.mark.slow
def test_example_notebook_runs_top_to_bottom():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "docs" / "example.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    kinds = [set(o.get("data", {})) for o in outputs]
    assert any("text/html" in k and "forkpoint-trace" in o["data"]["text/html"] for k, o in zip(kinds, outputs))
    assert any("application/vnd.jupyter.widget-view+json" in k for k in kinds)
    text = "".join(o.get("text", "") for o in outputs)
    assert "branches;" in text and "shifted ratio:" in text
