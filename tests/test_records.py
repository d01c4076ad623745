"""core/evaluation/record_table.py: a run's records on disk give the policy table the in-memory records give,
number for number, and come back in run order."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import core.evaluation.harness as ev
from core.evaluation.record_table import RECORD_COLUMNS, RecordTable, frame_groups
from core.trace import RowSummary


def pandas_policy_table(records: pd.DataFrame, k: int | None = None) -> pd.DataFrame:
    """The policy table as it was computed before the records went to disk: pandas over every row."""
    out = []
    for (bench, label), g in records.groupby(["benchmark", "policy"], sort=False):
        per = g.groupby("index")["correct"].agg(["size", "sum"])
        n_min = int(per["size"].min())
        kk = n_min if k is None else k
        none = g["answer_rule"].isna()
        out.append({
            "benchmark": bench, "policy": label, "problems": len(per), "samples": n_min,
            "accuracy": float(g["correct"].astype(bool).mean()),
            "wrong": float((~g["correct"].astype(bool) & ~none).mean()), "ungraded": float(none.mean()),
            "pass@k": float(np.mean([ev.pass_at_k(int(n), int(c), kk) for n, c in zip(per["size"], per["sum"])])),
            "k": kk, "rho": float(g["taken"].sum() / max(1, g["tokens"].sum())),
            "mean_tokens": float(g["tokens"].mean()),
        })
    return pd.DataFrame(out, columns=list(ev.POLICY_TABLE_COLUMNS[:-3]))


@st.composite
def record_frames(draw):
    """Random records: 1-2 benchmarks, 1-4 policies (base among them), problems with 1-4 samples each."""
    rows = []
    benches = draw(st.lists(st.sampled_from(["aime", "math", "gsm"]), min_size=1, max_size=2, unique=True))
    labels = ["base"] + draw(st.lists(st.sampled_from(["reason", "guided", "random"]), max_size=3, unique=True))
    order = draw(st.permutations([(b, p) for b in benches for p in labels]))
    for bench, label in order:
        problems = draw(st.lists(st.integers(0, 40), min_size=1, max_size=8, unique=True))
        for index in problems:
            for sample in range(draw(st.integers(1, 4))):
                correct = draw(st.booleans())
                rule = None if draw(st.integers(0, 3)) == 0 and not correct else draw(st.sampled_from(["boxed", "phrase"]))
                rows.append([bench, label, f"p{index}", index, sample, correct, draw(st.integers(0, 3000)),
                             draw(st.integers(0, 50)), f"k{len(rows)}", rule])
    frame = pd.DataFrame(rows, columns=list(RECORD_COLUMNS))
    return frame.sample(frac=1.0, random_state=draw(st.integers(0, 9))).reset_index(drop=True)  # rows in any order


@settings(max_examples=60, deadline=None)
@given(record_frames(), st.sampled_from([None, 1]))
def test_streamed_table_equals_in_memory(frame, k):
    """SQL aggregation over the on-disk table = pandas over every row in memory, exactly (the counts are
    integers; the pass@k mean runs over the same per-problem values in the same order)."""
    expected = pandas_policy_table(frame, k=k)
    with RecordTable() as table:
        table.add_frame(frame)
        assert len(table) == len(frame)
        pd.testing.assert_frame_equal(table.frame(), frame, check_exact=True)
        streamed = ev.policy_table(table, k=k)
        assert table.policies() == list(dict.fromkeys(frame["policy"]))
    in_memory = ev.policy_table(frame, k=k)
    pd.testing.assert_frame_equal(streamed, in_memory, check_exact=True)
    pd.testing.assert_frame_equal(streamed[expected.columns], expected, check_exact=True)


def test_rows_out_of_order_come_back_in_run_order(tmp_path):
    """Batches may finish in any order (Ray): rows are placed by position, and read back in it."""
    table = RecordTable(tmp_path / "r.sqlite")
    rows = [RowSummary(f"k{i}", f"p{i // 2}", "base_only", i % 3 == 0, i, 10 + i, "boxed") for i in range(6)]
    table.add(4, "b", "base", [(2, 0, rows[4]), (2, 1, rows[5])])
    table.add(0, "b", "base", [(0, 0, rows[0]), (0, 1, rows[1]), (1, 0, rows[2]), (1, 1, rows[3])])
    frame = table.frame()
    assert list(frame["key"]) == [f"k{i}" for i in range(6)] and list(frame["index"]) == [0, 0, 1, 1, 2, 2]
    assert list(frame["correct"]) == [True, False, False, True, False, False]
    assert frame["tokens"].dtype == np.int64 and frame["correct"].dtype == bool
    [g] = list(frame_groups(frame))
    assert list(g.sizes) == [2, 2, 2] and list(g.sums) == [1, 1, 0] and g.tokens == sum(10 + i for i in range(6))
    table.close()
    again = RecordTable(tmp_path / "r.sqlite")  # a named table is a file that outlives its handle
    assert len(again) == 6 and again.next_seq() == 6
    again.close()


def test_temporary_table_is_removed_on_close():
    table = RecordTable()
    path = table.path
    table.add(0, "b", "base", [(0, 0, RowSummary("k", "p", "base_only", True, 0, 1))])
    assert path.exists()
    table.close()
    assert not path.exists() and not path.parent.exists()


def test_empty_records_give_an_empty_table():
    with RecordTable() as table:
        assert table.frame().empty and list(table.frame().columns) == list(RECORD_COLUMNS)
        assert ev.policy_table(table).empty


def test_missing_answer_rule_gives_nan_shares():
    frame = pd.DataFrame([["b", "base", "p", 0, 0, True, 5, 0, "k"]], columns=list(RECORD_COLUMNS[:-1]))
    row = ev.policy_table(frame).iloc[0]
    assert math.isnan(row["wrong"]) and math.isnan(row["ungraded"]) and row["accuracy"] == 1.0
    with pytest.raises(Exception, match="columns"):
        RecordTable().add_frame(frame)
