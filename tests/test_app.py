"""Page logic through `streamlit.testing.v1.AppTest`: first view, selection, takeover, URL state, pages,
and core errors shown as messages (never tracebacks). Runs the real app on a tiny in-process pair."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.downloads import export_file_bytes
from core.io.exports import read_jsonl
from core.io.store import TraceStore

MAIN = Path(__file__).resolve().parents[1] / "app" / "main.py"
PROBLEMS = [
    {"id": "p1", "question": "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left?", "answer": "10"},
    {"id": "p2", "question": "What is 5 + 7?", "answer": "12"},
]
TIMEOUT = 180


@pytest.fixture()
def env(tmp_path, tiny_dirs, monkeypatch):
    """App arguments for a tiny pair, a fresh store and a two-problem file (sys.argv is what the app parses)."""
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    store = tmp_path / "store"
    argv = ["--base", str(tiny_dirs["qwen_base"]), "--reason", str(tiny_dirs["qwen_reason"]), "--store", str(store),
            "--problems", str(problems), "--max-new-tokens", "12", "--device", "cpu", "--dtype", "float32"]

    def start(*extra: str, args: list[str] | None = None) -> AppTest:
        monkeypatch.setattr(sys, "argv", [str(MAIN), *(argv if args is None else args), *extra])
        return AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)

    return type("Env", (), {"start": staticmethod(start), "store": store, "problems": problems, "argv": argv})


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _texts(elements) -> list[str]:
    return [str(e.value) for e in elements]


def test_first_view_generates_and_opens_a_trace(env):
    at = env.start().run()
    _ok(at)
    key = at.session_state["trace_key"]
    store = TraceStore(env.store)
    assert len(store.keys()) == len(PROBLEMS) and key in store.keys()  # one batch over the first problems
    trace = store.get(key)
    assert trace.meta["correct"] is False  # the first view shows a problem the base model gets wrong
    assert trace.meta["problem"]["id"] == "p1" and trace.meta["problem"]["gold"] == "10"
    assert trace.meta["correct"] is not None  # graded against the gold answer
    assert any("Problem `p1`" in t for t in _texts(at.markdown))
    assert {m.label: m.value for m in at.metric}["Tokens"] == str(len(trace))
    assert at.query_params["trace"] == key and at.query_params["problem"] == "p1"
    assert _texts(at.info) and "Click a token" in _texts(at.info)[0]


def test_select_token_take_over_and_see_the_branch(env):
    at = env.start().run()
    parent = at.session_state["trace_key"]
    at.session_state["sel_pos"] = 2
    at.run()
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
    tree = next(r for r in at.radio if r.key and r.key.startswith("tree_"))  # the branch tree lists both
    assert len(tree.options) == 2 and "branch @ 2" in tree.options[1] and "← open" in tree.options[1]


def test_force_a_token_from_the_top_k(env):
    at = env.start().run()
    parent = TraceStore(env.store).get(at.session_state["trace_key"])
    at.session_state["sel_pos"] = 3
    at.run()
    pick = next(s for s in at.selectbox if s.key and s.key.startswith("takeover_pick_"))
    pick.set_value(pick.options.index(pick.options[-1]) + 1).run()  # the last alternative (options are labels)
    at.button(key="takeover_token").click().run()
    _ok(at)
    child = TraceStore(env.store).get(at.session_state["compare"]["child"])
    assert child.source[3] == "forced"
    offered = set(parent.topk["base"][0][3].tolist()) | set(parent.topk["reason"][0][3].tolist())
    assert int(child.token_ids[3]) in offered


def test_a_copied_link_opens_the_same_view(env):
    first = env.start().run()
    key = first.session_state["trace_key"]
    at = env.start()
    at.query_params["trace"] = key
    at.query_params["pos"] = "4"
    at.run()
    _ok(at)
    assert at.session_state["trace_key"] == key and at.session_state["sel_pos"] == 4
    assert any("Token #4" in t for t in _texts(at.markdown))


def test_unknown_trace_in_the_url_is_a_warning(env):
    at = env.start()
    at.query_params["trace"] = "deadbeef"
    at.run()
    assert not at.exception
    assert any("not in the store" in t for t in _texts(at.warning))


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
    at = env.start().run()
    at.switch_page("screens/problems.py").run()
    _ok(at)
    traces, problems = at.dataframe[0].value, at.dataframe[1].value
    assert len(traces) == 2 and at.session_state["trace_key"] in set(traces["key"])
    assert list(problems["id"]) == ["p1", "p2"] and list(problems["traces"]) == [1, 1]
    assert list(problems["share correct"]) == [0.0, 0.0]
    at.text_input(key="pf_text").input("no such problem").run()
    assert len(at.dataframe[0].value) == 0


def test_generate_page_runs_a_policy_and_stores_graded_traces(env):
    at = env.start().run()
    at.switch_page("screens/generate.py").run()
    _ok(at)
    at.radio(key="gen_mode").set_value("first N").run()
    at.number_input(key="gen_n").set_value(2).run()
    at.selectbox(key="gen_policy").set_value("entropy_gated").run()
    at.number_input(key="gen_threshold").set_value(0.0).run()
    at.button(key="gen_run").click().run()
    _ok(at)
    assert any("2 trace(s) stored" in t for t in _texts(at.success))
    rows = TraceStore(env.store).summaries()
    gated = rows[rows["policy"] == "entropy_gated"]
    assert sorted(gated["problem"]) == ["p1", "p2"] and (gated["n_takeovers"] > 0).all()
    assert gated["correct"].notna().all()


def test_export_page_offers_the_open_trace(env, tmp_path):
    at = env.start().run()
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
    assert read_jsonl(path) == [trace]


def test_dataset_page_draws_the_analyses(env):
    at = env.start().run()
    at.switch_page("screens/dataset.py").run()
    assert not at.exception and not at.error
    assert len(at.get("plotly_chart")) >= 4


def test_gate_spike_rule_calibrates_on_base_rollouts(env):
    at = env.start().run()
    at.radio(key="spike_kind").set_value("gate").run()
    _ok(at)
    assert not at.sidebar.warning, [w.value for w in at.sidebar.warning]
    assert any("τ =" in t for t in _texts(at.sidebar.caption))
    assert at.metric[3].label.startswith("Spikes (gate")


def test_score_metric_from_the_sidebar_drives_the_table(env):
    at = env.start().run()
    at.selectbox(key="score").set_value("jsd").run()
    _ok(at)
    at.switch_page("screens/problems.py").run()
    row = at.dataframe[0].value.iloc[0]
    trace = TraceStore(env.store).get(row["key"])
    assert row["max"] == pytest.approx(float(max(trace.metrics["jsd"])))


def test_loading_a_bad_pair_from_the_sidebar_is_a_message(env, tmp_path):
    at = env.start().run()
    at.text_input(key="pair_base").input(str(tmp_path / "missing-model")).run()
    at.button(key="pair_load").click().run()
    assert not at.exception
    assert any("Could not load the model pair" in t and "missing-model" in t for t in _texts(at.error))


def test_vocabulary_mismatch_is_a_message(env, tmp_path, tiny_dirs):
    from core.demo.tiny import build_tiny_model, train_tokenizer

    other = build_tiny_model(tmp_path / "other_vocab", train_tokenizer(vocab_size=300), "qwen3", seed=5, hidden=32,
                             layers=1)
    args = ["--base", str(tiny_dirs["qwen_base"]), "--reason", str(other), "--store", str(env.store),
            "--problems", str(env.problems)]
    at = env.start(args=args).run()
    assert not at.exception
    errors = " ".join(_texts(at.error))
    assert "Could not load the model pair" in errors and "tokenizers differ" in errors
    assert any("No trace open" in t for t in _texts(at.info))  # the page still works without a pair


def test_no_arguments_opens_a_demo_trace(env, tmp_path, monkeypatch):
    from core.demo.pair import DEMO_DIR

    if not (DEMO_DIR / "pair.json").exists():
        pytest.skip("the bundled demo pair is not built (forkpoint demo train)")
    monkeypatch.setenv("FORKPOINT_STORE", str(tmp_path / "demo_store"))
    at = env.start(args=[]).run()
    _ok(at)
    trace = TraceStore(tmp_path / "demo_store").get(at.session_state["trace_key"])
    assert str(trace.meta["problem"]["id"]).startswith("demo")
    assert at.metric[3].label.startswith("Spikes") and int(at.metric[3].value) >= 1
    assert trace.meta["correct"] is not None
