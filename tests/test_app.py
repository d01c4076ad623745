"""Page logic through `streamlit.testing.v1.AppTest`: first view, selection, takeover, URL state, pages,
and core errors shown as messages (never tracebacks). Runs the real app on a tiny in-process pair."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import resources
from app.downloads import export_file_bytes
from app.selection_panel import BRANCH_TOOLS
from app.state import CHARTS_KEY, DATASET_TAB_KEY
from core.io.store import TraceStore
from core.views.exports import annotated, read_jsonl
from tests.apptest import start_app, tiny_argv, write_problems

ROOT = Path(__file__).resolve().parents[1]

PROBLEMS = [
    {"id": "p1", "question": "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left?", "answer": "10"},
    {"id": "p2", "question": "What is 5 + 7?", "answer": "12"},
]


@pytest.fixture()
def env(tmp_path, tiny_dirs, monkeypatch):
    """App arguments for a tiny pair, a fresh store and a two-problem file (sys.argv is what the app parses)."""
    problems = write_problems(tmp_path / "problems.jsonl", PROBLEMS)
    store = tmp_path / "store"
    argv = tiny_argv(tiny_dirs, store, problems)

    def start(*extra: str, args: list[str] | None = None) -> AppTest:
        return start_app(monkeypatch, [*(argv if args is None else args), *extra])

    def open_first(*extra: str) -> AppTest:
        """The app's first view on the empty store, then its one action: Generate (the first problem's trace)."""
        at = start(*extra).run()
        at.button(key="first_generate").click().run()
        return at

    return type("Env", (), {"start": staticmethod(start), "open": staticmethod(open_first), "store": store,
                            "problems": problems, "argv": argv})


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _texts(elements) -> list[str]:
    """The elements' texts as a reader sees them: Markdown backslash escapes (app.view.md_escape) removed."""
    return [re.sub(r"\\([^\w\s])", r"\1", str(e.value)) for e in elements]


def _second_trace(env) -> str:
    """The second problem's trace, made as a user would: a link to the problem, then Generate."""
    at = _opened(env, problem="p2")
    at.button(key="first_generate").click().run()
    return at.session_state["trace_key"]


def _opened(env, /, **query: str) -> AppTest:
    """The app run once with these URL query parameters."""
    at = env.start()
    for name, value in query.items():
        at.query_params[name] = value
    return at.run()


def test_first_view_writes_nothing_and_generate_opens_a_trace(env):
    """Issue 31: the first view on an empty store generates nothing unasked: the problem list and one action;
    Generate makes the chosen problem's trace and opens it; a new session opens the store's most recent trace."""
    at = env.start().run()
    _ok(at)
    assert at.session_state["trace_key"] is None and not TraceStore(env.store).keys()
    assert any("No trace yet" in t for t in _texts(at.markdown))
    assert at.selectbox(key="first_problem").options[0].startswith("p1: ")
    at.selectbox(key="first_problem").set_value(1).run()  # the second problem
    at.button(key="first_generate").click().run()
    _ok(at)
    store = TraceStore(env.store)
    key = at.session_state["trace_key"]
    assert store.keys() == [key]  # one trace: the one asked for
    trace = store.get(key)
    assert trace.meta["problem"]["id"] == "p2" and trace.meta["problem"]["gold"] == "12"
    assert trace.meta["correct"] is not None  # graded against the gold answer
    assert any("Problem `p2`" in t for t in _texts(at.markdown))
    assert {m.label: m.value for m in at.metric}["Tokens"] == str(len(trace))
    assert at.query_params["trace"] == key and at.query_params["problem"] == "p2"
    assert _texts(at.info) and "Click a token" in _texts(at.info)[0]
    again = env.start().run()  # a new session: the store's most recent trace, nothing generated
    _ok(again)
    assert again.session_state["trace_key"] == key and TraceStore(env.store).keys() == [key]


def test_a_new_session_sends_its_charts_once_its_token_view_has_drawn(env, monkeypatch):
    """Until the session's token view says it is on screen (a browser's view does, tests/test_browser.py), the
    Trace page sends no Plotly chart and asks the view to say so; after it, the score plot (the graph needs a
    tree of two traces)."""
    at = start_app(monkeypatch, env.argv, drawn=False).run()
    at.button(key="first_generate").click().run()
    _ok(at)
    view = next(c for c in at.get("bidi_component") if c.proto.component_name == "forkpoint_token_view")
    assert json.loads(view.proto.json)["charts_waiting"] is True and len(at.get("plotly_chart")) == 0
    at.session_state[CHARTS_KEY] = True  # what the view's {"drawn": true} sets (app/switchboard.on_click)
    at.run()
    _ok(at)
    view = next(c for c in at.get("bidi_component") if c.proto.component_name == "forkpoint_token_view")
    assert json.loads(view.proto.json)["charts_waiting"] is False
    assert [c.proto.id.endswith("score_plot") for c in at.get("plotly_chart")] == [True]


def _branch_from(at: AppTest, pos: int) -> None:
    """Select token `pos` with the selection panel's branch tools open (flip mode draws them when asked)."""
    at.session_state["sel_pos"] = pos
    at.session_state[BRANCH_TOOLS] = True
    at.run()


def test_select_token_take_over_and_see_the_branch(env):
    at = env.open()
    parent = at.session_state["trace_key"]
    _branch_from(at, 2)
    _ok(at)
    assert any("Token #2" in t for t in _texts(at.markdown))
    assert at.query_params["pos"] == "2"
    at.button(key="takeover_reason").click().run()
    _ok(at)
    job = at.session_state["compare"]
    assert job["parent"] == parent and job["pos"] == 2 and at.session_state["pending"] is None
    store = TraceStore(env.store)
    assert store.children(parent) == [job["child"]]
    child = store.get(job["child"])
    assert child.meta["branch_pos"] == 2 and child.source[2] == "reason"
    assert list(child.token_ids[:2]) == list(store.get(parent).token_ids[:2])
    assert any("Branch stored" in t for t in _texts(at.success))
    assert any("Branch at token #2" in t for t in _texts(at.markdown))
    at.button(key="open_branch").click().run()
    _ok(at)
    assert at.session_state["trace_key"] == job["child"]
    # the branch tree is a graph: both traces are nodes, the open one ringed, the edge names the switch
    import json as _json

    figs = [_json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    fig = next(f for f in figs if any(d.get("name") in ("correct", "wrong", "ungraded") for d in f["data"]))
    nodes = [k for d in fig["data"] if d.get("customdata") for k in d["customdata"]]
    assert sorted(nodes) == sorted([parent, job["child"]])
    edge_text = [t for d in fig["data"] if d.get("mode") == "text" for t in d.get("hovertext", [])]
    assert any(t.startswith("⇄ #2 reasoner '") for t in edge_text), edge_text
    ringed = [k for d in fig["data"] if d.get("customdata")
              for k, w in zip(d["customdata"], d["marker"]["line"]["width"]) if w == 4]
    assert ringed == [job["child"]]
    side = at.multiselect(key=f"cmp_pick_{job['child']}")
    assert side.options and "⇄ #2 reasoner" not in side.options[0]  # the root: no switch


def test_force_a_token_from_the_top_k(env):
    at = env.open()
    parent = TraceStore(env.store).get(at.session_state["trace_key"])
    _branch_from(at, 3)
    pick = next(s for s in at.selectbox if s.key and s.key.startswith("takeover_pick_"))
    assert "(emitted)" not in pick.options[pick.index]  # offered first: a token that changes the text
    pick.set_value(pick.options.index(pick.options[-1]) + 1).run()  # the last alternative (options are labels)
    at.button(key="takeover_token").click().run()
    _ok(at)
    child = TraceStore(env.store).get(at.session_state["compare"]["child"])
    assert child.source[3] == "forced"
    offered = set(parent.topk["base"][0][3].tolist()) | set(parent.topk["reason"][0][3].tolist())
    assert int(child.token_ids[3]) in offered


def test_a_copied_link_opens_the_same_view(env):
    first = env.open()
    key = first.session_state["trace_key"]
    at = _opened(env, trace=key, pos="4")
    _ok(at)
    assert at.session_state["trace_key"] == key and at.session_state["sel_pos"] == 4
    assert any("Token #4" in t for t in _texts(at.markdown))


def test_unknown_trace_in_the_url_is_a_warning(env):
    at = _opened(env, trace="deadbeef")
    assert not at.exception
    assert any("not in the store" in t for t in _texts(at.warning))
    assert any("No trace yet" in t for t in _texts(at.markdown))  # an empty store
    made = _second_trace(env)
    at = _opened(env, trace="deadbeef")  # a store with traces: not "no trace yet", and the latest is one click away
    assert not any("No trace yet" in t for t in _texts(at.markdown))
    assert any("No trace open" in t for t in _texts(at.markdown))
    at.button(key="first_recent").click().run()
    _ok(at)
    assert at.session_state["trace_key"] == made


def test_bad_model_path_is_an_error_message(env, tmp_path):
    args = ["--base", str(tmp_path / "nope"), "--reason", str(tmp_path / "nope2"), "--store", str(env.store),
            "--problems", str(env.problems)]
    at = env.start(args=args).run()
    assert not at.exception
    errors = " ".join(_texts(at.error))
    assert "Could not load the model pair" in errors and "does not exist" in errors


def test_unknown_app_argument_is_reported(env):
    at = env.start("--bogus").run()
    assert not at.exception
    assert any("Unknown app arguments: --bogus" in t for t in _texts(at.error))


def test_missing_problem_file_is_an_error_message(env, tmp_path):
    args = [a if a != str(env.problems) else str(tmp_path / "missing.jsonl") for a in env.argv]
    at = env.start(args=args).run()
    assert not at.exception
    assert any("does not exist" in t for t in _texts(at.error))


def test_problems_page_lists_traces_and_problems(env):
    at = env.open()
    at.switch_page("screens/problems.py").run()
    _ok(at)
    traces, problems = at.dataframe[0].value, at.dataframe[1].value
    assert len(traces) == 1 and at.session_state["trace_key"] in set(traces["key"])
    assert list(problems["id"]) == ["p1", "p2"] and list(problems["traces"]) == [1, 0]
    assert list(problems["share correct"])[0] == "0.00"  # text: an ungraded problem shows "–", never None
    at.text_input(key="pf_text").input("no such problem").run()
    assert len(at.dataframe[0].value) == 0


def test_search_opens_a_hit_at_its_token_and_filters_the_traces_table(env):
    """Problems → Search: every match with its score and spike; the filter keeps the traces where it spikes
    (choosing a row opens the trace at the token: tests/test_journeys.py clicks it in a browser)."""
    at = env.open()
    store = TraceStore(env.store)
    first = store.get(at.session_state["trace_key"])
    needle = next(t for t in first.tokens if t.strip().isalpha()) or first.tokens[0]
    at.switch_page("screens/problems.py").run()
    at.text_input(key="search_pattern").input(needle).run()
    _ok(at)
    from app.view import SpikeRule, annotate_view
    from core.analysis.search import search_traces

    expect = search_traces([annotate_view(store.get(k), "cross_entropy", SpikeRule()) for k in store.keys()], needle)
    table = next(d.value for d in at.dataframe if "match" in d.value.columns)
    assert len(table) == len(expect) and list(table["pos"]) == list(expect["pos"])
    spiking = list(dict.fromkeys(expect.loc[expect["spike"], "key"]))
    if spiking:
        at.button(key="search_filter_btn").click().run()
        _ok(at)
        assert set(at.dataframe[0].value["key"]) == set(spiking)
        at.button(key="search_filter_clear").click().run()
        assert len(at.dataframe[0].value) == len(store.keys())
    assert any(f"of `{needle!r}`" in str(c.value) for c in at.caption)  # quoted: a leading space shows
    at.text_input(key="search_pattern").input("zzzq no such text").run()  # no match: said, no row hint, no button
    _ok(at)
    assert any("No match of" in t for t in _texts(at.info)) and "search_filter_btn" not in {b.key for b in at.button}


def _run_entropy_gated(at: AppTest, n: int, threshold: float) -> None:
    """On the Generate page: run the entropy_gated policy (this threshold) on the first `n` problems."""
    at.radio(key="gen_mode").set_value("first N").run()
    at.number_input(key="gen_n").set_value(n).run()
    at.selectbox(key="gen_policy").set_value("entropy_gated").run()
    at.number_input(key="gen_entropy_gated_threshold").set_value(threshold).run()
    at.button(key="gen_run").click().run()


def test_generate_page_runs_a_policy_and_stores_graded_traces(env):
    at = env.open()
    at.switch_page("screens/generate.py").run()
    _ok(at)
    _run_entropy_gated(at, n=2, threshold=0.0)
    _ok(at)
    assert any("2 trace(s) stored" in t for t in _texts(at.success))
    rows = TraceStore(env.store).summaries()
    gated = rows[rows["policy"] == "entropy_gated"]
    assert sorted(gated["problem"]) == ["p1", "p2"] and (gated["n_takeovers"] > 0).all()
    assert gated["correct"].notna().all()


def test_a_failed_generation_leaves_its_error_and_no_live_progress(env, monkeypatch):
    """A problem longer than the context: the error was clear, but the progress box stayed at "starting" with
    its Cancel button live above it, and the message named a CLI flag the page does not have."""
    from app import actions
    from app.view import md_escape
    from core import load_pair
    from core.errors import InvalidInputError

    pair = load_pair(*env.argv[1:4:2], device="cpu")
    limit = pair.context_length("base")
    with pytest.raises(InvalidInputError) as err:
        pair.check_context({"base": [0] * limit, "reason": [0] * limit}, 8)
    assert "does not fit" in str(err.value) and "--max-new-tokens" not in str(err.value)

    def fail(*args, **kwargs):
        raise err.value

    monkeypatch.setattr(actions, "run_generate", fail)
    at = env.open()
    at.switch_page("screens/generate.py").run()
    at.radio(key="gen_mode").set_value("typed").run()
    at.text_area(key="gen_text").set_value("How many apples?").run()
    at.button(key="gen_run").click().run()
    assert [str(e.value) for e in at.error] == [f"Generation failed: {md_escape(err.value, 400)}"]
    assert not at.get("progress") and "gen_cancel" not in {b.key for b in at.button}


def test_generate_keeps_the_gate_calibrations_rollouts_apart_and_says_so(env):
    """A Guided run calibrates on base rollouts of held-out problems: they go to the store's calibration store (the
    next calibration reuses them), not among the user's traces (the store grew by 32 traces for 8 asked, listed and
    analysed with them), and the page says so."""
    at = env.open()
    at.switch_page("screens/generate.py").run()
    before = set(TraceStore(env.store).keys())
    at.radio(key="gen_mode").set_value("first N").run()
    at.number_input(key="gen_n").set_value(1).run()
    at.selectbox(key="gen_policy").set_value("guided").run()
    at.button(key="gen_run").click().run()
    _ok(at)
    new = set(TraceStore(env.store).keys()) - before
    rollouts = TraceStore(env.store).calibration_store().summaries()
    assert len(new) == 1 and TraceStore(env.store).get(new.pop()).meta["policy"]["name"] == "guided"
    assert len(rollouts) >= 1 and set(rollouts["policy"]) == {"base_only"}
    assert any("1 trace(s) stored" in t and f"made {len(rollouts)} BaseOnly rollouts" in t and "kept apart" in t
               for t in _texts(at.success)), _texts(at.success)


def test_a_large_export_is_written_when_asked_and_reads_each_trace_once(env, monkeypatch):
    """A filtered set past downloads.EAGER_MAX waits for "Prepare" (the whole 5,600-trace store was written at once,
    in every format clicked, 27-67 s each, before anyone asked to download); then each trace is read once."""
    from app import downloads

    at = env.open()
    _second_trace(env)
    monkeypatch.setattr(downloads, "EAGER_MAX", 1)
    reads, get = [], TraceStore.get
    monkeypatch.setattr(TraceStore, "get", lambda self, key: reads.append(key) or get(self, key))
    at.switch_page("screens/export.py").run()
    reads.clear()  # the open trace's own page reads it; what follows reads only for the file
    at.radio(key="ex_scope").set_value("filtered").run()
    _ok(at)
    assert not at.get("download_button") and reads == []  # nothing written or read yet
    at.button(key="ex_prepare").click().run()
    _ok(at)
    assert "forkpoint-2-traces.jsonl" in at.get("download_button")[0].proto.label
    assert sorted(reads) == sorted(TraceStore(env.store).keys())


def test_export_page_offers_the_open_trace(env, tmp_path):
    at = env.open()
    key = at.session_state["trace_key"]
    at.switch_page("screens/export.py").run()
    _ok(at)
    button = at.get("download_button")[0]
    assert f"forkpoint-{key[:8]}.jsonl" in button.proto.label
    at.radio(key="ex_format").set_value("csv").run()
    _ok(at)
    assert f"forkpoint-{key[:8]}.zip" in at.get("download_button")[0].proto.label
    trace = TraceStore(env.store).get(key)  # the bytes behind the button: a lossless JSONL round trip
    path = tmp_path / "t.jsonl"
    path.write_bytes(export_file_bytes([trace], "jsonl"))
    assert read_jsonl(path) == [annotated(trace)]  # lossless, plus the spikes and tags the user sees


def test_dataset_page_draws_each_analysis_in_its_own_lazy_tab(env, monkeypatch):
    """Every registered analysis with a figure draws it in its tab, and only the open tab runs (the page opens
    on the first: one analysis read, not all of them). The tabs share the selection's traces: each is read
    from the store once in the whole walk (each tab's scans read all of them, 24 scans a report)."""
    from core.analysis.registry import list_analyses

    at = env.open()
    _second_trace(env)
    reads, get = [], TraceStore.get
    monkeypatch.setattr(TraceStore, "get", lambda self, key: reads.append(key) or get(self, key))
    at.switch_page("screens/dataset.py").run()
    assert not at.exception and not at.error
    specs = list_analyses()

    def drawn() -> set[str]:
        return {c.proto.id.rsplit("-ds_fig_", 1)[1] for c in at.get("plotly_chart") if "-ds_fig_" in c.proto.id}

    assert drawn() <= {specs[0].name}
    charts = 0
    for spec in [s for s in specs if s.figure]:
        at.session_state[DATASET_TAB_KEY] = spec.label
        at.run()
        assert not at.exception and not at.error, spec.name
        # its own figure and no other tab's, or a message saying why it has none (e.g. recovery needs policies)
        assert drawn() == {spec.name} or (not drawn() and at.warning), (spec.name, drawn())
        charts += bool(drawn())
        if spec.name == "failure_auroc":  # an empty ROC chart says why (one class of answers: no AUROC)
            one_class = TraceStore(env.store).summaries()["correct"].dropna().nunique() < 2
            assert one_class == any("AUROC undefined" in t for t in _texts(at.info)), _texts(at.info)
    assert charts >= 4
    assert sorted(reads) == sorted(TraceStore(env.store).keys()), reads


def test_gate_spike_rule_calibrates_on_base_rollouts(env):
    at = env.open()
    at.radio(key="spike_kind").set_value("gate").run()
    _ok(at)
    assert not at.sidebar.warning, [w.value for w in at.sidebar.warning]
    assert any("τ =" in t for t in _texts(at.sidebar.caption))
    assert at.metric[4].label.startswith("Spikes (gate")


def test_score_metric_from_the_sidebar_drives_the_table(env):
    at = env.open()
    at.selectbox(key="score").set_value("jsd").run()
    _ok(at)
    at.switch_page("screens/problems.py").run()
    row = at.dataframe[0].value.iloc[0]
    trace = TraceStore(env.store).get(row["key"])
    assert row["max"] == pytest.approx(float(max(trace.metrics["jsd"])))


def test_loading_a_bad_pair_from_the_sidebar_is_a_message(env, tmp_path):
    at = env.open()
    at.text_input(key="pair_base").input(str(tmp_path / "missing-model")).run()
    at.button(key="pair_load").click().run()
    assert not at.exception
    assert any("Could not load the model pair" in t and "missing-model" in t for t in _texts(at.error))


def test_vocabulary_mismatch_is_a_message(env, tmp_path, tiny_dirs):
    from core.demo.tiny import build_tiny_model, build_tiny_tokenizer

    other = build_tiny_model(tmp_path / "other_vocab", build_tiny_tokenizer(vocab_size=300), "qwen3", seed=5, hidden=32,
                             layers=1)
    args = ["--base", str(tiny_dirs["qwen_base"]), "--reason", str(other), "--store", str(env.store),
            "--problems", str(env.problems)]
    at = env.start(args=args).run()
    assert not at.exception
    errors = " ".join(_texts(at.error))
    assert "Could not load the model pair" in errors and "tokenizers differ" in errors
    assert any("No trace yet" in t for t in _texts(at.markdown))  # the page still works without a pair
    assert at.button(key="first_generate").disabled


def test_no_arguments_opens_a_demo_trace(env, tmp_path, monkeypatch):
    from core.demo.pair import DEMO_DIR

    if not (DEMO_DIR / "pair.json").exists():
        pytest.skip("the bundled demo pair is not built (forkpoint demo train)")
    monkeypatch.setenv("FORKPOINT_STORE", str(tmp_path / "demo_store"))
    at = env.start(args=[]).run()
    _ok(at)
    assert not TraceStore(tmp_path / "demo_store").keys()  # nothing generated unasked
    at.button(key="first_generate").click().run()
    _ok(at)
    trace = TraceStore(tmp_path / "demo_store").get(at.session_state["trace_key"])
    assert str(trace.meta["problem"]["id"]).startswith("demo")
    assert at.metric[4].label.startswith("Spikes") and int(at.metric[4].value) >= 1
    assert trace.meta["correct"] is not None


def test_generate_widgets_come_from_the_policy_registry(env):
    from core.decoding.policies import list_policies

    at = env.open()
    at.switch_page("screens/generate.py").run()
    _ok(at)
    assert at.selectbox(key="gen_policy").options and len(at.selectbox(key="gen_policy").options) == len(list_policies())
    for spec in list_policies():
        at.selectbox(key="gen_policy").set_value(spec.name).run()
        _ok(at)
        keys = {w.key for w in [*at.number_input, *at.text_input, *at.selectbox] if w.key}
        wanted = {f"gen_{spec.name}_{p.name}" for p in spec.user_params if p.kind is not dict}
        assert wanted <= keys, (spec.name, wanted - keys)


def test_a_policy_that_did_nothing_says_so(env):
    at = env.open()
    at.switch_page("screens/generate.py").run()
    _run_entropy_gated(at, n=1, threshold=1000.0)
    _ok(at)
    assert any("threshold" in t for t in _texts(at.warning)), _texts(at.warning)


def test_the_url_holds_metric_scale_range_spikes_and_comparison(env):
    at = env.open()
    key = at.session_state["trace_key"]
    at.selectbox(key="score").set_value("jsd").run()
    at.selectbox(key="scale").set_value("log").run()
    at.selectbox(key="crange").set_value("pair").run()
    at.slider(key="spike_top_pct").set_value(10.0).run()
    _branch_from(at, 2)
    at.button(key="takeover_reason").click().run()
    _ok(at)
    child = at.session_state["compare"]["child"]
    qp = dict(at.query_params)
    assert qp["metric"] == ["jsd"] or qp["metric"] == "jsd", qp
    flat = {k: (v[0] if isinstance(v, list) else v) for k, v in qp.items()}
    assert flat["scale"] == "log" and flat["range"] == "pair" and flat["spikes"] == "top:10"
    assert flat["compare"] == f"{child}@2" and flat["trace"] == key
    again = _opened(env, **flat)
    _ok(again)
    ss = again.session_state
    assert (ss["score"], ss["scale"], ss["crange"], ss["spike_top_pct"]) == ("jsd", "log", "pair", 10.0)
    assert ss["compare"] == {"parent": key, "child": child, "pos": 2}
    assert any("Branch at token #2" in t for t in _texts(again.markdown))


def test_url_values_in_messages_cannot_inject_markdown(env):
    at = _opened(env, trace="[click](http://evil.example/x) ![img](http://evil.example/i.png)")
    assert not at.exception
    shown = " ".join(str(w.value) for w in at.warning)  # the raw Markdown
    assert "not in the store" in shown
    assert "](http" not in shown and "\\[click\\]" in shown  # every bracket escaped: no link, no image


def test_problems_page_lists_unreadable_traces(env):
    at = env.open()
    bad = env.store / "traces" / "ff" / ("ff" * 16 + ".fpt")
    traces_dir = env.store / "traces"
    existing = next(p for p in traces_dir.rglob("*") if p.is_file())
    bad = existing.with_name("0" * (len(existing.stem)) + existing.suffix)
    bad.write_bytes(b"not a trace at all")
    at.switch_page("screens/problems.py").run()
    assert not at.exception
    assert any("cannot be read" in t for t in _texts(at.warning)), _texts(at.warning)
    table = next(d for d in at.dataframe if "reason" in d.value.columns).value
    assert str(bad) in set(table["file"])


def test_damaged_traces_are_counted_apart_and_a_damaged_link_says_what_to_do(env):
    """Issue 24.8: a trace whose footer reads but whose pages do not is not counted as readable, and its
    link says "damaged: run forkpoint verify / repair" rather than "not in the store"."""
    at = env.open()
    store = TraceStore(env.store)
    key = at.session_state["trace_key"]
    _second_trace(env)
    path = store.traces_dir / f"{key}.parquet"
    raw = bytearray(path.read_bytes())
    raw[200:260] = bytes(b ^ 0xFF for b in raw[200:260])  # a data page; the footer (summary) still reads
    path.write_bytes(bytes(raw))
    n = len(store.keys())
    at.switch_page("screens/problems.py").run()
    assert not at.exception
    captions = " ".join(_texts(at.caption))
    assert f"of {n - 1} readable traces (+1 damaged, listed below)" in captions, captions
    table = next(d for d in at.dataframe if "key" in d.value.columns).value
    assert key not in set(table["key"])
    shown = " ".join(_texts(_opened(env, trace=key).error))
    assert "is damaged" in shown and "forkpoint verify" in shown and "forkpoint repair" in shown


def test_the_problems_page_does_not_wait_for_the_stores_full_read(env, monkeypatch):
    """A fresh server reads every trace file in full once to find damaged pages (5.5 s at 5,600 traces): the
    Problems page waits at most DEEP_CHECK_WAIT_S for that read, draws with the damaged files the listing found,
    says the read goes on, and shows the rest once it is done. The damage here is in place, with the file's
    size and mtime restored, so only the full read finds it."""
    import threading

    at = env.open()
    store = TraceStore(env.store)
    key = at.session_state["trace_key"]
    _second_trace(env)
    path = store.traces_dir / f"{key}.parquet"
    before = path.stat()
    raw = bytearray(path.read_bytes())
    raw[200:260] = bytes(b ^ 0xFF for b in raw[200:260])  # a data page; the footer (summary) still reads
    with open(path, "r+b") as fh:  # in place: the same inode and size
        fh.write(raw)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    release, original = threading.Event(), TraceStore.unreadable

    def slow(self, deep=True):
        if deep:
            assert release.wait(30)
        return original(self, deep)

    monkeypatch.setattr(TraceStore, "unreadable", slow)
    monkeypatch.setattr(resources, "DEEP_CHECK_WAIT_S", 0.2)
    n = len(store.keys())
    at.switch_page("screens/problems.py").run()
    _ok(at)
    captions = " ".join(_texts(at.caption))
    assert "Reading every trace file in full" in captions and f"of {n} readable traces" in captions, captions
    release.set()
    check = resources.deep_check(str(env.store.resolve()))
    for _ in range(300):
        if not check.running():
            break
        time.sleep(0.1)
    at.run()
    _ok(at)
    captions = " ".join(_texts(at.caption))
    assert "Reading every trace file in full" not in captions, captions
    assert f"of {n - 1} readable traces (+1 damaged, listed below)" in captions, captions
    table = next(d for d in at.dataframe if "reason" in d.value.columns).value
    assert set(table["file"]) == {str(path)}


def test_the_server_start_reads_the_store_ahead_after_the_pair(env, monkeypatch):
    """`forkpoint app` starts the store's full read after loading the pair (a first visit to Problems on 5,600
    traces waited 7 s for it), and never creates a store that is not there."""
    from app import config, serve

    env.open()  # a store with a trace
    order = []
    monkeypatch.setattr(resources, "load_pair", lambda spec: order.append("pair"))
    monkeypatch.setattr(TraceStore, "unreadable", lambda self: order.append(("read", str(self.path))) or [])
    monkeypatch.setattr(sys, "argv", [str(config.APP_DIR / "serve.py"), "--store", str(env.store)])
    serve._preload()
    check = resources.deep_check(resources.store_path(str(env.store)))
    for _ in range(100):
        if not check.running():
            break
        time.sleep(0.05)
    assert order == ["pair", ("read", resources.store_path(str(env.store)))]
    missing = env.store.parent / "no_store_here"
    monkeypatch.setattr(sys, "argv", [str(config.APP_DIR / "serve.py"), "--store", str(missing)])
    serve._preload()
    assert not missing.exists() and order[-1] == "pair"


def test_a_deep_check_hands_each_finished_read_out_once_then_reads_again():
    """`DeepCheck.result`: a read that finished after its page stopped waiting is handed out (no second read)
    when the page reruns; its error is raised once, not read again and again; later calls read anew."""
    import threading

    class Store:
        def __init__(self):
            self.calls, self.gate, self.fail = 0, threading.Event(), False

        def unreadable(self):
            self.calls += 1
            assert self.gate.wait(30)
            if self.fail:
                raise OSError("the folder went away")
            return [(Path("x.parquet"), f"read {self.calls}")]

    store = Store()
    check = resources.DeepCheck(store)
    assert check.result(0.05) is None and check.running()
    store.gate.set()
    for _ in range(300):
        if not check.running():
            break
        time.sleep(0.01)
    assert check.result(0.05) == [(Path("x.parquet"), "read 1")] and store.calls == 1  # the finished read, as it is
    assert check.result(5) == [(Path("x.parquet"), "read 2")] and store.calls == 2  # handed out: read again
    store.fail = True
    with pytest.raises(OSError, match="went away"):
        check.result(5)
    assert store.calls == 3
    with pytest.raises(OSError, match="went away"):
        check.result(5)
    assert store.calls == 4  # a new read, not the old error handed out again


def test_gate_without_rollouts_of_this_pair_says_so_and_makes_them(env):
    at = _opened(env, trace="0" * 32)  # no first view: the store stays empty
    at.radio(key="spike_kind").set_value("gate").run()
    assert not at.exception
    warned = " ".join(_texts(at.sidebar.warning))
    assert "no BaseOnly rollouts of this pair" in warned and "never used" in warned
    assert TraceStore(env.store).keys() == [] or not list(TraceStore(env.store).keys())
    at.button(key="make_rollouts").click().run()
    assert not at.exception
    assert any("τ =" in t for t in _texts(at.sidebar.caption)), _texts(at.sidebar.warning)
    rows = TraceStore(env.store).calibration_store().summaries()  # kept apart from the user's traces
    assert len(rows) == len(PROBLEMS) and set(rows["policy"]) == {"base_only"}
    assert not TraceStore(env.store).keys()


def test_forkpoint_app_rejects_a_bad_port_with_a_message():
    from click.testing import CliRunner

    from core.cli import main

    result = CliRunner().invoke(main, ["app", "--port", "99999"])
    assert result.exit_code == 2 and "--port" in result.output and "99999" in result.output
    assert "Traceback" not in result.output


# Streamlit's own start, up to the server: the config it would serve with, as JSON (argv: the option names, then
# `streamlit` CLI arguments)
_CONFIG_PROBE = """import json, sys
import streamlit.web.bootstrap as bootstrap
import streamlit.web.cli as cli
from streamlit import config
def serve(main_script_path, app_import_string, args, flag_options):
    print(json.dumps({name: config.get_option(name) for name in json.loads(sys.argv[1])}))
    raise SystemExit(0)
bootstrap.run_asgi_app = serve
cli.check_credentials = lambda: None
cli.main(sys.argv[2:])
"""


def test_forkpoint_app_keeps_its_streamlit_settings_from_any_working_directory(tmp_path):
    """Streamlit reads .streamlit/config.toml only from the working directory; `forkpoint app` passes every option
    as a flag, so started elsewhere (or from a wheel) it still hides tracebacks from the browser, watches no files
    and keeps its theme, and the bind address alone decides the Hosts allowed (any, "*", on 0.0.0.0)."""
    from core.cli.app import _config_options, streamlit_command

    probe = tmp_path / "probe.py"
    probe.write_text(_CONFIG_PROBE)
    wanted = _config_options()
    assert wanted["client.showErrorDetails"] == "none" and wanted["server.fileWatcherType"] == "none"

    def served(cmd: list[str]) -> dict:
        assert cmd[1:4] == ["-m", "streamlit", "run"]
        done = subprocess.run([sys.executable, str(probe), json.dumps(list(wanted)), *cmd[3:]], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    for address, hosts in (("127.0.0.1", ["127.0.0.1", "localhost", "::1"]), ("0.0.0.0", ["*"])):
        seen = served(streamlit_command(address, 8600, ["--store", "st"]))
        assert seen.pop("server.address") == address and seen.pop("server.allowedHosts") == hosts
        assert seen == {name: value for name, value in wanted.items() if name in seen}, seen
    bare = served(streamlit_command("127.0.0.1", 8600, [])[:5])  # the same start without the flags
    assert bare["client.showErrorDetails"] != "none" and bare["server.fileWatcherType"] != "none"


def test_forkpoint_app_passes_nested_and_list_settings_as_streamlit_flags(tmp_path, monkeypatch):
    import core.cli.app
    from core.cli.app import streamlit_command

    toml = tmp_path / "config.toml"
    toml.write_text('[server]\nallowedHosts = ["a", "b"]\nmaxUploadSize = 5\n[theme]\nfont = "sans serif"\n'
                    '[theme.sidebar]\nbackgroundColor = "#ffffff"\n[runner]\npostScriptGC = false\n')
    monkeypatch.setattr(core.cli.app, "streamlit_config", lambda: toml)
    cmd = streamlit_command("127.0.0.1", 8600, [])
    flags = cmd[5:cmd.index("--")]
    pairs = list(zip(flags[::2], flags[1::2]))
    assert ("--theme.sidebar.backgroundColor", "#ffffff") in pairs and ("--theme.font", "sans serif") in pairs
    assert ("--server.maxUploadSize", "5") in pairs and ("--runner.postScriptGC", "false") in pairs
    assert [v for f, v in pairs if f == "--server.allowedHosts"] == ["127.0.0.1", "localhost", "::1"]  # the address's


@pytest.mark.slow
def test_forkpoint_app_takes_base_reason_and_sigterm_stops_streamlit(tiny_dirs, tmp_path):
    import os
    import signal
    import subprocess
    import time
    import urllib.request

    from tests.browser import free_port

    port = free_port()
    exe = Path(sys.executable).with_name("forkpoint")
    proc = subprocess.Popen([str(exe), "app", "--base", str(tiny_dirs["qwen_base"]), "--reason",
                             str(tiny_dirs["qwen_reason"]), "--store", str(tmp_path / "s"), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the app did not start"
                time.sleep(0.5)
        # DNS rebinding: a WebSocket whose Host (and Origin) is another name is refused; the bound one is accepted
        assert _ws_status(port, "attacker.example") != 101
        assert _ws_status(port, f"127.0.0.1:{port}") == 101
        for path in ("/", "/_stcore/health", "/_stcore/metrics"):  # plain HTTP too (app/serve.py's HostGuard)
            assert _http_status(port, path, "attacker.example") == 403, path
            assert _http_status(port, path, f"localhost:{port}") == 200, path
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        time.sleep(1)
        with pytest.raises(OSError):  # Streamlit went down with it
            urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _http_status(port: int, path: str, host: str) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


def test_host_guard_refuses_plain_http_with_a_foreign_host(monkeypatch):
    """Issue 24.10: HTTP requests whose Host is not in server.allowedHosts get 403 before Streamlit sees them."""
    import asyncio

    from streamlit import config

    from app.host_guard import HostGuard

    reached = []

    async def inner(scope, receive, send):
        reached.append(scope["path"])

    def status(host_headers: list[bytes], kind: str = "http") -> int | None:
        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": kind, "path": "/x", "headers": [(b"host", h) for h in host_headers]}
        asyncio.run(HostGuard(inner)(scope, None, send))
        return sent[0]["status"] if sent else None

    monkeypatch.setattr(config, "get_option", lambda name: ["127.0.0.1", "localhost"] if name == "server.allowedHosts"
                        else None)  # fmt: skip
    assert status([b"attacker.example"]) == 403 and status([b"127.0.0.1.attacker.example:80"]) == 403
    assert status([]) == 403 and status([b"localhost:8501", b"attacker.example"]) == 403
    assert status([b"user@localhost"]) == 403
    assert status([b"localhost:8501"]) is None and status([b"127.0.0.1"]) is None and reached == ["/x", "/x"]
    assert status([b"attacker.example"], kind="websocket") is None  # Streamlit's own check handles those
    monkeypatch.setattr(config, "get_option", lambda name: [])  # bound to 0.0.0.0: every Host
    assert status([b"attacker.example"]) is None


def test_forkpoint_app_serves_st_app_with_the_guard_first_and_the_live_route():
    """`forkpoint app`'s server is Streamlit's public st.App (app/serve.py): HostGuard is the middleware run before
    Streamlit's own (then a shared link's first paint, app/first_paint.py), so the live route (app/live.py) and the
    first paint sit behind the Host check; no Streamlit module is patched.
    In a subprocess: building an st.App sets Streamlit's process-wide main script."""
    code = (
        "import json, streamlit as st\n"
        "from starlette.routing import Route\n"
        "from app import serve\n"
        "from app.first_paint import FirstPaint\n"
        "from app.host_guard import HostGuard\n"
        "from app.live import ROUTE, LiveRoute, serving\n"
        "(route,) = serve.routes()\n"
        "print(json.dumps({'app': isinstance(serve.streamlit_app, st.App),\n"
        "                  'script': str(serve.streamlit_app.script_path) == str(serve.MAIN),\n"
        "                  'middleware': [m.cls for m in serve.middleware()] == [HostGuard, FirstPaint],\n"
        "                  'route': [isinstance(route, Route), route.path == ROUTE, isinstance(route.app, LiveRoute)],\n"
        "                  'served': serving()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {"app": True, "script": True, "middleware": True,
                                                       "route": [True, True, True], "served": True}


def _ws_status(port: int, host: str) -> int:
    """HTTP status of a WebSocket upgrade to the app's stream with the given Host and a matching Origin."""
    import socket

    request = (f"GET /_stcore/stream HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
               f"Origin: http://{host}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request.encode())
        head = conn.recv(256).decode("latin-1")
    return int(head.split()[1]) if head.startswith("HTTP/") else 0


def test_score_selector_is_the_metric_registry(env):
    from core.scoring.registry import METRICS, SCORES

    at = env.open()
    assert at.selectbox(key="score").options == [METRICS[s].score_label for s in SCORES]
    assert "entropy_reason" in SCORES
    at.selectbox(key="score").set_value("entropy_reason").run()
    _ok(at)


def test_a_long_trace_opens_on_the_page_of_the_linked_token(env):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fakes import make_trace

    from core.views.presentation import PAGE_TOKENS

    trace = make_trace(PAGE_TOKENS + 50, seed=3)
    TraceStore(env.store).put(trace)
    at = _opened(env, trace=trace.key, pos=str(PAGE_TOKENS + 10))
    _ok(at)
    assert at.session_state["tok_page"] == 2  # the linked token's page, not the first
    assert any(f"Token #{PAGE_TOKENS + 10}" in t for t in _texts(at.markdown))


def test_force_any_vocabulary_token_and_a_typed_string(env):
    at = env.open()
    parent_key = at.session_state["trace_key"]
    _branch_from(at, 2)
    at.text_input(key="vocab_query").input("e").run()
    pick = at.selectbox(key="vocab_pick")
    offered = TraceStore(env.store).get(parent_key)
    import re

    ids = [int(re.search(r"\(id (\d+)\)", label).group(1)) for label in pick.options]  # labels show both p
    assert all("base p" in label and "reason p" in label for label in pick.options)
    outside = [i for i in ids if i not in set(offered.topk["base"][0][2].tolist()) | set(offered.topk["reason"][0][2].tolist())]
    assert outside, "the search offers tokens beyond both top-k lists"
    pick.set_value(outside[0]).run()
    at.button(key="takeover_vocab").click().run()
    _ok(at)
    child = TraceStore(env.store).get(at.session_state["compare"]["child"])
    assert int(child.token_ids[2]) == outside[0] and child.source[2] == "forced"
    _branch_from(at, 1)
    at.text_input(key="typed_force").input(" seven apples").run()
    at.button(key="takeover_typed").click().run()
    _ok(at)
    typed = TraceStore(env.store).get(at.session_state["compare"]["child"])
    from core import load_pair

    pair = load_pair(*env.argv[1:4:2], device="cpu")
    ids = pair.encode(" seven apples")
    assert typed.token_ids[1:1 + len(ids)].tolist() == ids and set(typed.source[1:1 + len(ids)]) == {"forced"}


def test_branch_with_its_own_temperature_and_seed(env):
    at = env.open()
    _branch_from(at, 2)
    at.number_input(key="branch_temperature").set_value(1.0).run()
    at.number_input(key="branch_seed").set_value(7).run()
    at.button(key="takeover_reason").click().run()
    _ok(at)
    child = TraceStore(env.store).get(at.session_state["compare"]["child"])
    assert child.meta["sampling"]["temperature"] == 1.0 and child.meta["sampling"]["seed"] == 7


def test_the_switchboard_flips_in_place_and_goes_back(env):
    """A click in flip mode (the component's event, as the fragment reads it) switches the open trace in
    place: the child is opened, graded and stored, the switch list shows it, and back / forward move
    between the two states; switching it off again returns the original trace."""
    at = env.open()
    root = at.session_state["trace_key"]
    store = TraceStore(env.store)
    parent = store.get(root)
    from core.views.presentation import flip_changes

    pos = next(i for i in flip_changes(parent) if parent.source[i] == "base")  # a flip that changes the text
    at.session_state["switch_job"] = {"pos": pos}
    at.run()
    _ok(at)
    key = at.session_state["trace_key"]
    assert key != root and at.query_params["trace"] == key
    child = store.get(key)
    assert child.meta["switches"] == {str(pos): "reason"} and child.source[pos] == "reason"
    assert child.meta["correct"] is not None  # graded like every trace
    assert child.token_ids[:pos].tolist() == parent.token_ids[:pos].tolist()
    assert any(t.key == f"sw_{key}_{pos}" for t in at.toggle)  # the switch list
    assert at.session_state["sw_hist"] == [root, key]
    at.button(key="sw_back").click().run()
    _ok(at)
    assert at.session_state["trace_key"] == root
    at.button(key="sw_fwd").click().run()
    assert at.session_state["trace_key"] == key
    at.toggle(key=f"sw_{key}_{pos}").set_value(False).run()  # switched off: the original again
    _ok(at)
    assert at.session_state["trace_key"] == root


def test_a_top_k_alternative_click_forces_that_token(env):
    at = env.open()
    parent = TraceStore(env.store).get(at.session_state["trace_key"])
    alt = int(parent.topk["reason"][0][3][1])
    at.session_state["switch_job"] = {"pos": 3, "token": alt}
    at.run()
    _ok(at)
    child = TraceStore(env.store).get(at.session_state["trace_key"])
    assert int(child.token_ids[3]) == alt and child.source[3] == "forced"


def test_a_compare_link_is_checked_against_the_open_trace(env):
    """Issue 22 defect 3: `compare=` named an unrelated trace "Branch at token #5", and `@999999` read "Shared
    prefix: 999999 tokens". Only a real branch of the open trace is compared, at its own branch position."""
    at = env.open()
    key = at.session_state["trace_key"]
    other = _second_trace(env)  # the other problem's root
    bad = _opened(env, trace=key, compare=f"{other}@5")
    assert not bad.exception
    assert any("is not a branch of the open trace" in t for t in _texts(bad.warning))
    assert not any("Branch at token" in t for t in _texts(bad.markdown)) and bad.session_state["compare"] is None
    _branch_from(at, 2)
    at.button(key="takeover_reason").click().run()
    child = at.session_state["compare"]["child"]
    far = _opened(env, trace=key, compare=f"{child}@999999")
    _ok(far)
    assert any("Branch at token #2" in t for t in _texts(far.markdown))
    assert any("Shared prefix: 2 tokens" in t for t in _texts(far.caption))
    assert far.session_state["compare"]["pos"] == 2


def test_compare_starts_on_the_open_trace_and_an_error_clears_the_last_result(env):
    """Issue 22 defect 7: Compare preselected the newest trace, and a new error kept the old result on screen."""
    at = env.open()
    key = at.session_state["trace_key"]
    newest = TraceStore(env.store).summaries().sort_values("created").iloc[-1]["key"]
    at.session_state["trace_key"] = key
    at.switch_page("screens/compare.py").run()
    _ok(at)
    assert at.selectbox(key="cmp_key").value == key, (key, newest)
    at.button(key="cmp_go").click().run()
    _ok(at)
    assert any("Top-k at token" in str(h.value) for h in at.subheader)
    # defect 8: the base against itself is tinted under cross-entropy: the page says why (not a disagreement)
    assert any("base entropy" in str(c.value) and "not a disagreement" in str(c.value) for c in at.caption)
    at.text_area(key="cmp_sources").input("/no/such/model").run()
    at.checkbox(key="cmp_self").uncheck().run()
    at.button(key="cmp_go").click().run()
    assert at.error and not any("Top-k at token" in str(h.value) for h in at.subheader)



def test_an_unknown_problem_in_the_url_reads_without_backslashes(env):
    """Issue 22 defect 10: `?problem=` errors showed backslash escapes (the id was escaped twice)."""
    at = _opened(env, problem="no-such.problem[1]")
    assert not at.exception
    shown = _texts(at.error)  # what the reader sees: one level of Markdown escapes removed
    assert any("No problem 'no-such.problem[1]' in the problem set" in t for t in shown), shown
    assert not any("\\" in t for t in shown), shown


def test_the_branch_tools_are_drawn_in_flip_mode_only_when_asked_for(env):
    """In flip mode (a click switches) the selection panel draws the token's numbers and top-k but not its ~20
    branch widgets, so a switch's page update does not redraw them; its toggle draws them; select mode has them open."""
    at = env.open()
    at.session_state["sel_pos"] = 2
    at.run()
    _ok(at)
    keys = {b.key for b in at.button}
    assert "takeover_reason" not in keys and "fan_go" not in keys
    assert any("top-" in str(df.value.columns[0]) for df in at.dataframe)  # the numbers and top-k stay
    at.toggle(key=BRANCH_TOOLS).set_value(True).run()
    assert {"takeover_reason", "takeover_token", "fan_go"} <= {b.key for b in at.button}
    at.toggle(key=BRANCH_TOOLS).set_value(False)
    at.session_state["click_mode"] = "select"
    at.run()
    assert "takeover_reason" in {b.key for b in at.button} and not [t for t in at.toggle if t.key == BRANCH_TOOLS]


def test_a_takeover_where_the_reasoner_already_wrote_says_nothing_changes(env):
    """Flip a token (the child opens), then "Reasoning model takes over here" at the same token: the branch is
    the open trace itself, so core gives it back; the page says nothing changes (no comparison of a trace with
    itself, no new trace), never "not a branch of the open trace"."""
    from core import load_pair
    from core.decoding.takeover import flipped, set_switches

    at = env.open()
    store = TraceStore(env.store)
    parent = store.get(at.session_state["trace_key"])
    pos = next(i for i, s in enumerate(parent.source) if s == "base" and i > 0)
    pair = load_pair(*env.argv[1:4:2], device="cpu")
    child = set_switches(pair, parent, flipped(parent, pos), store=store)
    store.put(child)
    at = _opened(env, trace=child.key, pos=str(pos))
    at.toggle(key=BRANCH_TOOLS).set_value(True).run()
    before = sorted(store.keys())
    at.button(key="takeover_reason").click().run()
    _ok(at)
    assert not any("not a branch" in t for t in _texts(at.warning))
    assert at.session_state["compare"] is None and sorted(TraceStore(env.store).keys()) == before
    assert any(f"#{pos}:" in t and "nothing changes" in t for t in _texts(at.info)), _texts(at.info)


def test_dataset_page_shows_the_gate_shoot_out(env, tmp_path):
    import pandas as pd

    from core.reports.gates import write_gates

    rows = [{"benchmark": "problems", "gate": g, "label": f"{g} ρ=0.05" if g not in ("base", "reason") else g,
             "target_rho": 0.05, "calibrated_rho": 0.05, "rho": r, "accuracy": a, "pass@k": a, "k": 1,
             "recovery": (a - 0.4) / 0.6, "recovery@k": (a - 0.4) / 0.6, "wrong_to_right": w, "right_to_wrong": 0,
             "problems": 10, "samples": 1, "reason_evals_per_token": c, "wall_s_per_token": 0.01, "knob": "x",
             "knob_value": 1.0, "mean_tokens": 50.0, "reference": "policy reason"}
            for g, r, a, w, c in (("base", 0.0, 0.4, 0, 0.0), ("reason", 1.0, 1.0, 6, 1.0),
                                  ("top_prob", 0.05, 0.9, 5, 0.05), ("guided", 0.05, 1.0, 6, 1.0))]
    write_gates(tmp_path / "gates", pd.DataFrame(rows))
    at = env.open()  # the Dataset page reads the store's traces; the first view stores none unasked
    at.switch_page("screens/dataset.py")
    at.session_state[DATASET_TAB_KEY] = "Gates"  # a lazy tab: only the open one runs
    at.run()
    at.text_input(key="ds_gates_path").set_value(str(tmp_path / "gates")).run()
    _ok(at)
    shown = [df.value for df in at.dataframe if "label" in df.value.columns]
    assert shown and list(shown[-1]["label"]) == ["base", "reason", "top_prob ρ=0.05", "guided ρ=0.05"]
    at.text_input(key="ds_gates_path").set_value(str(tmp_path / "nope.csv")).run()
    assert any("cannot read a gate shoot-out table" in str(e.value) for e in at.error)


def test_a_fan_of_alternatives_is_stored_and_sits_side_by_side(env):
    """Issue 31: "n alternatives from here" samples n continuations from the selected token, each stored as a
    child of the open trace (siblings in the branch graph) and shown beside it."""
    from app.branch_panels import COLS_KEY

    at = env.open()
    parent = at.session_state["trace_key"]
    _branch_from(at, 2)
    at.number_input(key="fan_n").set_value(2).run()
    at.button(key="fan_go").click().run()
    _ok(at)
    store = TraceStore(env.store)
    kids = store.children(parent)
    picked = at.session_state[COLS_KEY]
    assert picked["parent"] == parent and len(picked["keys"]) == 2 and set(picked["keys"]) <= set(kids)
    for key in picked["keys"]:
        child = store.get(key)
        assert child.meta["parent"] == parent and child.meta["sampling"]["temperature"] > 0
        assert child.token_ids[:2].tolist() == store.get(parent).token_ids[:2].tolist()
        assert child.meta["correct"] is not None  # graded
    assert at.session_state["trace_key"] == parent  # the open trace stays; the alternatives sit beside it
    assert any("2 alternatives from token #2" in t for t in _texts(at.success))


def test_side_by_side_columns_mark_each_columns_switch_points():
    """Issue 31 (D3a): the Trace page's columns (the open trace and its branches) mark where a flip changes the
    text, each column its own `flip_changes` from the shared prefix on, with the live view's marker and rule."""
    from fakes import make_trace, with_switch_points

    from app.branch_panels import columns_html
    from core.views.presentation import flip_changes

    parent = with_switch_points(make_trace(24, seed=1), [3, 9, 20])
    child = with_switch_points(make_trace(24, seed=2), [12])
    out = columns_html([parent, child], ["Open trace", "branch"], 5, "cross_entropy", "linear", None, None, None)
    pattern = r'class="tok[^"]*\bfp-matter\b[^"]*" data-pos="(\d+)"'
    columns = {side: [int(p) for p in re.findall(pattern, part)]  # each column's body, up to the next column's
               for side, part in (x.split('"', 1) for x in out.split('<div class="fp-compare" data-side="')[1:])}
    assert columns == {"original": [8, 9, 20], "branch": [8, 12]}  # 8: make_trace's forced token
    assert columns["original"] == [p for p in flip_changes(parent) if p >= 5]
    assert ".fp-heatmap .tok.fp-matter:not(.sw):not(.diff) { text-decoration: underline dotted" in out


def test_a_fan_whose_samples_all_repeat_the_trace_says_so(env, monkeypatch):
    """Every sample redrew the open trace (run_fan leaves those out): the page said "0 alternatives ... stored:
    side by side below the text" in green, and nothing was there."""
    from app import actions
    from app.branch_panels import COLS_KEY

    at = env.open()
    _branch_from(at, 2)
    monkeypatch.setattr(actions, "run_fan", lambda *a, **k: ([], set()))
    at.number_input(key="fan_n").set_value(2).run()
    at.button(key="fan_go").click().run()
    _ok(at)
    assert not any("alternatives from token" in t for t in _texts(at.success))
    assert any("All 2 samples from token #2 wrote the open trace's own tokens" in t for t in _texts(at.info))
    assert not at.session_state[COLS_KEY] if COLS_KEY in at.session_state else True


def test_typed_text_continues_from_the_token_and_opens_the_new_trace(env):
    """Edit and continue through the fragment's rerun path (the browser test drives the live route): the typed
    text replaces the response from the token on, the model continues, and the child is the open trace."""
    from core import load_pair

    at = env.open()
    root = at.session_state["trace_key"]
    at.session_state["switch_job"] = {"pos": 2, "text": " Let me"}
    at.run()
    _ok(at)
    key = at.session_state["trace_key"]
    assert key != root and at.session_state["sw_hist"] == [root, key] and at.query_params["trace"] == key
    child, parent = TraceStore(env.store).get(key), TraceStore(env.store).get(root)
    ids = load_pair(*env.argv[1:4:2], device="cpu").encode(" Let me")
    assert child.token_ids[:2].tolist() == parent.token_ids[:2].tolist()
    assert child.token_ids[2:2 + len(ids)].tolist() == ids and set(child.source[2:2 + len(ids)]) == {"forced"}
    assert child.meta["parent"] == root


def test_typed_text_that_does_not_all_fit_says_so(env):
    """5,000 typed characters gave a child that held a sixth of them, and nothing said so: the page says what was
    cut (to MAX_TYPED characters, and the tokens past the models' context)."""
    from app import live
    from core import load_pair

    at = env.open()
    text = ("seven plus " * 200)[: live.MAX_TYPED]
    at.session_state["switch_job"] = {"pos": 2, "text": text, "cut": 4000}
    at.run()
    _ok(at)
    child = TraceStore(env.store).get(at.session_state["trace_key"])
    asked = len(load_pair(*env.argv[1:4:2], device="cpu").encode(text))
    kept = int((child.source[2:] == "forced").sum())
    assert kept < asked  # the tiny pair's context holds fewer than the typed tokens
    assert live.typed_note(child, 2, asked, 4000) == (
        f"Your text was cut to its first {live.MAX_TYPED:,} characters and only {kept} of its {asked} tokens fit in "
        "the models' context.")
    assert live.typed_note(child, 2, kept) is None and live.typed_note(child, 2, kept, 1).startswith("Your text was cut")
    view = next(c for c in at.get("bidi_component") if c.proto.component_name == "forkpoint_token_view")
    assert json.loads(view.proto.json)["note"] == live.typed_note(child, 2, asked, 4000)  # the line over the text


def test_a_flip_that_changes_no_token_makes_no_trace(env, tmp_path, monkeypatch):
    """A base token whose reasoner top token is the same: no new trace, no history step (the rerun path; the
    demo pair, whose reasoner mostly agrees with its base)."""
    from core.demo.pair import DEMO_DIR
    from core.views.presentation import flip_changes

    if not (DEMO_DIR / "pair.json").exists():
        pytest.skip("the bundled demo pair is not built (forkpoint demo train)")
    monkeypatch.setenv("FORKPOINT_STORE", str(tmp_path / "demo_store"))
    at = env.start(args=[]).run()
    at.selectbox(key="first_problem").set_value(1).run()  # the second demo problem: one token where they differ
    at.button(key="first_generate").click().run()
    root = at.session_state["trace_key"]
    store = TraceStore(tmp_path / "demo_store")
    trace = store.get(root)
    same = [p for p in range(len(trace)) if trace.source[p] == "base" and p not in set(flip_changes(trace))]
    assert same, "the demo reasoner writes another token everywhere"
    n = len(store.keys())
    at.session_state["switch_job"] = {"pos": same[0]}
    at.run()
    _ok(at)
    assert at.session_state["trace_key"] == root and at.session_state["sw_hist"] == [root]
    assert len(TraceStore(tmp_path / "demo_store").keys()) == n
    point = next(p for p in flip_changes(trace) if trace.source[p] == "base")  # a flip that does change the text
    at.session_state["switch_job"] = {"pos": point}
    at.run()
    _ok(at)
    assert at.session_state["trace_key"] != root and len(TraceStore(tmp_path / "demo_store").keys()) == n + 1


def test_a_click_reruns_only_the_fragments_whose_data_changed():
    """Issue 31 (c): the Trace page's plot and graph rerun only when the open trace changes; a selection reruns
    the text and the extras (notes, lens at the token); anything else the text alone."""
    from app.switchboard import EXTRAS, FRAGMENTS, GRAPH, PLOT, VIEW, rerun_after

    assert rerun_after(("a", 3), ("b", None)) == list(FRAGMENTS)
    assert rerun_after(("a", 3), ("a", 5)) == [VIEW, EXTRAS]
    assert rerun_after(("a", None), ("a", 0)) == [VIEW, EXTRAS]
    assert rerun_after(("a", 3), ("a", 3)) == [VIEW]
    for before, after in [(("a", 1), ("a", 2)), (("a", 1), ("a", 1))]:
        assert PLOT not in rerun_after(before, after) and GRAPH not in rerun_after(before, after)


def _applies_in_order(paths: list[tuple[int, ...]]) -> bool:
    """Whether a browser applies these delta paths, in order, without "Bad delta path index": each lands on an
    existing parent at an index no further than one past its last child (a new node at an old index replaces
    that node and what was under it)."""
    children: dict[tuple[int, ...], int] = {}
    for path in paths:
        parent, index = path[:-1], path[-1]
        if len(parent) > 1 and parent not in children:
            return False
        if index > children.get(parent, 0):
            return False
        children[parent] = max(children.get(parent, 0), index + 1)
        for under in [p for p in children if p[:len(path)] == path]:
            del children[under]
        children[path] = 0
    return True


def test_any_fragment_run_that_drops_the_first_runs_unsent_deltas_leaves_a_page_the_browser_can_draw(env, monkeypatch):
    """A fragment run drops the deltas of those fragments still queued from the run before (Streamlit's
    ForwardMsgQueue.clear); on a busy machine the first run's are often still queued. Whatever set of the Trace
    page's fragments runs then, what is left must still apply in order: the graph's fragment followed by the extras
    in one container blanked the page (app/trace_panels.trace_page)."""
    from itertools import combinations

    from streamlit.testing.v1.local_script_runner import LocalScriptRunner

    sent: list = []
    queued = LocalScriptRunner.forward_msgs
    monkeypatch.setattr(LocalScriptRunner, "forward_msgs", lambda self: sent.append(list(queued(self))) or queued(self))
    env.open().run()  # a full run of the Trace page with a trace open
    deltas = [(tuple(m.metadata.delta_path), m.delta.fragment_id) for m in sent[-1] if m.WhichOneof("type") == "delta"]
    fragments = sorted({f for _, f in deltas if f})
    assert len(fragments) == 4  # view, plot, graph, extras (app/switchboard.py FRAGMENTS)
    assert _applies_in_order([p for p, _ in deltas])
    for n in range(1, len(fragments) + 1):
        for dropped in combinations(fragments, n):
            assert _applies_in_order([p for p, f in deltas if f not in dropped]), dropped


def test_a_fan_on_a_trace_with_a_tree_sits_side_by_side(env):
    """Defect D1 (audit 31): on a trace that already had a branch, the side-by-side multiselect kept its old
    empty value and the graph panel overwrote the fan's columns with it: no columns after the fan."""
    from app.branch_panels import COLS_KEY

    at = env.open()
    parent = at.session_state["trace_key"]
    _branch_from(at, 2)
    at.button(key="takeover_reason").click().run()  # a first child: the branch tree (and its multiselect) is drawn
    at.button(key="close_compare").click().run()
    _ok(at)
    assert at.multiselect(key=f"cmp_pick_{parent}").value == []
    at.number_input(key="fan_n").set_value(2).run()
    at.button(key="fan_go").click().run()
    _ok(at)
    picked = at.session_state[COLS_KEY]
    assert picked["parent"] == parent and len(picked["keys"]) == 2
    assert at.multiselect(key=f"cmp_pick_{parent}").value == picked["keys"]
    heads = sum(str(h.proto.body).count("class='fp-cmp-head'") for h in at.get("html"))
    assert heads == 3  # the open trace and the two alternatives
    # the user's later choice in the multiselect still sets the columns
    at.multiselect(key=f"cmp_pick_{parent}").set_value(picked["keys"][:1]).run()
    _ok(at)
    assert at.session_state[COLS_KEY] == {"parent": parent, "keys": picked["keys"][:1]}
    assert sum(str(h.proto.body).count("class='fp-cmp-head'") for h in at.get("html")) == 2


def test_typed_text_of_one_token_reads_as_typed(env):
    """Audit 31 D5: one typed token read "⇄ #2 → ' x'" in the Switches list (and "forced" on its edge), and the
    selection panel said "emitted by forced"; a token chosen from the top-k keeps its own label."""
    from core import load_pair

    pair = load_pair(*env.argv[1:4:2], device="cpu")
    word = next(w for w in (" The", " the", " a", "a", "1", "=") if len(pair.encode(w)) == 1)
    at = env.open()
    at.session_state["switch_job"] = {"pos": 2, "text": word}
    at.run()
    _ok(at)
    typed = TraceStore(env.store).get(at.session_state["trace_key"])
    assert typed.meta["typed"] == {"2": 1}
    shown = [t.label for t in at.toggle if (t.key or "").startswith(f"sw_{typed.key}_")]
    assert shown == [f"✎ #2 {typed.tokens[2]!r}"]
    at.session_state["sel_pos"] = 2
    at.run()
    assert any("**Token #2** · typed by you" == t for t in _texts(at.markdown))
    # a token chosen from the top-k (one id) after it: a forced token, with its own row
    chosen = next(int(i) for i in typed.topk["base"][0][4] if int(i) != int(typed.token_ids[4]))
    at.session_state["switch_job"] = {"pos": 4, "token": chosen}
    at.run()
    _ok(at)
    child = TraceStore(env.store).get(at.session_state["trace_key"])
    assert child.meta["typed"] == {"2": 1}  # the typed token before it stays typed
    shown = [t.label for t in at.toggle if (t.key or "").startswith(f"sw_{child.key}_")]
    assert shown == [f"✎ #2 {child.tokens[2]!r}", f"⇄ #4 → {child.tokens[4]!r}"]
    at.session_state["sel_pos"] = 4
    at.run()
    assert any("**Token #4** · forced by you" == t for t in _texts(at.markdown))


def test_a_fan_drawn_again_says_its_samples_were_stored_already_and_its_edges_differ(env):
    """Audit 31: a second fan from the same token (the same seeded samples) said "2 alternatives ... stored"
    with no new file; and every sample's edge in the branch graph read like the greedy flip's."""
    from app.branch_panels import COLS_KEY

    at = env.open()
    parent = at.session_state["trace_key"]
    _branch_from(at, 2)
    at.button(key="takeover_reason").click().run()  # the greedy flip at #2: a sibling of the samples
    at.number_input(key="fan_n").set_value(2).run()
    at.button(key="fan_go").click().run()
    _ok(at)
    assert any("2 alternatives from token #2 stored: side by side" in t for t in _texts(at.success))
    files = sorted(p.name for p in Path(env.store).rglob("*") if p.is_file())
    at.button(key="fan_go").click().run()
    _ok(at)
    assert sorted(p.name for p in Path(env.store).rglob("*") if p.is_file()) == files  # nothing new written
    assert any("2 alternatives from token #2, all already stored" in t for t in _texts(at.success))
    kids = at.session_state[COLS_KEY]["keys"]
    figs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    fig = next(f for f in figs if any(d.get("name") in ("correct", "wrong", "ungraded") for d in f["data"]))
    edges = [t for d in fig["data"] if d.get("mode") == "text" for t in d.get("hovertext", [])]
    shown = [t for d in fig["data"] if d.get("mode") == "text" for t in d.get("text", [])]
    assert len(edges) == 3 and len(set(edges)) == 3 and len(set(shown)) == 3, edges  # greedy flip + 2 samples
    assert sorted(t.rsplit(" · ", 1)[1] for t in edges) == ["greedy", "sample 1", "sample 2"], edges
    assert at.session_state[COLS_KEY] == {"parent": parent, "keys": kids} and len(kids) == 2
