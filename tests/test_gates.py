"""Gates on the base alone (top_prob, margin, the learned router), equal-ρ calibration of every gate, and
the gate shoot-out (core.compare_gates): each checked against an independent reading of the stored traces."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from spies import FeedLog

import core
from core.decoding.policies import Margin, TopProb, list_policies, make_policy

PROMPTS = ["What is 2+3?", "Tom has 3 boxes of 4 apples. He gives away 2. How many apples are left?", "x"]


def _top(trace: core.Trace) -> np.ndarray:
    return np.asarray(trace.topk["base"][1], dtype=np.float64)[:, :2]


@pytest.mark.parametrize("name, rule", [
    ("top_prob", lambda top, knob: top[:, 0] < knob),
    ("margin", lambda top, knob: top[:, 0] - top[:, 1] < knob),
])
def test_base_only_gates_fire_exactly_where_their_rule_holds(qwen_pair, name, rule) -> None:
    base = core.generate(qwen_pair, PROMPTS, max_new_tokens=32)
    values = np.concatenate([_top(t)[:, 0] if name == "top_prob" else _top(t)[:, 0] - _top(t)[:, 1] for t in base])
    knob = float(np.quantile(values, 0.3))
    policy = make_policy(name, **{"gamma" if name == "top_prob" else "delta": knob})
    fired = 0
    for trace in core.generate(qwen_pair, PROMPTS, policy, max_new_tokens=32):
        top = _top(trace)  # the realised base probabilities, as the trace records them (filled after the run)
        expect = rule(top, knob)
        assert np.abs((top[:, 0] if name == "top_prob" else top[:, 0] - top[:, 1]) - knob).min() > 1e-5
        np.testing.assert_array_equal(trace.source == "reason", expect)
        fired += int(expect.sum())
        assert trace.meta["policy"] == policy.record()
    assert fired >= 3


@pytest.mark.parametrize("policy", [TopProb(gamma=0.5, max_takeovers=4), Margin(delta=0.3, max_takeovers=4)])
def test_lazy_gates_run_the_reasoner_only_where_they_fire(qwen_pair, monkeypatch, policy) -> None:
    pair = dataclasses.replace(qwen_pair, eos_ids=frozenset())  # run all 24 tokens
    log = FeedLog(pair, monkeypatch)
    from core.pair.forward import count_forwards

    with count_forwards(pair.reason) as seen:
        trace = core.generate(pair, PROMPTS[1], policy, max_new_tokens=24)
    fired = int((trace.source == "reason").sum())
    assert 0 < fired <= 4
    reason = log.sizes("reason")
    assert seen.calls == seen.rows == len(reason)  # the hook compare_gates counts with sees every backbone call
    # one prefill, one catch-up forward per position where the gate fired, one final flush of the rest
    assert reason[0] == len(trace.prompt_ids["reason"])
    assert len(reason) - 1 - fired in (0, 1)
    assert sum(reason) == len(trace.prompt_ids["reason"]) + len(trace) - 1  # every token read exactly once
    assert log.sizes("base") == [len(trace.prompt_ids["base"])] + [1] * (len(trace) - 1)
    # the reasoner's metrics of the skipped positions were filled in afterwards, as teacher forcing gives them
    scored = core.score(pair, PROMPTS[1], trace.token_ids.tolist())
    np.testing.assert_allclose(trace.metrics["cross_entropy"], scored.metrics["cross_entropy"], atol=1e-4)


def test_new_gates_are_in_the_registry_for_every_edge() -> None:
    names = {s.name: s for s in list_policies()}
    assert names["top_prob"].lazy and names["margin"].lazy
    assert [p.name for p in names["top_prob"].user_params][:1] == ["gamma"]
    assert [p.name for p in names["margin"].user_params][:1] == ["delta"]
    with pytest.raises(core.InvalidInputError, match="gamma"):
        make_policy("top_prob", gamma=1.5)


WORDS = "apples boxes sum two three four add the of is what how many left".split()


@pytest.fixture(scope="module")
def rollouts(qwen_pair):
    """Base rollouts of two disjoint prompt sets (calibration, held out), sampled."""
    from core.decoding import generate_many
    from core.decoding.policies import BaseOnly

    rng = np.random.default_rng(0)
    prompts = [" ".join(rng.choice(WORDS, 6)) for _ in range(96)]
    pair = dataclasses.replace(qwen_pair, eos_ids=frozenset())  # full-length rollouts: more tokens per prompt
    made = {name: generate_many(pair, ps, BaseOnly(), max_new_tokens=40, temperature=1.0, seed=seed, batch_size=16)
            for name, ps, seed in (("calibration", prompts[:48], 1), ("held_out", prompts[48:], 2))}
    return pair, prompts, made


@pytest.mark.parametrize("name", ["guided", "entropy_gated", "top_prob", "margin", "random_positions", "early_only"])
def test_equal_rho_calibration_hits_the_target_on_held_out_rollouts(rollouts, name) -> None:
    from core.decoding.calibration import build_policy, rollout_rho

    pair, prompts, made = rollouts
    target = 0.1
    policy = build_policy(pair, name, rho=target, rollouts=made["calibration"], max_new_tokens=40)
    assert rollout_rho(policy, made["calibration"]) == pytest.approx(target, rel=0.05)
    # on rollouts it was not fit on, replayed along the base's path, and when it runs (its takeovers change it)
    assert rollout_rho(policy, made["held_out"]) == pytest.approx(target, rel=0.25)
    if name in ("entropy_gated", "top_prob", "margin"):
        n_tokens = sum(len(t) for t in made["held_out"])
        fired = sum(int((np.asarray(policy.signal(t)) < getattr(policy, policy.knob)).sum() if policy.fires_below
                        else (np.asarray(policy.signal(t)) > getattr(policy, policy.knob)).sum())
                    for t in made["held_out"])
        assert rollout_rho(policy, made["held_out"]) == fired / n_tokens  # an independent count
    from core.decoding import generate_many

    run = generate_many(pair, prompts[48:], policy, max_new_tokens=40, temperature=1.0, seed=2, batch_size=16)
    realised = sum(t.n_takeovers for t in run) / sum(len(t) for t in run)
    assert realised == pytest.approx(target, rel=0.35)
    assert policy.fit == {"rho": target, "rollouts": 48} and run[0].meta["calibration"] == policy.fit


def test_a_calibrated_gate_records_its_ratio_in_every_trace_and_keeps_the_keys_of_its_thresholds(rollouts) -> None:
    """DESIGN: r and W are recorded in every trace. They go to meta["calibration"], not into the request, so
    a trace keyed by the gate's thresholds is the same trace whether they were calibrated or typed."""
    from core.decoding import generate_many
    from core.decoding.calibration import build_policy

    pair, prompts, _ = rollouts
    policy = build_policy(pair, "guided", {"window": 8}, calibrate_on=prompts[:6], ratio=0.2, max_new_tokens=16)
    assert policy.fit == {"ratio": 0.2, "window": 8, "problems": 6}
    by_hand = core.make_policy("guided", tau=policy.tau, lam=policy.lam, window=8)
    assert by_hand.fit is None
    made, typed = (generate_many(pair, prompts[90:92], p, max_new_tokens=8) for p in (policy, by_hand))
    assert [t.meta["calibration"] for t in made] == [policy.fit] * 2 and "calibration" not in typed[0].meta
    assert [t.key for t in made] == [t.key for t in typed]
    child = core.takeover(pair, made[0], {2: 7})  # a child of a calibrated trace carries its lineage's calibration
    assert child.meta["parent"] == made[0].key and child.meta["calibration"] == policy.fit


# -- the learned router -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_traces(qwen_pair):
    from core.decoding import generate_many
    from core.decoding.policies import BaseOnly

    rng = np.random.default_rng(3)
    prompts = [" ".join(rng.choice(WORDS, 5)) for _ in range(24)]
    return generate_many(qwen_pair, prompts, BaseOnly(), max_new_tokens=32, temperature=1.0, seed=4, batch_size=12)


def test_router_recovers_a_target_that_one_feature_determines(qwen_pair, base_traces, tmp_path) -> None:
    pooled = np.concatenate([t.metrics["entropy_base"] for t in base_traces])
    cut = float(np.median(pooled))

    def high_entropy(trace):  # one feature (the base's entropy) decides the label
        return np.asarray(trace.metrics["entropy_base"]) > cut

    router = core.train_router(qwen_pair, base_traces, high_entropy, out=tmp_path / "r", epochs=300)
    card = router.card
    assert card["held_out_auroc"] > 0.95
    assert card["pair"] and card["features"][:2] == ["hidden", "entropy_base"]
    assert set(card["training_keys"]).isdisjoint(card["held_out_keys"])
    assert len(card["training_keys"]) + len(card["held_out_keys"]) == len(base_traces)
    # the held-out AUROC recomputed here from the saved router, on the held-out traces only
    from core.analysis.failure import auroc
    from core.decoding.router import load_router
    from core.decoding.router_features import trace_features

    loaded = load_router(tmp_path / "r", qwen_pair)
    held = [t for t in base_traces if t.key in set(card["held_out_keys"])]
    probs = np.concatenate([loaded.net.prob(trace_features(qwen_pair, t)) for t in held])
    labels = np.concatenate([high_entropy(t) for t in held])
    assert auroc(probs, labels) == pytest.approx(card["held_out_auroc"], abs=1e-6)


def test_router_features_are_what_the_engine_hands_the_gate(qwen_pair, base_traces) -> None:
    from core.decoding.router_features import trace_features

    trace = base_traces[0]
    feats = trace_features(qwen_pair, trace)
    np.testing.assert_allclose(feats[:, -4], trace.metrics["entropy_base"], atol=1e-4)
    top = _top(trace)
    np.testing.assert_allclose(feats[:, -3], top[:, 0], atol=1e-5)
    np.testing.assert_allclose(feats[:, -2], top[:, 0] - top[:, 1], atol=1e-5)
    np.testing.assert_allclose(feats[:, -1], np.arange(len(trace)) / 32)


@pytest.fixture(scope="module")
def router_dir(qwen_pair, base_traces, tmp_path_factory):
    out = tmp_path_factory.mktemp("router")
    core.train_router(qwen_pair, base_traces, "gate", out=out, ratio=0.2, window=4, epochs=200)
    return out


def test_router_gate_target_card_and_lazy_run(qwen_pair, router_dir, monkeypatch) -> None:
    from core.decoding.router import read_card

    card = read_card(router_dir)
    assert card["target"] == "gate" and card["target_params"]["ratio"] == 0.2
    assert set(card["thresholds"]) == {"0.01", "0.02", "0.05", "0.1", "0.2"}
    policy = make_policy("router", path=str(router_dir), cut=0.5, max_takeovers=4)
    assert policy.record()["params"]["weights"] == card["weights_sha256"]
    pair = dataclasses.replace(qwen_pair, eos_ids=frozenset())
    log = FeedLog(pair, monkeypatch)
    trace = core.generate(pair, PROMPTS[1], policy, max_new_tokens=24)
    fired = int((trace.source == "reason").sum())
    reason = log.sizes("reason")
    assert len(reason) - 1 - fired in (0, 1)  # prefill, one forward per firing, the final flush
    # it fired exactly where its probability along the realised path exceeds the cut
    from core.decoding.router import load_router
    from core.decoding.router_features import trace_features

    probs = load_router(router_dir).net.prob(trace_features(pair, trace))
    expect = probs > 0.5
    first = int(np.argmax(expect)) if expect.any() else len(trace)
    np.testing.assert_array_equal((trace.source == "reason")[: first + 1], expect[: first + 1])
    assert core.generate(pair, PROMPTS[1], core.decoding.policies.policy_from_record(trace.meta["policy"]),
                         max_new_tokens=24).key == trace.key  # the record rebuilds the same policy


def test_a_router_card_for_one_pair_is_refused_by_another(qwen_pair, llama_pair, router_dir) -> None:
    from core.decoding.router import load_router

    load_router(router_dir, qwen_pair)  # its own pair: fine
    with pytest.raises(core.errors.PairMismatchError, match="another model pair"):
        load_router(router_dir, llama_pair)
    policy = make_policy("router", path=str(router_dir))
    with pytest.raises(core.errors.PairMismatchError, match="another model pair"):
        core.generate(llama_pair, PROMPTS[0], policy, max_new_tokens=4)


def test_router_at_equal_rho_and_bad_inputs(qwen_pair, router_dir, base_traces, tmp_path) -> None:
    from core.decoding.calibration import build_policy, rollout_rho

    policy = build_policy(qwen_pair, "router", {"path": str(router_dir)}, rho=0.1, rollouts=base_traces)
    assert rollout_rho(policy, base_traces, qwen_pair) == pytest.approx(0.1, rel=0.05)
    with pytest.raises(core.InvalidInputError, match="not a router folder"):  # read on first use, before decoding
        core.generate(qwen_pair, PROMPTS[0], make_policy("router", path=str(tmp_path)), max_new_tokens=2)
    with pytest.raises(core.InvalidInputError, match="target must be one of"):
        core.train_router(qwen_pair, base_traces, "nope")


def test_cli_router_train_show_and_generate_at_rho(tmp_path, tiny_dirs) -> None:
    import json

    from click.testing import CliRunner

    from core.cli import main
    from core.io.store import TraceStore

    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"id": f"p{i}", "question": " ".join(WORDS[i: i + 5]), "answer": "1"}) + "\n"
                                for i in range(8)))
    pair = ["--base", str(tiny_dirs["qwen_base"]), "--reason", str(tiny_dirs["qwen_reason"]), "--device", "cpu"]
    store = str(tmp_path / "store")

    def run(*args: str) -> str:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    run("generate", *pair, "--store", store, "--problems", str(problems), "--max-new-tokens", "16",
        "--temperature", "1.0")
    out = run("router", "train", *pair, "--store", store, "--out", str(tmp_path / "r"), "--ratio", "0.2",
              "--epochs", "50")
    assert "held-out AUROC" in out and "router written to" in out
    shown = run("router", "show", str(tmp_path / "r"))
    assert "target        gate" in shown and "cut per ρ" in shown
    again = CliRunner().invoke(main, ["router", "train", *pair, "--store", store, "--out", str(tmp_path / "r")])
    assert again.exit_code != 0 and "--overwrite" in again.output
    n_before = len(TraceStore(store).keys())
    run("generate", *pair, "--store", store, "--problems", str(problems), "--max-new-tokens", "16",
        "--temperature", "1.0", "--policy", "top_prob", "--rho", "0.2", "--calibration-problems", "2")
    made = [TraceStore(store).get(k) for k in TraceStore(store).keys()]
    top = [t for t in made if t.meta["policy"]["name"] == "top_prob"]
    assert len(top) == 6 and len(made) - n_before == 6  # the 2 held-out calibration rollouts were stored already
    assert top[0].meta["policy"]["params"]["gamma"] != 0.3  # calibrated, not the default
    bad = CliRunner().invoke(main, ["generate", *pair, "--store", store, "--problems", str(problems),
                                    "--policy", "reason_only", "--rho", "0.1"])
    assert bad.exit_code != 0 and "--rho" in bad.output


def test_cli_gates_out_refuses_files_it_did_not_write_and_a_rerun_resumes(tmp_path, tiny_dirs) -> None:
    """gates --out follows the --overwrite convention: a gates.csv / gates.html that is not a shoot-out's own is
    refused untouched, before any trace is made; a rerun into the folder it wrote resumes and rewrites its files
    (other files there are kept); --overwrite replaces a foreign one."""
    import json

    from click.testing import CliRunner

    from core.cli import main
    from core.io.store import TraceStore
    from core.reports.gates import read_gates

    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"id": f"p{i}", "question": " ".join(WORDS[i: i + 5]), "answer": "1"}) + "\n"
                                for i in range(4)))
    store = str(tmp_path / "store")
    args = ["gates", "--base", str(tiny_dirs["qwen_base"]), "--reason", str(tiny_dirs["qwen_reason"]), "--device",
            "cpu", "--store", store, "--problems", str(problems), "--gates", "guided,early_only", "--gate-rhos", "0.2",
            "--max-new-tokens", "6"]
    out = tmp_path / "shootout"
    out.mkdir()
    (out / "gates.csv").write_text("my table\n")
    refused = CliRunner().invoke(main, [*args, "--out", str(out)])
    assert refused.exit_code == 1 and "Traceback" not in refused.output, refused.output
    assert f"{out / 'gates.csv'} exists and is not `forkpoint gates` output; pass --overwrite" in refused.output
    assert (out / "gates.csv").read_text() == "my table\n" and TraceStore(store).keys() == []
    (out / "gates.csv").unlink()
    (out / "gates.html").write_text("<p>mine</p>")
    refused = CliRunner().invoke(main, [*args, "--out", str(out)])
    assert refused.exit_code == 1 and f"{out / 'gates.html'} exists" in refused.output
    assert (out / "gates.html").read_text() == "<p>mine</p>"

    (out / "gates.html").unlink()
    (out / "notes.txt").write_text("kept")
    for _ in range(2):  # the first run writes the folder; the second is a resume into it
        result = CliRunner().invoke(main, [*args, "--out", str(out)])
        assert result.exit_code == 0, result.output
        table = read_gates(out)
        assert list(table["label"]) == ["base", "reason", "guided ρ=0.2", "early_only ρ=0.2"]
    assert (out / "notes.txt").read_text() == "kept"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "gates.csv").write_text("my table\n")
    result = CliRunner().invoke(main, [*args, "--out", str(foreign), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert list(read_gates(foreign)["label"]) == list(table["label"])


def test_gates_keeps_its_own_router_folder_and_refuses_another(router_dir, tmp_path) -> None:
    """A shoot-out that trains its router writes OUT/router before the table, so an interrupted run leaves it
    alone: a rerun takes a router folder there as its own; a folder that is not a router is refused."""
    import shutil

    import click

    from core.cli.gates import _free_gates_outputs

    shutil.copytree(router_dir, tmp_path / "resumed" / "router")
    _free_gates_outputs(tmp_path / "resumed", False, router=True)  # no error: the interrupted run's own router
    (tmp_path / "other" / "router").mkdir(parents=True)
    with pytest.raises(click.ClickException, match="router exists and is not `forkpoint gates` output; pass --overwrite"):
        _free_gates_outputs(tmp_path / "other", False, router=True)
    _free_gates_outputs(tmp_path / "other", False, router=False)  # --router given (or no router gate): not written
    _free_gates_outputs(tmp_path / "other", True, router=True)


# -- the shoot-out ----------------------------------------------------------------------------------------


def test_flip_counts_agree_with_a_hand_count() -> None:
    import pandas as pd

    from core.reports.gates import flips

    rows = []
    base = {"x": [[1, 0], [0, 0], [1, 1], [0, 1]], "y": [[0, 0], [1, 1]]}
    gate = {"x": [[1, 1], [1, 0], [0, 0], [0, 0]], "y": [[0, 1], [0, 0]]}
    for label, table in (("base", base), ("g", gate)):
        for bench, problems in table.items():
            for index, samples in enumerate(problems):
                rows += [{"benchmark": bench, "policy": label, "index": index, "sample": s, "correct": bool(c),
                          "tokens": 10, "taken": 1} for s, c in enumerate(samples)]
    got = flips(pd.DataFrame(rows), "g").set_index("benchmark")
    # by hand, a problem right when at least half its samples are: base x = R W R R, gate x = R R W W;
    # base y = W R, gate y = R W
    assert got.loc["x", "wrong_to_right"] == 1 and got.loc["x", "right_to_wrong"] == 2
    assert got.loc["y", "wrong_to_right"] == 1 and got.loc["y", "right_to_wrong"] == 1


def test_compare_gates_equals_a_recomputation_from_the_stored_traces(qwen_pair, tmp_path) -> None:
    from core.reports.gates import compare_gates, gate_summary, problem_right, write_gates

    rng = np.random.default_rng(7)
    problems = [{"id": f"q{i}", "question": " ".join(rng.choice(WORDS, 5)), "answer": str(i % 2)} for i in range(14)]
    store = core.TraceStore(tmp_path / "store")
    keep: dict = {}
    table = compare_gates(qwen_pair, {"a": problems[4:9], "b": problems[9:]}, problems[:4], (0.1,),
                          gates=("guided", "top_prob", "margin"), samples=2, max_new_tokens=12, temperature=1.0,
                          store=store, keep=keep)
    assert set(table["label"]) == {"base", "reason", "guided ρ=0.1", "top_prob ρ=0.1", "margin ρ=0.1"}
    for _, row in table.iterrows():
        traces = [t for t in keep[row["label"]] if (t.meta["problem"]["id"] in
                                                    {p["id"] for p in (problems[4:9] if row["benchmark"] == "a"
                                                                       else problems[9:])})]
        assert len(traces) == row["problems"] * row["samples"]
        assert row["accuracy"] == pytest.approx(np.mean([bool(t.meta["correct"]) for t in traces]))
        assert row["rho"] == pytest.approx(sum(t.n_takeovers for t in traces) / sum(len(t) for t in traces))
        if row["label"] in ("top_prob ρ=0.1", "margin ρ=0.1"):
            assert row["reason_evals_per_token"] == pytest.approx(row["rho"])  # lazy: the reasoner only where it fired
    # flips recomputed per problem from the stored traces
    import pandas as pd

    def right(label):
        frame = pd.DataFrame([{"benchmark": "all", "index": t.meta["problem"]["id"], "correct": bool(t.meta["correct"])}
                              for t in keep[label]])
        return problem_right(frame)

    for label in ("guided ρ=0.1", "top_prob ρ=0.1"):
        mine, base = right(label), right("base")
        rows = table[table["label"] == label]
        assert rows["wrong_to_right"].sum() == int((mine & ~base).sum())
        assert rows["right_to_wrong"].sum() == int((~mine & base).sum())
    summary = gate_summary(table)
    assert set(summary["benchmark"]) == {"average"} and len(summary) == 5
    paths = write_gates(tmp_path / "out", table, {"note": "<script>"})
    text = paths["html"].read_text()
    assert "top_prob ρ=0.1" in text and "<script>\"" not in text and "&lt;script&gt;" in text
    assert pd.read_csv(paths["csv"])["benchmark"].tolist().count("average") == 5


def test_compare_gates_counts_reasoner_forwards_and_reads_wall_times_back(qwen_pair, tmp_path, monkeypatch) -> None:
    """Reasoner forwards are counted while each stage decodes (their sum is every reasoner backbone row a spy
    sees), and wall times per token come from the seconds the traces record, so a rerun that reads everything
    back from the store gives the same wall times (not NaN) and no forwards."""
    import math

    from core.decoding import state as decoding_state
    from core.evaluation.sweep import calibration_rollouts
    from core.reports.gates import compare_gates
    from core.trace import decode_seconds

    rng = np.random.default_rng(11)
    problems = [{"id": f"w{i}", "question": " ".join(rng.choice(WORDS, 5)), "answer": str(i % 2)} for i in range(8)]
    store = core.TraceStore(tmp_path / "store")
    common = dict(samples=2, max_new_tokens=12, temperature=1.0, store=store)
    calibration_rollouts(qwen_pair, problems[:3], **common)  # stored first: the run's forwards are all in its stages
    rows: list[int] = []
    original = decoding_state.backbone

    def spy(model, input_ids, *args, **kwargs):
        if model is qwen_pair.reason:
            rows.append(int(input_ids.shape[0]))
        return original(model, input_ids, *args, **kwargs)

    monkeypatch.setattr(decoding_state, "backbone", spy)
    keep: dict = {}
    gates = ("guided", "top_prob", "margin")
    table = compare_gates(qwen_pair, problems[3:], problems[:3], (0.1,), gates=gates, keep=keep, **common)
    made = {row["label"]: row for _, row in table.iterrows()}
    assert set(made) == {"base", "reason", "guided ρ=0.1", "top_prob ρ=0.1", "margin ρ=0.1"}
    tokens = {label: sum(len(t) for t in keep[label]) for label in made}
    counted = sum(made[label]["reason_forwards_per_token"] * tokens[label] for label in made)
    assert counted == pytest.approx(sum(rows))  # every reasoner row-forward of the run, in exactly one stage
    for label in ("top_prob ρ=0.1", "margin ρ=0.1"):  # lazy: far fewer reasoner forwards than steps
        assert made[label]["reason_forwards_per_token"] < made["reason"]["reason_forwards_per_token"]
    for label, row in made.items():  # the recorded seconds of the label's traces, per token
        expect = sum(decode_seconds(t.meta) for t in keep[label]) / tokens[label]
        assert row["wall_s_per_token"] == pytest.approx(expect) and expect > 0
    rows.clear()
    again = compare_gates(qwen_pair, problems[3:], problems[:3], (0.1,), gates=gates, **common).set_index("label")
    assert rows == []  # everything read back from the store
    for label, row in made.items():
        assert again.loc[label, "wall_s_per_token"] == pytest.approx(row["wall_s_per_token"], rel=1e-6)
        assert math.isnan(again.loc[label, "reason_forwards_per_token"])
    bare = compare_gates(qwen_pair, problems[3:5], problems[:2], (0.1,), gates=("top_prob",), samples=1,
                         max_new_tokens=8, temperature=1.0)  # no store: the timings come from the traces held
    assert (bare["wall_s_per_token"] > 0).all() and bare["reason_forwards_per_token"].notna().all()


def test_router_effect_target_labels_where_a_measured_takeover_helped(tmp_path) -> None:
    """target="effect": the examples are exactly the measured positions (takeover_effects rows in the store), the
    positives those whose effect is > 0, recounted here from the effects table; the fit separates them."""
    from test_effects import _agreement, _decision

    from core.analysis.failure import auroc
    from core.decoding.router_features import trace_features
    from core.instruments import effects as fx

    pair = core.demo_pair()
    store = core.TraceStore(tmp_path / "store")
    traces = core.generate(pair, core.demo_problems(limit=4), max_new_tokens=80, store=store)
    measured = {t.key: fx.takeover_effects(pair, t, sorted({_agreement(t), _decision(t)}), samples=4, store=store)
                for t in traces}
    unmeasured = core.generate(pair, core.demo_problems(limit=6)[4:], max_new_tokens=80, store=store)
    router = core.train_router(pair, [*traces, *unmeasured], "effect", store=store, epochs=300)
    card = router.card
    effects = np.concatenate([f["effect"].to_numpy() for f in measured.values()])
    assert 0 < (effects > 0).sum() < len(effects)  # both kinds measured (the decision tokens help, agreement not)
    assert card["target"] == "effect" and card["target_params"] == {"score": core.settings.SCORE}
    assert card["positives"]["train"] + card["positives"]["held_out"] == int((effects > 0).sum())
    assert card["positives"]["train_of"] + card["positives"]["held_out_of"] == len(effects)
    assert set(card["training_keys"]) | set(card["held_out_keys"]) == set(measured)  # unmeasured traces: no examples
    train = [t for t in traces if t.key in set(card["training_keys"])]
    x = np.concatenate([trace_features(pair, t)[measured[t.key]["pos"].to_numpy()] for t in train])
    y = np.concatenate([measured[t.key]["effect"].to_numpy() > 0 for t in train])
    assert auroc(router.net.prob(x), y) == 1.0  # a handful of examples in 132 dimensions: fit exactly
    with pytest.raises(core.InvalidInputError, match="store="):
        core.train_router(pair, traces, "effect")
    with pytest.raises(core.InvalidInputError, match="fewer than 2 traces"):
        core.train_router(pair, unmeasured, "effect", store=store)


@pytest.mark.parametrize("hidden", [0, 8])
def test_router_decisions_equal_a_float64_recomputation(qwen_pair, base_traces, tmp_path, hidden) -> None:
    """RouterNet's probabilities (numpy, what the gate runs per step) equal sigmoid(layers((x - mean) / scale))
    written out here in float64, and it fires at the same positions for every cut (but a tie within rounding)."""
    from core.decoding.router_features import trace_features

    router = core.train_router(qwen_pair, base_traces, "gate", out=tmp_path / "r", ratio=0.2, window=4, epochs=60,
                               hidden=hidden)
    t = {k: np.asarray(v, dtype=np.float64) for k, v in router.net.tensors.items()}
    x = np.concatenate([trace_features(qwen_pair, tr) for tr in base_traces])
    h = (x.astype(np.float64) - t["mean"]) / t["scale"]
    h = h @ t["w0"].T + t["b0"]
    if hidden:
        h = np.maximum(h, 0.0) @ t["w1"].T + t["b1"]
    expect = 1.0 / (1.0 + np.exp(-h[:, 0]))
    got = router.net.prob(x)
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-15)
    for cut in [*router.card["thresholds"].values(), 0.5]:
        clear = np.abs(expect - cut) > 1e-12  # a cut the quantile put on one position's own value may tie there
        assert (~clear).sum() <= 1
        np.testing.assert_array_equal((got > cut)[clear], (expect > cut)[clear])


def test_wall_times_of_traces_stored_before_summaries_carried_them(qwen_pair, tmp_path, monkeypatch) -> None:
    """A trace stored before the summary had `decode_s` (its footer lacks it) still gives its wall time: read from
    the trace's own meta["timings"]."""
    from core.io import store as store_module
    from core.reports.gates import compare_gates

    problems = [{"id": f"o{i}", "question": " ".join(WORDS[i: i + 4]), "answer": "1"} for i in range(4)]
    store = core.TraceStore(tmp_path / "store")
    args = (qwen_pair, problems[2:], problems[:2], (0.1,))
    opts = dict(gates=("top_prob",), samples=1, max_new_tokens=8, temperature=1.0, store=store)
    original = store_module.summarise
    monkeypatch.setattr(store_module, "summarise", lambda t, key=None: {
        k: v for k, v in original(t, key).items() if k != "decode_s"})
    first = compare_gates(*args, **opts).set_index("label")
    monkeypatch.setattr(store_module, "summarise", original)
    assert all(store.summary(k).get("decode_s") is None for k in store.keys())  # as an older store holds them
    again = compare_gates(*args, **opts).set_index("label")
    assert (again["wall_s_per_token"] > 0).all()
    np.testing.assert_allclose(again["wall_s_per_token"], first["wall_s_per_token"], rtol=1e-9)
