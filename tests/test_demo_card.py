"""Measuring the demo pair and writing its card (on a tiny, freshly trained pair: fast, not meaningful)."""

from __future__ import annotations

import json
import math

import pytest

from core.reports import demo_card
from core.demo import train as demo_train


def test_bars_compare_in_the_right_direction():
    assert demo_card.passes("base_acc_greedy", 0.60) and not demo_card.passes("base_acc_greedy", 0.61)
    assert demo_card.passes("guided_recovery_greedy", 0.8) and not demo_card.passes("guided_recovery_greedy", 0.79)
    assert demo_card.passes("median_u_top1", 0.3) and not demo_card.passes("median_u_top1", 0.31)
    assert not demo_card.passes("plan_enrichment_taken", float("nan"))
    assert not demo_card.passes("early_recovery_greedy", float("nan"))


@pytest.fixture(scope="module")
def tiny_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_card")
    demo_train.train_demo_pair(out, size="tiny")
    return out


def test_write_card_on_a_tiny_pair(tiny_demo):
    result = demo_card.write_card(tiny_demo, n=3, samples=2, command="pytest", max_new_tokens=12)
    assert set(result["values"]) == set(demo_card.BARS)
    assert result["settings"]["problems"] == 3 and result["settings"]["samples"] == 2
    card = (tiny_demo / "CARD.md").read_text()
    assert card.startswith("# forkpoint demo pair")
    assert "Measured with `pytest`" in card
    for desc, _, _ in demo_card.BARS.values():
        assert desc in card
    saved = json.loads((tiny_demo / "measure.json").read_text())
    assert saved["values"].keys() == result["values"].keys()
    # sampled rows carry pass@2 and both ends of the gap are present
    policies = [r["policy"] for r in result["sampled"]]
    assert policies == ["base", "reason", "guided", "random_positions", "early_only", "random_positions@0.1",
                        "early_only@0.1"]
    assert all(r["k"] == 2 for r in result["sampled"])
    rho = {r["policy"]: r["rho"] for r in result["greedy"]}
    assert rho["base"] == 0.0 and rho["reason"] == 1.0
    assert all(0.0 <= v <= 1.0 or math.isnan(v) for v in rho.values())


def test_a_setting_on_the_records_table_gives_the_in_memory_numbers(tiny_demo, tmp_path):
    """_one_setting aggregates its records in an on-disk RecordTable: the same table as the records frames of
    both stages concatenated (the path it replaced), to the last bit."""
    import pandas as pd

    from core.decoding import calibrate
    from core.decoding.policies import BaseOnly, ReasonOnly, make_policy
    from core.demo import pair as demo
    from core.evaluation import harness as ev
    from core.evaluation.sweep import matched_baselines
    from core.io.store import TraceStore

    pair = demo.demo_pair(demo_dir=tiny_demo)
    problems = demo.demo_problems("test", limit=4)
    store = TraceStore(tmp_path / "s")
    gate = calibrate(pair, demo.demo_problems("calib", limit=4), ratio=0.05, window=16, max_new_tokens=12,
                     store=store)
    opts = dict(samples=2, store=store, temperature=0.6, top_p=0.95, seed=0, max_new_tokens=12, batch_size=100)
    table, kept = demo_card._one_setting(pair, problems, gate, budget=0.1, progress=None, **opts)
    first = ev.run_records(pair, problems, {"base": BaseOnly(), "reason": ReasonOnly(),
                                            "guided": make_policy("guided", gate=gate, budget=0.1)}, **opts)
    head = ev.policy_table(first).set_index("policy")
    rho, mean_tokens = float(head.loc["guided", "rho"]), float(head.loc["base", "mean_tokens"])
    second = ev.run_records(pair, problems, {**matched_baselines(rho, mean_tokens, 12, 0),
                                             **matched_baselines(0.1, mean_tokens, 12, 0, suffix="@0.1")}, **opts)
    pd.testing.assert_frame_equal(table, ev.policy_table(pd.concat([first, second], ignore_index=True)))
    assert len(kept["base"]) == 8 and len(table) == 7


def test_the_cards_gate_shoot_out_section_shows_the_table_at_two_rho():
    import pandas as pd

    from core.reports.demo_card import gates_card

    rows = [{"benchmark": "problems", "label": lab, "gate": g, "target_rho": t, "rho": r, "accuracy": a,
             "pass@k": a, "k": 4, "recovery@k": rec, "wrong_to_right": w, "right_to_wrong": d, "problems": 100,
             "reason_evals_per_token": c, "wall_s_per_token": 0.002}
            for lab, g, t, r, a, rec, w, d, c in (
                ("base", "base", None, 0.0, 0.45, 0.0, 0, 0, 0.0), ("reason", "reason", None, 1.0, 1.0, 1.0, 55, 0, 1.0),
                ("top_prob ρ=0.02", "top_prob", 0.02, 0.0213, 0.97, 0.95, 52, 1, 0.0213),
                ("top_prob ρ=0.05", "top_prob", 0.05, 0.0561, 0.99, 0.98, 54, 0, 0.0561),
                ("top_prob ρ=0.1", "top_prob", 0.1, 0.11, 1.0, 1.0, 55, 0, 0.11))]
    text = gates_card(pd.DataFrame(rows))
    assert "| top_prob ρ=0.02 | 0.02 | 0.021 | 0.970 |" in text and "| top_prob ρ=0.05 |" in text
    assert "ρ=0.1 |" not in text  # two ρ only
    assert "first 100 held-out problems (4 samples each" in text and "forkpoint gates" in text
    assert "What it does not show" in text and "| 52 | 1 |" in text and "| 2.00 |" in text
