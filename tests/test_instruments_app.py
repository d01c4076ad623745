"""The instruments in the app (app/instruments_panels.py) through AppTest on the tiny pair: measuring
effects stores the continuations and draws the strip, the lens reads the selected token, the Dataset
page shows token statistics, measured effects and the per-trace histogram."""

from __future__ import annotations

from core.io.store import TraceStore
from tests.apptest import tiny_app

PROBLEMS = [{"id": "p1", "question": "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left?",
             "answer": "10"}]


def _ok(at) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def test_measure_effects_then_lens_then_dataset(tiny_dirs, tmp_path, monkeypatch) -> None:
    at = tiny_app(tiny_dirs, tmp_path, monkeypatch, PROBLEMS).run()
    _ok(at)
    key = at.session_state["trace_key"]
    at.number_input(key="fx_samples").set_value(2)
    at.radio(key="fx_where").set_value("selected token")
    at.session_state["sel_pos"] = 3
    at.button(key="fx_run").click().run()
    _ok(at)
    store = TraceStore(tmp_path / "store")
    kids = [store.get(k) for k in store.children(key)]
    assert len(kids) == 4 and {k.meta["branch"]["who"] for k in kids} == {"reason", "base"}
    assert all(k.meta["branch_pos"] == 3 for k in kids)
    assert len(at.get("plotly_chart")) >= 3  # the trace's own plot, the effect strip, the lens
    assert any("Newcombe" in str(c.value) for c in at.caption)
    assert any(c.label == "Open a continuation" for c in at.selectbox)
    # the lens of the selected token: layers x {base, reasoner}
    assert any("logit lens" in str(c.value) for c in at.caption)
    # the Dataset page: token statistics, the measured effect, the histogram
    at.switch_page("screens/dataset.py").run()
    _ok(at)
    assert any("over 1 measured positions" in str(c.value) for c in at.caption)
    assert any("Click a bar" in str(c.value) for c in at.caption)
