"""TraceStore: round trips, crash safety (kill -9), concurrent writers, corrupt files, schema bumps."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pandas as pd
import pytest
from fakes import make_trace
from hypothesis import given, settings
from hypothesis import strategies as st

import core.io.store as store_mod
from core.errors import InvalidInputError, StoreError
from core.io.maintenance import verify
from core.io.store import SUMMARY_COLUMNS, TraceStore, content_key, default_store_path
from core.trace import SCHEMA_VERSION

# Writers are forked from this process (already importing torch and core), so each costs milliseconds,
# not the seconds of a fresh interpreter; they are still separate processes with their own files.
FORK = multiprocessing.get_context("fork")
TRACES = {seed: make_trace(48, seed=seed, annotate=True) for seed in range(300)}


def _write(root: str, seeds: list[int]) -> None:
    store = TraceStore(root)
    for seed in seeds:
        store.put(TRACES[seed])


def start_writer(root: Path, start: int, stop: int) -> multiprocessing.Process:
    proc = FORK.Process(target=_write, args=(str(root), list(range(start, stop))), daemon=True)
    proc.start()
    return proc


def expected(seeds) -> dict[str, object]:
    return {TRACES[s].key: TRACES[s] for s in seeds}


def n_files(root: Path) -> int:
    return len(TraceStore(root).keys())  # not a glob: that would count the writer's .tmp-* files


def test_round_trip_equal(tmp_path):
    store = TraceStore(tmp_path)
    for trace in [make_trace(40, seed=1), make_trace(40, seed=2, annotate=True), make_trace(0, seed=3)]:
        key = store.put(trace)
        assert key == trace.key
        back = store.get(key)
        assert back == trace
        assert back.annotations.keys() == trace.annotations.keys()
        for name, values in trace.metrics.items():
            assert back.metrics[name].dtype == np.asarray(values).dtype, name
        assert back.topk["base"][1].dtype == np.float32
        assert key in store
    assert "nope" not in store and "../x" not in store
    assert store.keys() == sorted([make_trace(40, seed=s).key for s in (1, 2)] + [make_trace(0, seed=3).key])


def test_annotations_round_trip_and_columns(tmp_path):
    trace = make_trace(30, seed=5, annotate=True).annotate(custom={"a": [1, 2]}, notes=["x"] * 30)
    trace.annotations["tags"][3] = None  # a missing tag survives
    store = TraceStore(tmp_path)
    key = store.put(trace)
    assert store.get(key) == trace
    table = pq.read_table(store.traces_dir / f"{key}.parquet")
    assert {"ann:tags", "ann:segments", "ann:spike", "ann:notes", "topk_base_ids"} <= set(table.column_names)
    assert table.schema.field("topk_base_ids").type.list_size == 5  # fixed-size top-k, never full vocab
    spike = np.flatnonzero(table.column("ann:spike").to_numpy())
    assert spike.tolist() == trace.annotations["spikes"]["positions"]


def test_put_is_content_addressed(tmp_path):
    store = TraceStore(tmp_path)
    a = make_trace(20, seed=1)
    key = store.put(a)
    impostor = make_trace(20, seed=2, meta={"key": key})
    assert store.put(impostor) == key
    assert store.get(key) == a  # no-op: the first content stays
    assert store.put(impostor, overwrite=True) == key
    assert store.get(key) == impostor
    assert len(store.summaries()) == 1  # the stale index line no longer matches the file


def test_keyless_trace_gets_content_key(tmp_path):
    trace = make_trace(20, seed=4)
    del trace.meta["key"]
    store = TraceStore(tmp_path)
    key = store.put(trace)
    assert key == content_key(trace) == content_key(make_trace(20, seed=4, meta={"key": "ignored"}))
    assert store.get(key).meta["key"] == key
    assert "key" not in trace.meta  # the caller's trace is untouched
    assert store.put(trace) == key


def test_a_prefix_is_stored_as_its_own_trace(tmp_path):
    store = TraceStore(tmp_path)
    whole = make_trace(20, seed=5)
    whole.meta.update(correct=True, answer="7")
    key = store.put(whole)
    part = whole.prefix(8)
    assert part.key is None and part.meta["prefix_of"] == key and "correct" not in part.meta
    part_key = store.put(part)
    assert part_key != key and len(store.get(part_key)) == 8 and len(store.get(key)) == 20


def test_bad_keys_rejected(tmp_path):
    store = TraceStore(tmp_path)
    for bad in ["../evil", "a/b", ".hidden", "x" * 200, "a b"]:
        with pytest.raises(InvalidInputError, match="Invalid trace key"):
            store.put(make_trace(5, meta={"key": bad}))
    with pytest.raises(StoreError, match="No trace"):
        store.get("deadbeef")


def test_summaries_values(tmp_path):
    store = TraceStore(tmp_path)
    traces = [make_trace(150, seed=s, annotate=True) for s in range(3)]
    for t in traces:
        store.put(t)
    df = store.summaries().set_index("key")
    assert list(store.summaries().columns) == list(SUMMARY_COLUMNS)
    for t in traces:
        row = df.loc[t.key]
        ce = np.sort(t.metrics["cross_entropy"])[::-1]
        assert row["max_score"] == pytest.approx(ce[0])
        assert row["top100_mean"] == pytest.approx(ce[:100].mean())
        kl = np.sort(-t.metrics["delta_logp"])[::-1]
        assert row["top100_delta_logp"] == pytest.approx(kl[:100].mean())
        n_take = sum(1 for s in t.source if s == "reason")  # a forced token is not a takeover
        assert row["n_takeovers"] == n_take and row["rho"] == pytest.approx(n_take / 150)
        assert row["n_spikes"] == len(t.annotations["spikes"]["positions"]) == 15
        assert row["n_tokens"] == 150 and row["pair"] == "base-0.1B|reason-0.1B"
        assert row["policy"] == "guided" and row["problem"] == t.meta["problem"]["id"]
        assert row["correct"] == t.meta["correct"]


def test_summaries_survive_missing_or_torn_index(tmp_path):
    store = TraceStore(tmp_path)
    keys = {store.put(make_trace(10, seed=s)) for s in range(5)}
    with open(store.index_path, "ab") as fh:
        fh.write(b'{"key": "torn", "id": [1, 2')  # a writer killed mid-line
    store.put(make_trace(10, seed=99))
    assert len(TraceStore(tmp_path).summaries()) == 6
    store.index_path.unlink()
    fresh = TraceStore(tmp_path)
    assert set(fresh.summaries()["key"]) >= keys and len(fresh.summaries()) == 6
    assert store.index_path.exists()  # repaired from the footers


def test_delete_and_children_tree(tmp_path):
    store = TraceStore(tmp_path)
    root = make_trace(30, seed=1)
    b1 = make_trace(30, seed=2, meta={"parent": root.key, "branch_pos": 10, "kind": "branch"})
    b2 = make_trace(30, seed=3, meta={"parent": root.key, "branch_pos": 4, "kind": "branch"})
    b11 = make_trace(30, seed=4, meta={"parent": b1.key, "branch_pos": 12, "kind": "branch"})
    for t in (root, b1, b2, b11):
        store.put(t)
    assert store.children(root.key) == [b2.key, b1.key]
    assert store.children(b2.key) == []
    assert store.children_index() == {root.key: [b2.key, b1.key], b1.key: [b11.key]}  # every parent, one listing
    tree = store.tree(b11.key)
    assert tree["key"] == root.key
    assert [c["key"] for c in tree["children"]] == [b2.key, b1.key]
    assert [c["key"] for c in tree["children"][1]["children"]] == [b11.key]
    assert tree["children"][1]["children"][0]["branch_pos"] == 12
    store.delete(b1.key)
    assert b1.key not in store and store.children(root.key) == [b2.key]
    assert store.children_index() == {root.key: [b2.key], b1.key: [b11.key]}  # a new listing, a new index
    assert store.tree(b11.key)["key"] == b11.key  # its stored ancestry now starts at itself
    with pytest.raises(StoreError):
        store.delete(b1.key)


def test_truncated_garbage_and_schema_bump(tmp_path, monkeypatch):
    store = TraceStore(tmp_path)
    good = [store.put(make_trace(30, seed=s)) for s in range(4)]
    # truncated file
    path = store.traces_dir / f"{good[0]}.parquet"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    # garbage bytes under a valid name
    (store.traces_dir / "garbage01.parquet").write_bytes(os.urandom(3000))
    # corrupted data page, same size, intact footer: caught by page checksums on full read
    path2 = store.traces_dir / f"{good[1]}.parquet"
    raw = bytearray(path2.read_bytes())
    for i in range(200, 260):
        raw[i] ^= 0xFF
    path2.write_bytes(bytes(raw))
    # a good file under another key's name (copied by hand)
    shutil.copy(store.traces_dir / f"{good[3]}.parquet", store.traces_dir / "renamed01.parquet")
    # a trace from a newer schema
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    newer = store.put(make_trace(30, seed=50, meta={"schema": SCHEMA_VERSION + 1}))
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", SCHEMA_VERSION)

    fresh = TraceStore(tmp_path)
    bad = dict((p.name, reason) for p, reason in fresh.unreadable())
    assert set(bad) == {
        f"{good[0]}.parquet", "garbage01.parquet", f"{good[1]}.parquet", f"{newer}.parquet", "renamed01.parquet"
    }  # fmt: skip
    assert "holds key" in bad["renamed01.parquet"]
    assert "newer" in bad[f"{newer}.parquet"]
    listed = set(fresh.summaries()["key"])
    assert listed >= {good[2], good[3]} and not listed & {good[0], newer, "garbage01", "renamed01"}
    assert fresh.get(good[2]) == make_trace(30, seed=2)
    for key, pattern in [(good[0], "unreadable"), ("garbage01", "unreadable"), (newer, "newer")]:
        with pytest.raises(StoreError, match=pattern):
            fresh.get(key)
    assert len(fresh.keys()) == 7  # nothing deleted
    with pytest.raises(StoreError, match="newer"):
        fresh.put(make_trace(5, meta={"schema": SCHEMA_VERSION + 1}))


CHANGES = ("put", "delete", "truncate", "garbage", "drop_index", "nothing")


@settings(max_examples=30, deadline=None)
@given(changes=st.lists(st.tuples(st.sampled_from(CHANGES), st.integers(0, 5)), max_size=10))
def test_a_kept_listing_is_what_a_fresh_store_lists_after_any_change(tmp_path_factory, changes):
    """A store object keeps its last listing while no trace file and not the index changed; after puts, deletes,
    files damaged in place, garbage under a trace's name or a lost index it lists what a new object lists."""
    root = tmp_path_factory.mktemp("kept")
    store = TraceStore(root)
    for seed in range(3):
        store.put(make_trace(20, seed=seed))
    store.listing()
    for change, i in changes:
        keys = store.keys()
        if change == "put":
            store.put(make_trace(20, seed=10 + i))
        elif change == "delete" and keys:
            store.delete(keys[i % len(keys)])
        elif change == "truncate" and keys:
            path = store.traces_dir / f"{keys[i % len(keys)]}.parquet"
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        elif change == "garbage":
            (store.traces_dir / f"garbage{i}.parquet").write_bytes(os.urandom(500 + i))
        elif change == "drop_index":
            store.index_path.unlink(missing_ok=True)
        frame, bad = store.listing()
        fresh_frame, fresh_bad = TraceStore(root).listing()
        pd.testing.assert_frame_equal(frame, fresh_frame)
        assert bad == fresh_bad
        assert set(frame["key"]) | {p.name.removesuffix(".parquet") for p, _ in bad} == set(store.keys())


def test_an_unchanged_store_is_listed_from_its_kept_listing(tmp_path, monkeypatch):
    """The mechanism: a second listing reads no index line (the kept one, as copies), a put makes a new one."""
    store = TraceStore(tmp_path)
    keys = [store.put(make_trace(20, seed=s)) for s in range(3)]
    calls = []
    listed = store_mod.summary_rows
    monkeypatch.setattr(store_mod, "summary_rows", lambda *a: calls.append(1) or listed(*a))
    first = store.summaries()
    assert store.children(keys[0]) == [] and store.tree(keys[1])["key"] == keys[1]
    assert len(calls) == 1
    store._summary_rows()[0][0]["key"] = "changed by a caller"  # rows handed out are copies
    for frame in (store.summaries(), store.listing()[0]):  # and so are frames
        frame.loc[0, "key"] = "changed by a caller"
    pd.testing.assert_frame_equal(store.summaries(), first)
    store.put(make_trace(20, seed=9))
    assert len(store.summaries()) == 4 and len(calls) == 2


def test_meta_reads_the_footer_alone_and_names_what_is_wrong(tmp_path, monkeypatch):
    store = TraceStore(tmp_path)
    keys = [store.put(make_trace(30, seed=s, meta={"note": s})) for s in range(2)]
    whole = [TraceStore(tmp_path).get(key).meta for key in keys]
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("a data page was read"))
    assert [store.meta(key) for key in keys] == whole and whole[1]["note"] == 1
    with pytest.raises(StoreError, match="No trace"):
        store.meta("0" * 32)
    path = store.traces_dir / f"{keys[0]}.parquet"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(StoreError, match="unreadable"):
        store.meta(keys[0])


def test_kill_minus_nine_leaves_whole_traces(tmp_path):
    rng = random.Random(1234)
    want = expected(range(300))
    for attempt in range(10):
        before = n_files(tmp_path)
        proc = start_writer(tmp_path, 30 * attempt, 300)
        deadline = time.time() + 30
        while n_files(tmp_path) < before + 2:
            assert time.time() < deadline and proc.is_alive(), "writer made no progress"
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.03))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL
        store = TraceStore(tmp_path)
        assert store.unreadable() == []
        keys = store.keys()
        assert len(keys) > before and set(keys) <= set(want)
        assert sorted(store.summaries()["key"]) == keys
        for key in keys:
            assert store.get(key) == want[key]


def test_concurrent_writers_lose_nothing(tmp_path):
    a, b = start_writer(tmp_path, 0, 40), start_writer(tmp_path, 20, 60)
    for proc in (a, b):
        proc.join(timeout=120)
        assert proc.exitcode == 0
    want = expected(range(60))
    store = TraceStore(tmp_path)
    assert store.keys() == sorted(want)
    assert sorted(store.summaries()["key"]) == sorted(want)
    assert store.unreadable() == []
    for key, trace in want.items():
        assert store.get(key) == trace
    lines = store.index_path.read_bytes().splitlines()
    assert all(json.loads(line)["key"] in want for line in lines)  # no interleaved appends


def test_reader_during_writes(tmp_path):
    proc = start_writer(tmp_path, 0, 60)
    store = TraceStore(tmp_path)
    seen: set[str] = set()
    rounds = 0
    while proc.is_alive() or rounds == 0:
        rounds += 1
        listed = set(store.keys())  # every file that exists at all must be whole
        assert listed >= seen  # never loses a trace it already saw
        for key in listed - seen:
            assert len(store.get(key)) == 48
        assert set(store.summaries()["key"]) >= listed
        seen = listed
    proc.join()
    assert proc.exitcode == 0
    assert len(store.summaries()) == 60 and rounds > 1


def test_default_store_path(monkeypatch):
    monkeypatch.delenv("FORKPOINT_STORE", raising=False)
    assert default_store_path() == Path("./forkpoint-store")
    monkeypatch.setenv("FORKPOINT_STORE", "/tmp/elsewhere")
    assert default_store_path() == Path("/tmp/elsewhere")


def test_empty_store(tmp_path):
    store = TraceStore(tmp_path / "not-yet")
    assert store.keys() == [] and store.unreadable() == []
    assert list(store.summaries().columns) == list(SUMMARY_COLUMNS) and len(store.summaries()) == 0
    assert not (tmp_path / "not-yet").exists()


def test_files_of_store_format_1_without_checksum_still_read(tmp_path):
    """Stores written before the footer checksum (format 1) stay readable; only verify() notes it."""
    import json as _json

    from core.io.tracefile import META_KEY, encode, write_table

    trace = make_trace(20, seed=6, annotate=True)
    table = encode(trace, trace.key)
    record = _json.loads(table.schema.metadata[META_KEY])
    record["store_format"] = 1
    old = table.replace_schema_metadata({META_KEY: _json.dumps(record).encode()})
    store = TraceStore(tmp_path)
    store.traces_dir.mkdir(parents=True)
    with open(store.traces_dir / f"{trace.key}.parquet", "wb") as fh:
        write_table(old, fh)
    store.index_path.write_text('{"key": "%s", "id": [1, 2, 3], "f": 1, "s": []}\n' % trace.key)  # an old line
    assert store.get(trace.key) == trace and trace.key in store
    assert list(store.summaries()["key"]) == [trace.key]
    check = verify(store)
    assert check.ok and check.without_checksum == [trace.key]
    record["store_format"] = 2  # a format-2 file whose checksum went missing is damaged
    (store.traces_dir / f"{trace.key}.parquet").unlink()
    with open(store.traces_dir / f"{trace.key}.parquet", "wb") as fh:
        write_table(table.replace_schema_metadata({META_KEY: _json.dumps(record).encode()}), fh)
    with pytest.raises(StoreError, match="checksum is missing"):
        TraceStore(tmp_path).get(trace.key)


def test_root_of_a_problem_is_its_oldest_non_branch_trace(tmp_path):
    store = TraceStore(tmp_path)
    older = make_trace(20, seed=11, meta={"problem": {"id": "q7", "prompt": "x"}, "created": "2026-01-01T00:00:00"})
    newer = make_trace(20, seed=12, meta={"problem": {"id": "q7", "prompt": "x"}, "created": "2026-02-01T00:00:00"})
    child = make_trace(20, seed=13, meta={"problem": {"id": "q7", "prompt": "x"}, "created": "2025-01-01T00:00:00",
                                          "parent": older.key, "branch_pos": 3, "kind": "branch"})
    other = make_trace(20, seed=14, meta={"problem": {"id": "q8", "prompt": "y"}, "created": "2024-01-01T00:00:00"})
    for t in (newer, child, other, older):
        store.put(t)
    assert store.root_of("q7") == older.key  # the branch is older but is not a root
    assert store.root_of("q8") == other.key
    assert store.root_of("nope") is None
