"""The instruments in the app (app/instruments_panels.py) through AppTest on the tiny pair: measuring
effects stores the continuations and marks the measured token in the token view, the lens reads the selected token, the Dataset
page shows token statistics, measured effects and the per-trace histogram."""

from __future__ import annotations

import re

from app.state import INSTRUMENTS_TAB_KEY
from core.instruments.effects import stored_effects
from core.io.store import TraceStore
from core.views.colours import effect_colour
from tests.apptest import first_trace, tiny_app

PROBLEMS = [{"id": "p1", "question": "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left?",
             "answer": "10"}]


def _ok(at) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _views(monkeypatch) -> list[dict]:
    """Every payload the token view component is mounted with (AppTest cannot see inside a component)."""
    import app.components.token_view as component

    seen: list[dict] = []
    monkeypatch.setattr(component, "_component", lambda: lambda **kw: seen.append(kw["data"]))
    return seen


def test_measure_effects_then_lens_then_dataset(tiny_dirs, tmp_path, monkeypatch) -> None:
    views = _views(monkeypatch)
    at = first_trace(tiny_app(tiny_dirs, tmp_path, monkeypatch, PROBLEMS))
    _ok(at)
    assert views and "--fx:" not in views[-1]["html"] and not views[-1]["hover"]["effects"]  # nothing measured yet
    key = at.session_state["trace_key"]
    # the instruments are lazy: closed, their expander runs nothing (no lens forward pass on every run)
    assert not any("logit lens" in str(c.value) for c in at.caption) and len(at.get("plotly_chart")) == 1
    at.session_state["instruments_open"] = True
    at.run()
    _ok(at)
    at.number_input(key="fx_samples").set_value(2)
    at.radio(key="fx_where").set_value("selected token")
    at.session_state["sel_pos"] = 3
    at.button(key="fx_run").click().run()
    _ok(at)
    store = TraceStore(tmp_path / "store")
    kids = [store.get(k) for k in store.children(key)]
    assert len(kids) == 4 and {k.meta["branch"]["who"] for k in kids} == {"reason", "base"}
    assert all(k.meta["branch_pos"] == 3 for k in kids)
    # the measured token carries the marker in the token view (the run after the click redraws it)
    effect = float(stored_effects(store, store.get(key)).set_index("pos").loc[3, "effect"])
    view = views[-1]
    marked = re.findall(r'<span class="tok[^"]*\bfx\b[^"]*" data-pos="(\d+)" style="[^"]*--fx:(#[0-9a-f]{6})[^"]*"'
                        r'[^>]*data-fx="([^"]+)"', view["html"])
    assert [(int(p), c) for p, c, _ in marked] == [(3, effect_colour(effect))]
    assert float(marked[0][2]) == effect and list(view["hover"]["effects"]) == ["3"]
    assert view["hover"]["effects"]["3"]["n"] == 2
    assert any("Newcombe" in str(c.value) and "ρ with" in str(c.value) and "none yet (it needs 3 or more" in
               str(c.value) for c in at.caption)  # one position measured: no ρ, said so (never "nan")
    assert any(c.label == "Open a continuation" for c in at.selectbox)
    # the lens of the selected token (its tab opened): layers x {base, reasoner}
    assert not any("logit lens" in str(c.value) for c in at.caption)  # a closed tab runs nothing either
    at.session_state["instruments_tab"] = "Lens"
    at.run()
    _ok(at)
    assert any("logit lens" in str(c.value) for c in at.caption)
    assert len(at.get("plotly_chart")) >= 2  # the trace's own plot, the lens
    # the Dataset page: token statistics, the measured effect, the histogram; the effects of all the selected
    # traces come from one listing of the store (a children() call lists it: 38 ms each at 5,600 traces)
    listed = []
    monkeypatch.setattr(TraceStore, "children", lambda self, key: listed.append(key) or [])
    at.switch_page("screens/dataset.py").run()
    _ok(at)
    shown = at.dataframe(key="ts_table").value  # the first instruments tab: token statistics, tokens quoted
    assert len(shown) and all(t[0] == t[-1] and t[0] in "'\"" for t in shown["token"])
    assert shown["mean_effect"].notna().any()  # an effect is measured here, so its column is shown
    assert not any("measured positions" in str(c.value) for c in at.caption)  # lazy: a closed tab runs nothing
    at.session_state[INSTRUMENTS_TAB_KEY] = "Effect vs disagreement"
    at.run()
    _ok(at)
    assert any("ρ = none yet" in str(c.value) and "over 1 measured positions" in str(c.value) for c in at.caption)
    at.session_state[INSTRUMENTS_TAB_KEY] = "Per-trace histogram"
    at.run()
    _ok(at)
    assert any("Click a bar to filter the Problems table" in str(c.value) for c in at.caption)
    assert listed == []


def test_a_histogram_bar_filters_the_problems_table_to_its_traces(tiny_dirs, tmp_path, monkeypatch) -> None:
    """LMdiff's triage: a click on a bar of the Dataset page's per-trace histogram (its plotly selection, as
    the page reads it) opens the Problems page with the table filtered to exactly that bar's traces, under a
    chip that says what filters it and removes the filter."""
    from types import SimpleNamespace

    import numpy as np
    import streamlit

    problems = [{"id": f"p{i}", "question": f"What is {i} + {i + 3}?", "answer": str(2 * i + 3)} for i in range(5)]
    import core

    pair = core.load_pair(str(tiny_dirs["qwen_base"]), str(tiny_dirs["qwen_reason"]), device="cpu", dtype="float32")
    core.generate(pair, problems, max_new_tokens=12, store=TraceStore(tmp_path / "store"))  # the app stores none unasked
    at = tiny_app(tiny_dirs, tmp_path, monkeypatch, problems).run()
    _ok(at)
    store = TraceStore(tmp_path / "store")
    summaries = store.summaries()
    assert len(summaries) == 5
    values = summaries["max_score"].to_numpy(dtype=float)
    counts, edges = np.histogram(values, bins=min(20, len(np.unique(values))))
    bar = int(np.flatnonzero(counts)[0])  # the first bar that holds traces
    high = values <= edges[bar + 1] if bar == len(counts) - 1 else values < edges[bar + 1]
    want = sorted(summaries["key"][(values >= edges[bar]) & high].astype(str))
    assert 0 < len(want) < 5
    plotly_chart = streamlit.plotly_chart

    def clicked(fig, *args, **kwargs):
        out = plotly_chart(fig, *args, **kwargs)
        if kwargs.get("key") == "hist_fig":
            return SimpleNamespace(selection=SimpleNamespace(points=[{"point_index": bar, "x": 0.0, "y": 1}]))
        return out

    at.switch_page("screens/dataset.py")
    at.session_state[INSTRUMENTS_TAB_KEY] = "Per-trace histogram"  # a lazy tab: only the open one runs
    at.run()
    _ok(at)
    at.selectbox(key="hist_stat").set_value("max_score")
    monkeypatch.setattr(streamlit, "plotly_chart", clicked)
    at.run()
    _ok(at)
    monkeypatch.setattr(streamlit, "plotly_chart", plotly_chart)
    assert at.title[0].value == "Problems"  # taken to the Problems page
    table = at.dataframe(key="problems_traces").value
    assert sorted(table["key"].astype(str)) == want  # exactly the bar's traces
    chip = at.button(key="pf_subset_clear")
    label = f"max score in [{edges[bar]:.3g}, {edges[bar + 1]:.3g}{']' if bar == len(counts) - 1 else ')'}"
    assert chip.label.replace("\\", "") == f"{label}: {len(want)} traces  ✕"
    assert any(f"{len(want)} of 5 readable traces" in str(c.value) for c in at.caption)
    at.switch_page("screens/problems.py")  # where the browser now is (AppTest reruns the page it was given)
    at.run()
    assert sorted(at.dataframe(key="problems_traces").value["key"].astype(str)) == want  # the filter stays
    at.button(key="pf_subset_clear").click().run()  # removing the chip shows every trace again
    _ok(at)
    assert len(at.dataframe(key="problems_traces").value) == 5
    assert all(b.key != "pf_subset_clear" for b in at.button)


def test_a_rho_is_two_decimals_or_says_why_there_is_none() -> None:
    from app.instruments_panels import rho_text
    from core.instruments.intervals import spearman

    assert rho_text(spearman([1, 2, 3, 4], [1, 3, 2, 4])) == "0.80"
    for few in ([1, 2], [1, 2]), ([1, 2, 3], [5, 5, 5]):  # fewer than 3 pairs; one side constant
        assert rho_text(spearman(*few)).startswith("none yet")
