"""The CLI through click's runner: exit codes, parsed output, and what lands in the store."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from core.cli import main
from core.io.store import TraceStore
from core.views.exports import read_jsonl

PROBLEMS = [
    {"id": "p1", "question": "Tom has 3 boxes of 4 apples. He gives away 2. How many are left?", "answer": "10"},
    {"id": "p2", "question": "What is 5 + 7?", "answer": "12"},
    {"id": "p3", "question": "Ann has 9 pens and finds 3 more. How many pens?", "answer": "12"},
    {"id": "p4", "question": "What is 6 * 2?", "answer": "12"},
]


@pytest.fixture()
def env(tmp_path, tiny_dirs):
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    pair = ["--base", str(tiny_dirs["qwen_base"]), "--reason", str(tiny_dirs["qwen_reason"]), "--device", "cpu"]
    return {"pair": pair, "store": str(tmp_path / "store"), "problems": str(problems), "tmp": tmp_path}


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_score_prints_the_top_tokens_and_stores(env):
    out = run("score", *env["pair"], "--store", env["store"], "--prompt", "What is 2+3?",
              "--response", "2+3 = 5. The answer is 5.", "--top", "3")
    lines = out.strip().splitlines()
    assert lines[0].split()[:3] == ["pos", "token", "cross_entropy"]
    ce = [float(line.split()[-4]) for line in lines[1:4]]
    assert ce == sorted(ce, reverse=True)
    assert len(TraceStore(env["store"]).keys()) == 1


def test_generate_ls_export_analyze(env):
    run("generate", *env["pair"], "--store", env["store"], "--problems", env["problems"], "--policy", "early_only",
        "--rate", "0.25", "--max-new-tokens", "8")
    store = TraceStore(env["store"])
    assert len(store.keys()) == len(PROBLEMS)
    traces = [store.get(k) for k in store.keys()]
    assert all(t.meta["policy"]["name"] == "early_only" for t in traces)
    assert all(list(t.source[:2]) == ["reason", "reason"] for t in traces)  # ceil(0.25 * 8) = 2 early takeovers
    assert all(t.meta["correct"] is not None for t in traces)  # graded against the problems' answers

    table = pd.read_csv(__import__("io").StringIO(run("ls", "--store", env["store"], "--csv")))
    assert len(table) == len(PROBLEMS) and set(table["policy"]) == {"early_only"}

    out = env["tmp"] / "all.jsonl"
    run("export", "--store", env["store"], "--format", "jsonl", "--out", str(out))
    assert sorted(t.key for t in read_jsonl(out)) == sorted(store.keys())
    # without --format the suffix decides (a .csv is a CSV, not JSONL); no suffix is a message
    run("export", "--store", env["store"], "--out", str(env["tmp"] / "all.csv"))
    assert pd.read_csv(env["tmp"] / "all.csv")["trace_key"].nunique() == len(PROBLEMS)
    bare = CliRunner().invoke(main, ["export", "--store", env["store"], "--out", str(env["tmp"] / "all")])
    assert bare.exit_code != 0 and "Cannot tell the export format" in bare.output and "--format" in bare.output
    assert "format=" not in bare.output  # the CLI's own word for it (issue 22: "give format= (CLI: --format)")
    again = CliRunner().invoke(main, ["export", "--store", env["store"], "--out", str(out)])
    assert again.exit_code != 0 and "--overwrite" in again.output and "Traceback" not in again.output

    html = env["tmp"] / "report"
    run("analyze", "--store", env["store"], "--out", str(html))
    text = (html / "report.html").read_text()
    assert "<script src=" not in text and "Plotly" in text


def test_calibrate_prints_a_gate_and_generate_guided_uses_it(env):
    gate = json.loads(run("calibrate", *env["pair"], "--store", env["store"], "--problems", env["problems"],
                          "--ratio", "0.2", "--max-new-tokens", "8").strip().splitlines()[-1])
    assert gate["lam"] > 0 and gate["window"] == 16
    run("generate", *env["pair"], "--store", env["store"], "--prompt", "What is 5 + 7?", "--policy", "guided",
        "--tau", str(gate["tau"]), "--lam", str(gate["lam"]), "--budget", "0.2", "--max-new-tokens", "8")
    store = TraceStore(env["store"])
    guided = [store.get(k) for k in store.keys() if store.get(k).meta["policy"]["name"] == "guided"]
    assert len(guided) == 1 and guided[0].meta["policy"]["params"]["tau"] == pytest.approx(gate["tau"])


def test_import_reports_bad_lines_and_scores_the_rest(env):
    src = env["tmp"] / "foreign.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt": "What is 2+3?", "response": "5"}) + "\n" + "{not json\n")
    out = json.loads(run("import", *env["pair"], "--store", env["store"], str(src)).strip().splitlines()[-1])
    assert out["stored"] == 1 and out["errors"][0]["line"] == 2


def test_eval_table_has_every_policy(env):
    out = env["tmp"] / "eval.csv"
    text = run("eval", *env["pair"], "--store", env["store"], "--problems", env["problems"], "--ratios", "0.2",
               "--max-new-tokens", "6", "--out", str(out))
    table = pd.read_csv(out)
    assert {"base", "reason", "guided (r=0.2)"} <= set(table["policy"])
    assert "| policy |" in text and out.with_suffix(".html").exists()


def test_user_errors_are_messages_not_tracebacks(env, tmp_path):
    result = CliRunner().invoke(main, ["score", "--base", str(tmp_path / "nope"), "--reason", str(tmp_path / "nope"),
                                       "--prompt", "x", "--response", "y"])
    assert result.exit_code != 0 and "does not exist" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["score", "--base", "x", "--prompt", "x", "--response", "y"])
    assert result.exit_code == 2 and "both --base and --reason" in result.output


# -- policies from the registry (H1) ------------------------------------------------------------------


def test_generate_guided_honours_score_budget_and_calibration(env):
    """--score reaches both the calibration and the policy; without --tau the gate is calibrated on the problems."""
    run("generate", *env["pair"], "--store", env["store"], "--problems", env["problems"], "--policy", "guided",
        "--score", "jsd", "--ratio", "0.3", "--calibration-problems", "2", "--budget", "0.25", "--max-new-tokens", "8")
    store = TraceStore(env["store"])
    traces = [store.get(k) for k in store.keys()]
    guided = [t for t in traces if t.meta["policy"]["name"] == "guided"]
    base = [t for t in traces if t.meta["policy"]["name"] == "base_only"]
    assert len(guided) == len(PROBLEMS) and len(base) == 2  # the calibration rollouts of the first 2 problems
    params = guided[0].meta["policy"]["params"]
    assert params["score"] == "jsd" and params["budget"] == 0.25 and params["max_takeovers"] is None
    from core.annotate.spikes import calibrate_gate
    from core.scoring.registry import score_values

    expect = calibrate_gate([score_values(t.metrics, "jsd") for t in base], 0.3, 16)
    assert params["tau"] == pytest.approx(expect.tau) and params["lam"] == pytest.approx(expect.lam)
    assert all(t.n_takeovers <= 2 for t in guided)  # ceil(0.25 · 8)


def test_generate_says_when_a_policy_did_nothing(env):
    result = CliRunner().invoke(main, ["generate", *env["pair"], "--store", env["store"], "--prompt", "What is 5 + 7?",
                                       "--policy", "entropy_gated", "--threshold", "50", "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert "EntropyGated made 0 takeovers" in result.output and "threshold=50" in result.output
    assert "(0 takeovers)" in result.output


def test_score_ranks_delta_logp_by_its_sign(env):
    """As a score delta_logp is used negated: the top rows are the most negative log-prob gains."""
    out = run("score", *env["pair"], "--prompt", "What is 2+3?", "--response", "2+3 = 5. The answer is 5.",
              "--top", "4", "--score", "delta_logp")
    lines = out.strip().splitlines()
    assert lines[0].split()[2] == "delta_logp"
    values = [float(line.split()[-4]) for line in lines[1:5]]  # columns from the right: tokens may hold spaces
    assert len(values) == 4 and values == sorted(values)  # ascending raw value = descending score


_MODULES_AFTER = ("import json, sys; from core.cli import main\n"
                  "try:\n    main(sys.argv[1:], standalone_mode=False)\nfinally:\n"
                  "    print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'})))")


def test_file_only_commands_start_without_the_model_stack(env):
    """`ls` and `export` read files: neither torch nor transformers may load (issue 22: 2-4 s of imports)."""
    import subprocess
    import sys

    run("score", *env["pair"], "--store", env["store"], "--prompt", "What is 2+3?", "--response", "2+3 = 5.")
    for args in (["ls", "--store", env["store"]],
                 ["export", "--store", env["store"], "--out", str(env["tmp"] / "one.jsonl")],
                 ["export", "--store", env["store"], "--out", str(env["tmp"] / "one.html")]):
        out = subprocess.run([sys.executable, "-c", _MODULES_AFTER, *args], capture_output=True, text=True,
                             timeout=300, check=True)
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [], (args, out.stdout[-500:])
    assert len(read_jsonl(env["tmp"] / "one.jsonl")) == 1


def test_export_token_strings_match_the_tokenizer(env, tiny_dirs):
    """Without transformers the export decodes top-k ids exactly as AutoTokenizer does."""
    from transformers import AutoTokenizer

    from core.views.exports import token_decoder

    run("score", *env["pair"], "--store", env["store"], "--prompt", "What is 2+3?", "--response", "2+3 = 5. ✓ é")
    store = TraceStore(env["store"])
    trace = store.get(store.keys()[0])
    decode = token_decoder([trace])
    tok = AutoTokenizer.from_pretrained(str(tiny_dirs["qwen_base"]))
    ids = sorted(set(trace.token_ids.tolist()) | set(range(0, min(tok.vocab_size, 300))))
    assert [decode(i) for i in ids] == [tok.decode([i], skip_special_tokens=False,
                                                   clean_up_tokenization_spaces=False) for i in ids]


def test_search_finds_a_string_in_every_trace(env):
    run("score", *env["pair"], "--store", env["store"], "--prompt", "What is 2+3?", "--response", "2+3 = 5. So 5.")
    run("score", *env["pair"], "--store", env["store"], "--prompt", "What is 1+4?", "--response", "It is 5.")
    table = pd.read_csv(__import__("io").StringIO(run("search", "5", "--store", env["store"], "--csv")))
    assert table["key"].nunique() == 2 and len(table) == 3
    assert {"pos", "score", "spike", "correct"} <= set(table.columns)
    out = run("search", r"\d\.", "--regex", "--store", env["store"])
    assert "3 matches in 2 of 2 traces" in out
    bad = CliRunner().invoke(main, ["search", "(", "--regex", "--store", env["store"]])
    assert bad.exit_code != 0 and "not a valid regular expression" in bad.output and "Traceback" not in bad.output
