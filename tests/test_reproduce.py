"""`reproduce` (core.reports.reproduce, `forkpoint reproduce`): the paper's protocol end to end on the demo
pair, the paper-style table's averages and recovery reference, sampling presets, calibration hold-out,
and `forkpoint analyze --overwrite`."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from click.testing import CliRunner

from core import settings
from core.reports.paper import AVERAGE, paper_table
from core.cli import main
from core.demo.pair import DEMO_DIR, demo_formats, demo_pair, demo_problems
from core.evaluation import harness as ev
from core.reports.reproduce import reproduce, resolve_sampling, split_calibration
from core.io.store import TraceStore

# -- pure parts ------------------------------------------------------------------------------------------


def test_sampling_preset_and_overrides():
    assert resolve_sampling() == {n: settings.SETTINGS[n].value for n in ("samples", "temperature", "top_p",
                                                                           "max_new_tokens")}
    paper = resolve_sampling("paper")
    assert paper == {"samples": 8, "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 16384}
    assert resolve_sampling("paper", max_new_tokens=64, samples=None)["max_new_tokens"] == 64
    assert resolve_sampling("paper", max_new_tokens=64)["samples"] == 8


def test_calibration_is_held_out_across_benchmarks():
    benches = {"a": list(range(40)), "b": list(range(100, 108)), "c": [7]}
    calib, rest = split_calibration(benches, 9)
    assert calib == [0, 1, 2, 100, 101]  # 3 per benchmark, at most a quarter of each, none from a singleton
    assert rest == {"a": list(range(3, 40)), "b": list(range(102, 108)), "c": [7]}
    assert not set(calib) & {x for xs in rest.values() for x in xs}


def test_given_calibration_sources_give_their_first_calibration_problems(tmp_path):
    """`reproduce --calibration SOURCE` used every problem of SOURCE while `generate` used the first
    --calibration-problems: now the setting is the one count, its problems spread over the given sources."""
    from core.reports.reproduce import first_calibration

    for name, n in (("a", 10), ("b", 3)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"id": f"{name}{i}", "question": f"q {name}{i}?",
                                                                    "answer": "1"}) + "\n" for i in range(n)))
    a, b = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    assert [p.id for p in first_calibration([a], 4)] == ["a0", "a1", "a2", "a3"]
    assert [p.id for p in first_calibration([a, b], 5)] == ["a0", "a1", "a2", "b0", "b1", "b2"]  # ⌈5 / 2⌉ each
    assert [p.id for p in first_calibration([b], 32)] == ["b0", "b1", "b2"]  # a smaller set: all of it

    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["reproduce", "--device", "cpu", "--problems",
                                       f"demo={DEMO_DIR.parent / 'problems' / 'demo_test.jsonl'}", "--limit", "4",
                                       "--calibration", a, "--calibration-problems", "3", "--max-new-tokens", "8",
                                       "--samples", "1", "--ratios", "0.2", "--no-baselines", "--no-entropy-gated",
                                       "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "run.json").read_text())["calibration_problems"] == ["a0", "a1", "a2"]


def _sweep_rows():
    rows = []
    for bench, (b, g, r, t) in {"x": (0.2, 0.5, 0.9, 0.6), "y": (0.4, 0.5, 1.0, 0.8)}.items():
        for policy, config, pk, rho in (("base", "base", b, 0.0), ("guided", "r=0.05", g, 0.1),
                                        ("reason", "reason", r, 1.0), ("thinking", "thinking", t, 0.0)):
            rows.append({"benchmark": bench, "policy": policy, "config": config, "accuracy": pk / 2, "pass@k": pk,
                         "rho": rho, "mean_tokens": 10.0, "k": 2, "reference": "policy thinking"})
    return pd.DataFrame(rows)


def test_paper_table_average_and_recovery_from_averages():
    table = paper_table(_sweep_rows()).set_index(["benchmark", "setting"])
    # per benchmark: (0.5 - 0.2) / (0.6 - 0.2) and (0.5 - 0.4) / (0.8 - 0.4)
    assert table.loc[("x", "guided r=0.05"), "recovery@k"] == pytest.approx(0.75)
    assert table.loc[("y", "guided r=0.05"), "recovery@k"] == pytest.approx(0.25)
    # the average row: recovery of the averages (as the paper's 91%), not the average of recoveries
    avg = table.loc[AVERAGE]
    assert avg.loc["guided r=0.05", "pass@k"] == pytest.approx(0.5)
    assert avg.loc["guided r=0.05", "recovery@k"] == pytest.approx((0.5 - 0.3) / (0.7 - 0.3))
    assert avg.loc["same-size thinking model", "recovery@k"] == pytest.approx(1.0)
    assert avg.loc["base alone", "recovery@k"] == 0.0
    assert set(table["reference"]) == {"policy thinking"}


def test_recovery_against_given_numbers():
    records = pd.DataFrame(
        [["x", "base", "p0", 0, s, ok, 10, 0, None, "boxed"] for s, ok in enumerate((True, False))]
        + [["x", "guided", "p0", 0, s, True, 10, 1, None, "phrase"] for s in range(2)],
        columns=list(ev.RECORD_COLUMNS))
    # base: acc 0.5, pass@2 1.0 -> a reference Pass@k of 1.0 has no gap: NaN; per-benchmark numbers
    table = ev.policy_table(records, reference={"x": {"accuracy": 0.75, "pass@k": 1.0}}).set_index("policy")
    assert table.loc["guided", "recovery"] == pytest.approx((1.0 - 0.5) / (0.75 - 0.5))
    assert math.isnan(table.loc["guided", "recovery@k"])
    assert table.loc["guided", "reference"] == "given numbers"
    one = ev.policy_table(records, k=1, reference=0.9).set_index("policy")
    assert one.loc["guided", "recovery@k"] == pytest.approx((1.0 - 0.5) / (0.9 - 0.5))
    assert math.isnan(one.loc["guided", "recovery"]) and one.loc["guided", "reference"] == "given Pass@k"
    with pytest.raises(ev.InvalidInputError, match="Pass@k in \\[0, 1\\]"):
        ev.policy_table(records, reference=64.1)


# -- end to end on the demo pair ------------------------------------------------------------------------


@pytest.mark.slow
def test_reproduce_end_to_end_on_the_demo_pair(tmp_path, caplog):
    from core.evaluation.thinking import load_thinking

    pair = demo_pair()
    # the demo has no separate same-size thinking model: its reasoner, loaded again, stands in for it
    thinking = load_thinking(pair, str(DEMO_DIR / "reason"), demo_formats()["reason_format"])
    # three problems per benchmark (two samples each): every claim below is structural (which rows, which files,
    # matched ρ equal to Guided's realised one, every analysis per benchmark and pooled, a resumed run generating
    # nothing), so six problems check it as well as ten did, at 60% of the decoding
    tests = demo_problems("test", limit=6)
    problems = {"first": tests[:3], "second": tests[3:]}
    seen = []
    kwargs = dict(thinking=thinking, calibration=demo_problems("calib", limit=4), ratios=(0.05, 0.3), samples=2,
                  temperature=0.6, top_p=0.95, max_new_tokens=64, batch_size=10)
    with caplog.at_level("WARNING"):
        result = reproduce(pair, None, problems, tmp_path / "out", progress=lambda *a: seen.append(a), **kwargs)
    assert "recovery skipped" not in caplog.text  # the run's recovery is its own table, not the stored-policy one
    assert result.report == tmp_path / "out" / "report.html" and result.report.exists()
    for name in ("table.csv", "sweep.csv", "run.json", "analysis/gini.csv", "analysis/position_density.csv",
                 "analysis/entropy_iou.csv", "analysis/failure_auroc.csv", "analysis/reason_rank_all.csv"):
        assert (tmp_path / "out" / name).exists(), name
    table = result.table
    assert set(table["benchmark"]) == {"first", "second", AVERAGE}
    settings_ = set(table["setting"])
    assert {"base alone", "guide (reasoner alone)", "same-size thinking model", "guided r=0.05",
            "guided r=0.3"} <= settings_
    assert set(table["reference"]) == {"policy thinking"}
    assert "same-size thinking model" in result.info["reference"] and str(DEMO_DIR / "reason") in result.info["reference"]
    # the thinking row is the reference: recovery 1 wherever it beats the base
    for _, row in table[table["setting"] == "same-size thinking model"].iterrows():
        base = table[(table["benchmark"] == row["benchmark"]) & (table["setting"] == "base alone")].iloc[0]
        assert math.isnan(row["recovery@k"]) if row["pass@k"] <= base["pass@k"] else row["recovery@k"] == pytest.approx(1)
    # baselines sit at the ρ Guided realised on each benchmark
    sweep = result.sweep
    for (bench, config), g in sweep[sweep["config"].str.startswith("r=")].groupby(["benchmark", "config"]):
        guided = g[g["policy"] == "guided"].iloc[0]
        for _, other in g[~g["policy"].isin(["guided", "entropy_gated"])].iterrows():
            assert other["matched_rho"] == pytest.approx(guided["rho"])
        assert "entropy_gated" in set(g["policy"])  # the cheap variant, beside Guided at each r
    # the paper's fixed-rate baselines, both rows in the table, per benchmark
    assert {"random positions, ρ = 0.25", "early only, ρ = 0.25", "entropy-gated r=0.05",
            "random positions (ρ of guided r=0.05)"} <= settings_
    # every analysis has a benchmark column: each benchmark and the pooled "all"
    for name in ("gini", "failure_auroc", "entropy_iou", "position_summary", "lorenz"):
        assert set(result.analyses[name]["benchmark"]) == {"first", "second", "all"}, name
    assert pd.read_csv(tmp_path / "out" / "analysis" / "failure_auroc.csv")["benchmark"].nunique() == 3
    html = result.report.read_text()
    assert "<script src=" not in html and html.count("Plotly.newPlot") >= 6 and "same-size thinking model" in html
    assert "Headline analyses" in html and "paper average" in html
    assert {s for s, *_ in seen} >= {"base and guide", "thinking", "guided r=0.05 (first)",
                                     "baselines at ρ of r=0.3 (second)"}
    # resumable: the same call again generates nothing and gives the same table
    store = TraceStore(tmp_path / "out" / "store")
    before = sorted(store.keys())
    again = reproduce(pair, None, problems, tmp_path / "out", **kwargs)
    assert sorted(store.keys()) == before
    pd.testing.assert_frame_equal(again.table, result.table)
    info = json.loads((tmp_path / "out" / "run.json").read_text())
    assert info["sampling"] == {"samples": 2, "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 64}


@pytest.mark.slow
def test_reproduce_command_on_the_demo_pair(tmp_path):
    problems = tmp_path / "p.jsonl"
    problems.write_text("".join(json.dumps({"id": p.id, "question": p.prompt, "answer": p.gold}) + "\n"
                                for p in demo_problems("test", limit=8)))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["reproduce", "--device", "cpu", "--problems", f"demo={problems}",
                                       "--out", str(out), "--ratios", "0.2", "--budgets", "none,0.05",
                                       "--max-new-tokens", "24", "--calibration-problems", "2", "--reference", "0.9"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"report -> {out / 'report.html'}" in result.output and "recovery against: given numbers" in result.output
    table = pd.read_csv(out / "table.csv")
    assert {"guided r=0.2", "guided r=0.2 cap=0.05"} <= set(table["setting"])
    store = TraceStore(out / "store")
    capped = [t for t in store.load_all()[0] if t.meta["policy"]["name"] == "guided"
              and t.meta["policy"]["params"]["budget"] == 0.05]
    assert len(capped) == 6  # 8 problems, 2 held out for calibration
    assert all(t.n_takeovers <= math.ceil(0.05 * 24) for t in capped)  # the cap holds: ≤ 2 of 24 tokens


def test_analyze_twice_needs_overwrite(tmp_path, qwen_pair):
    import core

    store = TraceStore(tmp_path / "store")
    core.score(qwen_pair, "2+2?", " 4", store=store)
    args = ["analyze", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "rep")]
    assert CliRunner().invoke(main, args).exit_code == 0
    second = CliRunner().invoke(main, args)
    assert second.exit_code != 0 and "--overwrite" in second.output and "overwrite=True" not in second.output
    assert CliRunner().invoke(main, args + ["--overwrite"]).exit_code == 0


def test_demo_measure_command_exists_as_the_card_says():
    import inspect

    from core.reports.demo_card import write_card

    assert inspect.signature(write_card).parameters["command"].default == "forkpoint demo measure"
    result = CliRunner().invoke(main, ["demo", "measure", "--help"])
    assert result.exit_code == 0 and "CARD.md" in result.output


def test_headline_picks_this_runs_values():
    from core.reports.paper import headline

    density = pd.DataFrame({"bin_left": [0.0], "bin_right": [1.0], "count": [1], "density": [1.0], "uniform": [1.0]})
    density.attrs["median_u"] = 0.07
    analyses = {
        "gini": pd.DataFrame({"trace": ["t1", "t2", "pooled"], "n": [5, 5, 10], "gini": [0.5, 0.7, 0.93]}),
        "failure_auroc": pd.DataFrame({"signal": ["cross_entropy", "entropy_base"], "auroc": [0.84, 0.8]}),
        "reason_rank_within": pd.DataFrame({"at": ["all", "spikes", "spikes"], "k": [5, 1, 5],
                                            "share": [0.99, 0.5, 0.97], "n": [9, 9, 9]}),
        "position_density": density,
        "position_summary": pd.DataFrame({"n": [12], "median_u": [0.07], "peak_u": [0.025]}),
    }
    h = headline(analyses).set_index("finding")["this run"]
    assert h["Gini of the score, mean over responses"] == pytest.approx(0.6)  # the paper's ≈0.94 is this one
    assert h["Gini of the score, pooled over all tokens"] == 0.93
    assert h["failure AUROC, top-100 mean score"] == 0.84 and h["failure AUROC, top-100 mean base entropy"] == 0.8
    assert h["reasoner's top token within the base top-5 (spikes)"] == 0.97
    assert h["median position u = t/T of the top-1% tokens"] == 0.07
    assert h["position density peak of the top-1% tokens (bin centre u = t/T)"] == 0.025
    planning = [f for f in h.index if "enrichment" in f]
    assert len(planning) == 4 and all(math.isnan(h[f]) for f in planning)  # not computed: shown as missing


def test_headline_per_benchmark_with_the_papers_numbers_beside():
    from core.reports.paper import headline

    auroc = pd.DataFrame({"benchmark": ["gsm8k", "gsm8k", "math500", "math500", "all", "all"],
                          "signal": ["cross_entropy", "entropy_base"] * 3, "auroc": [0.9, 0.8, 0.7, 0.6, 0.75, 0.65]})
    enr = pd.DataFrame({"benchmark": ["all"] * 4, "set": ["top_score", "taken_over"] * 2,
                        "category": ["planning", "planning", "plan", "plan"], "enrichment": [5.5, 6.0, 12.9, 13.8]})
    h = headline({"failure_auroc": auroc, "enrichment": enr})
    rows = h[h["finding"] == "failure AUROC, top-100 mean score"].set_index("benchmark")
    assert rows["this run"].to_dict() == {"gsm8k": 0.9, "math500": 0.7, "all": 0.75}
    assert rows.loc["gsm8k", "paper"] == "0.851" and "not given" in rows.loc["math500", "paper"]
    ent = h[h["finding"] == "failure AUROC, top-100 mean base entropy"].set_index("benchmark")
    assert ent.loc["gsm8k", "paper"] == "0.817"
    by = h.set_index("finding")
    pooled = [f for f in by.index if f.startswith("planning enrichment among top-1%")][0]
    plan = [f for f in by.index if f.startswith("plan-only enrichment among tokens taken")][0]
    assert by.loc[pooled, "this run"] == 5.5 and by.loc[pooled, "paper"] == "≈ 7.5×" and "7.5×" in pooled
    assert by.loc[plan, "this run"] == 13.8 and by.loc[plan, "paper"] == "–"
    assert set(h["benchmark"]) == {"gsm8k", "math500", "all"}


def test_setting_labels_and_fixed_rho_rows():
    from core.reports.paper import setting_label

    assert setting_label({"policy": "entropy_gated", "config": "r=0.05"}) == "entropy-gated r=0.05"
    assert setting_label({"policy": "random_positions", "config": "ρ=0.25"}) == "random positions, ρ = 0.25"
    assert setting_label({"policy": "early_only", "config": "r=0.05"}) == "early only (ρ of guided r=0.05)"


def test_baseline_rhos_are_checked():
    from core.evaluation.sweep import check_baseline_rhos, matched_baselines

    assert check_baseline_rhos(["realised", "0.25", 0.25, "matched"]) == ["realised", 0.25]
    with pytest.raises(ev.InvalidInputError, match="baseline_rho"):
        check_baseline_rhos([1.5])
    with pytest.raises(ev.InvalidInputError, match="baseline_rho"):
        check_baseline_rhos(["half"])
    built = matched_baselines(0.25, 60.0, 96, 3, suffix="@0.25")
    assert built["random_positions@0.25"].rate == 0.25 and built["random_positions@0.25"].seed == 3
    assert built["early_only@0.25"].rate == ev.early_rate_for(0.25, 60.0, 96)


def test_calibration_holdout_and_the_first_token_advice_that_fits_the_pair():
    from types import SimpleNamespace

    from core.decoding.calibration import (
        first_token_advice,
        first_token_takeover_share,
        holdout,
    )
    from core.pair.formats import PromptFormat

    pool = [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(6)]
    calib, in_sample = holdout(pool, pool[:2], 3)
    assert [p["id"] for p in calib] == ["p2", "p3", "p4"] and not in_sample
    calib, in_sample = holdout(pool, pool, 3)
    assert [p["id"] for p in calib] == ["p0", "p1", "p2"] and in_sample  # nothing left to hold out: says so

    class Tok:
        def __init__(self, template, vocab=()):
            self.chat_template, self.vocab = template, {v: i for i, v in enumerate(vocab)}

        def get_vocab(self):
            return self.vocab

    def pair(spec, tok):
        return SimpleNamespace(formats={"reason": PromptFormat(spec)}, prompt_tokenizers={}, tokenizer=tok)

    thinking = Tok("{% if enable_thinking %}<think>{% endif %}")
    plain_chat = Tok("{{ messages }}", vocab=["a", "b"])
    assert "+think" in first_token_advice(pair("chat", thinking))
    no_think = first_token_advice(pair("chat", plain_chat))
    assert "no thinking mode" in no_think and "--skip-first" in no_think and "use a +think" not in no_think
    assert "already opens" in first_token_advice(pair("chat:think+think", thinking))
    assert "--skip-first" in first_token_advice(pair("Question: {problem}\nAnswer:", plain_chat))
    from core.trace import Trace

    counted = {"takeovers": Trace.takeovers, "n_takeovers": Trace.n_takeovers}  # the record's one count of takeovers
    traces = [type("T", (), {"source": ["reason", "base", "reason", "forced"], "__len__": lambda self: 4, **counted})()
              for _ in range(2)]
    assert first_token_takeover_share(traces) == pytest.approx(0.5)


# -- the report's defects found by an independent recomputation (issue 32) -----------------------------


def test_enrichment_groups_are_base_rollouts_with_guided_takeovers_pooled_too(qwen_pair):
    import core
    from core.reports.reproduce import enrichment_by_benchmark

    qs = ["What is 2+3?", "Tom has 3 boxes of 4 apples.", "How many are left?", "Ann has 9 pens."]
    benches = {"one": [{"id": "a", "question": qs[0], "answer": "5"}, {"id": "b", "question": qs[1], "answer": "12"}],
               "two": [{"id": "c", "question": qs[2], "answer": "1"}, {"id": "d", "question": qs[3], "answer": "9"}]}
    problems = [p for ps in benches.values() for p in ps]
    base = core.generate(qwen_pair, problems, max_new_tokens=16)
    guided = core.generate(qwen_pair, problems, core.EntropyGated(threshold=1.5), max_new_tokens=16)
    by_bench = {"one": base[:2], "two": base[2:]}
    table = enrichment_by_benchmark(by_bench, guided, benches, "cross_entropy")

    def size(bench, which):
        return int(table[(table["benchmark"] == bench) & (table["set"] == which)]["size"].iloc[0])

    taken = {"one": sum(t.n_takeovers for t in guided[:2]), "two": sum(t.n_takeovers for t in guided[2:])}
    assert taken["one"] and taken["two"]
    for name, n in (("one", taken["one"]), ("two", taken["two"]), ("all", taken["one"] + taken["two"])):
        assert size(name, "taken_over") == n  # the pooled group keeps Guided's takeovers
    for name, traces in (("one", base[:2]), ("two", base[2:]), ("all", base)):
        # "all tokens" are the base's own rollouts only, per benchmark as pooled
        assert size(name, "all") == sum(len(t) for t in traces)


def test_recovery_dash_says_why_and_the_partial_average_is_marked():
    from core.reports.paper import NO_GAP, paper_table_html

    rows = _sweep_rows()
    rows.loc[(rows["benchmark"] == "y") & (rows["policy"] == "thinking"), ["accuracy", "pass@k"]] = (0.1, 0.3)
    table = paper_table(rows)
    y = table[(table["benchmark"] == "y") & (table["setting"] == "guided r=0.05")].iloc[0]
    assert math.isnan(y["recovery@k"]) and y["no_gap"] == "accuracy,pass@k"
    x = table[(table["benchmark"] == "x") & (table["setting"] == "guided r=0.05")].iloc[0]
    assert x["no_gap"] == "" and x["recovery@k"] == pytest.approx(0.75)
    avg = table[(table["benchmark"] == AVERAGE) & (table["setting"] == "guided r=0.05")].iloc[0]
    assert avg["no_gap_in"] == "y" and not math.isnan(avg["recovery@k"])
    html = paper_table_html(table)
    assert "–†" in html and NO_GAP in html and "75.0%" in html
    assert "<th>recovery</th>" in html  # recovery on accuracy beside recovery@k
    assert "averaged over benchmarks that include y" in html and f"{100 * avg['recovery@k']:.1f}%*" in html


def test_identical_guided_configurations_are_marked(qwen_pair):
    import core
    from core.reports.reproduce import identical_configs

    problems = ["What is 2+3?", "How many are left?"]
    a = core.generate(qwen_pair, problems, core.Guided(tau=100.0, lam=1.0, window=4), max_new_tokens=8)
    b = core.generate(qwen_pair, problems, core.Guided(tau=200.0, lam=1.0, window=4), max_new_tokens=8)
    c = core.generate(qwen_pair, problems, core.Guided(tau=-1.0, lam=0.0, window=4, max_takeovers=1),
                      max_new_tokens=8)
    assert a[0].key != b[0].key  # other gates, other request keys: the same tokens all the same
    assert identical_configs({"r=0.01": a, "r=0.02": b, "r=0.3": c}) == {"r=0.02": "r=0.01"}


def test_exactly_matched_baselines_hit_a_rho_below_one_token_and_draw_their_own_positions(qwen_pair):
    import dataclasses

    import numpy as np

    import core
    from core.decoding.policies import Step, row_identity
    from core.evaluation.sweep import matched_baselines

    rho, mean_tokens, limit = 0.0083, 60.0, 96
    rough = matched_baselines(rho, mean_tokens, limit, 0)["early_only"]
    built = matched_baselines(rho, mean_tokens, limit, 0, exact=True)
    early = built["early_only"]
    rows = np.array([row_identity(f"p{i}", 0) for i in range(4000)], dtype=np.uint64)
    prefix = sum(early.takeover(Step(t=t, score=None, entropy_base=np.zeros(len(rows)), history=[[]] * len(rows),
                                     taken=np.zeros(len(rows), dtype=np.int64), limit=limit, rows=rows)).astype(int)
                 for t in range(3))
    assert prefix.mean() / mean_tokens == pytest.approx(rho, rel=0.05)  # ρ 0.0083, not one token's 0.0167
    assert math.ceil(rough.rate * limit - 1e-9) / mean_tokens == pytest.approx(1 / 60)  # the old rounding
    other = matched_baselines(0.02, mean_tokens, limit, 0, exact=True)
    assert built["random_positions"].seed != other["random_positions"].seed  # its own draws per ρ
    # on a run: the dithered early prefix realises the target on average
    pair = dataclasses.replace(qwen_pair, eos_ids=frozenset())
    prompts = [f"What is {i} + {i}?" for i in range(30)]
    runs = core.generate(pair, prompts, matched_baselines(0.05, 10.0, 10, 0, exact=True)["early_only"],
                         max_new_tokens=10)
    assert sum(t.n_takeovers for t in runs) / sum(len(t) for t in runs) == pytest.approx(0.05, abs=0.03)


def test_headline_labels_say_what_this_run_measured():
    from core.reports.paper import headline

    auroc = pd.DataFrame({"benchmark": ["all", "all", "gsm8k", "gsm8k", "math500", "math500"],
                          "signal": ["cross_entropy", "entropy_base"] * 3, "auroc": [0.75, 0.65, 0.9, 0.8, 0.7, 0.6]})
    enr = pd.DataFrame({"benchmark": ["all"] * 6, "set": ["top_score", "taken_over"] * 3,
                        "category": ["planning", "planning", "plan", "plan", "execute", "execute"],
                        "enrichment": [5.5, 6.0, 12.9, 13.8, 0.9, 0.8]})
    h = headline({"failure_auroc": auroc, "enrichment": enr})
    rows = h[h["finding"] == "failure AUROC, top-100 mean score"]
    assert list(rows["benchmark"]) == ["gsm8k", "math500", "all"]  # per benchmark first, the pooled row last
    pooled = rows.set_index("benchmark").loc["all", "paper"]
    assert pooled.startswith("– (pooled over benchmarks whose base rates differ") and "0.851" in pooled
    planning = [f for f in h["finding"] if f.startswith("planning enrichment among top-1%")][0]
    assert "(plan)" in planning and "reflect" not in planning and "verify" not in planning  # only what was tagged
    rank = h[h["finding"].str.startswith("reasoner's top token")]["paper"].iloc[0]
    assert "share of 1.0" in rank and "top 5" in rank
