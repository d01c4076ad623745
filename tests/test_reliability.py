"""Issue 16: damage is detected and never blocks the rest, writes are checked, bad input gets a message.

Store checksums and index CRCs, damaged traces set aside on a re-run, verify / repair / remove, temp
files of killed writers, short writes and full disks, permissions, strict JSON, CSV formula cells,
the context-length check and argument validation at the edges.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import random
import signal
import stat
import time

import numpy as np
import pytest
from click.testing import CliRunner
from fakes import make_trace
from spies import FeedLog

import core.io.atomic as atomic
from core.cli import main
from core.errors import InvalidInputError, StoreError, WriteError
from core.io.maintenance import verify
from core.io.store import TraceStore
from core.views.exports import export, read_jsonl

FORK = multiprocessing.get_context("fork")


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


def trace_path(store: TraceStore, key: str):
    return store.traces_dir / f"{key}.parquet"


def damage(path, how: str = "truncate") -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "zeros":
        path.write_bytes(bytes(len(data)))
    elif how == "header":  # a page header: thrift's reason spans several lines
        import pyarrow.parquet as pq

        column = pq.read_metadata(path).row_group(0).column(1)
        at = column.dictionary_page_offset or column.data_page_offset
        raw = bytearray(data)
        raw[at : at + 12] = bytes(b ^ 0xFF for b in raw[at : at + 12])
        path.write_bytes(bytes(raw))
    else:  # a data page, same size, footer intact: only a full read sees it
        raw = bytearray(data)
        for i in range(200, 260):
            raw[i] ^= 0xFF
        path.write_bytes(bytes(raw))


# -- checksums: a flipped bit never changes a trace silently -----------------------------------------


def test_single_bit_flips_in_the_footer_are_detected_or_harmless(tmp_path):
    trace = make_trace(40, seed=3, annotate=True)
    store = TraceStore(tmp_path / "s")
    key = store.put(trace)
    good = trace_path(store, key).read_bytes()
    footer_len = int.from_bytes(good[-8:-4], "little")
    blob = json.dumps(store.get(key).meta["key"]).encode()[1:-1]  # the key appears inside the JSON record
    record_at = good.rindex(blob)  # an offset inside the forkpoint record
    rng = random.Random(7)
    footer = range(len(good) - 8 - footer_len, len(good) - 8)
    positions = rng.sample(footer, 150) + [record_at + d for d in rng.sample(range(-400, 400), 100)]
    silent = []
    for n, pos in enumerate(positions):
        raw = bytearray(good)
        raw[pos] ^= 1 << rng.randrange(8)
        fresh = TraceStore(tmp_path / f"f{n}")
        fresh.traces_dir.mkdir(parents=True)
        trace_path(fresh, key).write_bytes(bytes(raw))
        try:
            back = fresh.get(key)
        except StoreError:
            assert key not in fresh and fresh.unreadable() and len(fresh.summaries()) == 0
            continue
        if back != trace or back.meta != trace.meta:
            silent.append(pos)
        else:
            assert fresh.summaries().iloc[0]["key"] == key
    assert silent == []


def test_an_index_line_edited_by_hand_is_not_believed(tmp_path):
    store = TraceStore(tmp_path)
    key = store.put(make_trace(20, seed=1, meta={"correct": False}))
    line = store.index_path.read_text()
    assert '"correct"' not in line and "false" in line
    store.index_path.write_text(line.replace("false", "true "))  # same length, same file identity
    fresh = TraceStore(tmp_path)
    assert fresh.summaries().set_index("key").loc[key, "correct"] == False  # noqa: E712  (from the footer)
    assert fresh.bad_index_lines == 1


def test_a_torn_index_line_does_not_swallow_the_next_append(tmp_path):
    store = TraceStore(tmp_path)
    store.put(make_trace(10, seed=1))
    with open(store.index_path, "ab") as fh:
        fh.write(b'{"key": "torn", "id": [1, 2')  # a writer killed mid-line, no newline
    key = store.put(make_trace(10, seed=2))
    lines = store.index_path.read_bytes().splitlines()
    assert lines[-1].startswith(f'{{"key": "{key}"'.encode()) and len(lines) == 3
    fresh = TraceStore(tmp_path)
    fresh.summaries()
    assert fresh.index.entries[key] and fresh.bad_index_lines == 1


def test_index_replaced_by_a_folder_gives_a_clear_error_and_repair_sets_it_aside(tmp_path):
    store = TraceStore(tmp_path / "s")
    store.put(make_trace(10, seed=1))
    store.index_path.unlink()
    store.index_path.mkdir()
    with pytest.raises(StoreError, match="index.jsonl is a folder"):
        TraceStore(store.path).summaries()
    code, out = cli("ls", "--store", str(store.path))
    assert code == 1 and "is a folder" in out and "forkpoint repair" in out
    (store.index_path / "kept.txt").write_text("the user's")
    code, out = cli("repair", "--store", str(store.path))  # sets the folder aside, kept, and rebuilds the index
    assert code == 0, out
    aside = list(store.damaged_dir.glob("index.jsonl.folder.*"))
    assert len(aside) == 1 and (aside[0] / "kept.txt").read_text() == "the user's"
    assert TraceStore(store.path).keys() == [k for k in TraceStore(store.path).summaries()["key"]]
    assert store.index_path.is_file() and len(TraceStore(store.path).summaries()) == 1


# -- damaged traces never block: re-runs, put, listing, export, analyze ----------------------------------


def test_put_on_a_damaged_key_rewrites_it_and_keeps_the_damaged_file_aside(tmp_path):
    store = TraceStore(tmp_path)
    trace = make_trace(30, seed=4)
    key = store.put(trace)
    for how in ("truncate", "zeros", "page"):
        damage(trace_path(store, key), how)
        fresh = TraceStore(tmp_path)
        assert key not in fresh  # a damaged file counts as absent: a re-run recomputes it
        assert fresh.put(trace) == key and fresh.get(key) == trace
    kept = store.set_aside_files()
    assert len(kept) == 3 and all(p.name.startswith(key) for p in kept)
    assert verify(TraceStore(tmp_path)).ok


def test_put_of_identical_content_writes_nothing(tmp_path):
    store = TraceStore(tmp_path)
    trace = make_trace(30, seed=4)
    key = store.put(trace)
    before = os.stat(trace_path(store, key))
    assert store.put(trace, overwrite=True) == key
    assert os.stat(trace_path(store, key)).st_ino == before.st_ino
    assert len(store.index_path.read_bytes().splitlines()) == 1
    changed = trace.annotate()
    changed.meta["answer"] = "graded since"
    store.put(changed, overwrite=True)
    assert store.get(key).meta["answer"] == "graded since" and len(store.index_path.read_bytes().splitlines()) == 2


def test_rerunning_score_or_generate_over_a_damaged_trace_recomputes_it(tmp_path, qwen_pair):
    from core.scoring.teacher_forced import score

    store = TraceStore(tmp_path)
    first = score(qwen_pair, "What is 2+3?", "5", store=store)
    damage(trace_path(store, first.key), "zeros")
    again = score(qwen_pair, "What is 2+3?", "5", store=TraceStore(tmp_path))
    assert again.key == first.key and np.allclose(again.metrics["cross_entropy"], first.metrics["cross_entropy"])
    assert TraceStore(tmp_path).get(first.key).key == first.key and len(store.set_aside_files()) == 1

    from core.decoding.generation import generate

    made = generate(qwen_pair, "What is 1+1?", max_new_tokens=4, store=store)
    damage(trace_path(store, made.key), "page")
    again = generate(qwen_pair, "What is 1+1?", max_new_tokens=4, store=TraceStore(tmp_path))
    assert again.token_ids.tolist() == made.token_ids.tolist() and TraceStore(tmp_path).get(made.key) == again
    assert len(store.set_aside_files()) == 2


def test_listing_marks_damage_and_batch_readers_skip_it(tmp_path):
    store = TraceStore(tmp_path / "s")
    keys = [store.put(make_trace(20, seed=s)) for s in range(4)]
    damage(trace_path(store, keys[0]), "page")  # data pages only: a footer-only listing would call it healthy
    damage(trace_path(store, keys[1]), "zeros")
    frame, bad = TraceStore(store.path).listing()
    assert sorted(frame["key"]) == sorted(keys[2:]) and {p.name[:-8] for p, _ in bad} == set(keys[:2])
    traces, bad = TraceStore(store.path).load_all()
    assert sorted(t.key for t in traces) == sorted(keys[2:]) and len(bad) == 2

    code, out = cli("ls", "--store", str(store.path))
    assert code == 0 and out.count("DAMAGED") == 2 and "2 unreadable" in out
    out_file = tmp_path / "all.jsonl"
    code, out = cli("export", "--store", str(store.path), "--out", str(out_file))
    assert code == 0 and "2 traces ->" in out and "2 unreadable" in out
    assert sorted(t.key for t in read_jsonl(out_file)) == sorted(keys[2:])
    code, out = cli("export", "--store", str(store.path), keys[0], "--out", str(tmp_path / "one.jsonl"))
    assert code == 1 and "unreadable" in out  # a key asked for by name is never dropped silently


@pytest.mark.slow
def test_analyze_skips_damaged_traces(tmp_path):
    store = TraceStore(tmp_path / "s")
    keys = [store.put(make_trace(40, seed=s, annotate=True)) for s in range(3)]
    damage(trace_path(store, keys[0]))
    code, out = cli("analyze", "--store", str(store.path), "--out", str(tmp_path / "report"))
    assert code == 0, out
    assert "1 unreadable" in out and (tmp_path / "report" / "report.html").exists()


def test_ls_on_a_missing_or_empty_store_says_so(tmp_path):
    code, out = cli("ls", "--store", str(tmp_path / "nope"))
    assert code == 1 and "No trace store at" in out
    (tmp_path / "empty").mkdir()
    code, out = cli("ls", "--store", str(tmp_path / "empty"))
    assert code == 0 and "has no traces" in out


def test_verify_repair_remove(tmp_path):
    store = TraceStore(tmp_path / "s")
    keys = [store.put(make_trace(20, seed=s)) for s in range(4)]
    damage(trace_path(store, keys[0]), "page")
    (store.traces_dir / "Bad Name.parquet").write_bytes(b"x")
    with open(store.index_path, "ab") as fh:
        fh.write(b'{"forged": 1}\n')
    check = verify(TraceStore(store.path))
    assert not check.ok and check.n_files == 5 and check.n_readable == 3
    assert {p.name for p, _ in check.damaged} == {f"{keys[0]}.parquet", "Bad Name.parquet"}
    assert check.bad_index_lines == 1 and check.index_lines == 5
    code, out = cli("verify", "--store", str(store.path))
    assert code == 1 and json.loads(out)["readable"] == 3

    code, out = cli("repair", "--store", str(store.path))
    report = json.loads(out)
    assert code == 0 and [e["key"] for e in report["set_aside"]] == [keys[0]]
    assert report["index_lines_after"] == 3 and len(report["not_moved"]) == 1
    assert keys[0] not in TraceStore(store.path).keys() and len(store.set_aside_files()) == 1

    code, out = cli("remove", "--store", str(store.path), keys[1], "--yes")
    assert code == 0 and keys[1] not in TraceStore(store.path).keys()
    code, out = cli("remove", "--store", str(store.path), "deadbeef", "--yes")
    assert code == 1 and "No trace with key 'deadbeef'" in out
    check = verify(TraceStore(store.path))
    assert check.n_readable == 2 and check.bad_index_lines == 0 and len(check.damaged) == 1
    code, out = cli("remove", "--store", str(store.path), "--damaged", "--yes")
    assert code == 0 and out.strip() == "removed Bad Name.parquet" and verify(TraceStore(store.path)).ok
    code, out = cli("remove", "--store", str(store.path), "--damaged", "--yes")
    assert code == 0 and "No unreadable" in out


def test_verify_and_repair_cover_the_calibration_store(tmp_path):
    """The gate calibration's rollouts live in a store of their own under the user's (calibration/): a damaged
    rollout fails `verify` and is set aside by `repair` there, the user's traces untouched."""
    store = TraceStore(tmp_path / "s")
    mine = store.put(make_trace(20, seed=1))
    rollouts = store.calibration_store()
    made = [rollouts.put(make_trace(20, seed=s)) for s in (2, 3)]
    assert store.keys() == [mine] and sorted(rollouts.keys()) == sorted(made)
    assert verify(TraceStore(store.path)).ok
    damage(trace_path(rollouts, made[0]), "page")
    code, out = cli("verify", "--store", str(store.path))
    report = json.loads(out)
    assert code == 1 and report["readable"] == 1 and not report["damaged"]
    assert report["calibration"]["readable"] == 1
    assert [d["path"] for d in report["calibration"]["damaged"]] == [str(trace_path(rollouts, made[0]))]
    code, out = cli("repair", "--store", str(store.path))
    report = json.loads(out)
    assert code == 0 and not report["set_aside"] and [e["key"] for e in report["calibration"]["set_aside"]] == [made[0]]
    again = TraceStore(store.path)
    assert again.keys() == [mine] and again.calibration_store().keys() == [made[1]]
    assert verify(again).ok and (store.calibration_store().path / "damaged").is_dir()


# -- temp files, short writes, full disks, permissions ----------------------------------------------


def _write_slowly(path: str, started) -> None:
    def write(fh):
        fh.write(b"x" * 1000)
        started.set()
        time.sleep(60)

    atomic.write_atomic(atomic.Path(path), write, binary=True)


def _writers_one_killed(paths: list) -> list:
    """A slow writer per path, each started and holding its temp file; the first is killed (kill -9).
    Returns the processes (the first dead, the others live)."""
    procs = []
    for path in paths:
        started = FORK.Event()
        proc = FORK.Process(target=_write_slowly, args=(str(path), started))
        proc.start()
        assert started.wait(30)
        procs.append(proc)
    os.kill(procs[0].pid, signal.SIGKILL)
    procs[0].join()
    return procs


def test_temp_files_of_killed_writers_are_removed_on_open_live_ones_kept(tmp_path, monkeypatch):
    store = TraceStore(tmp_path)
    key = store.put(make_trace(10, seed=1))
    procs = _writers_one_killed([store.traces_dir / f"{name}.parquet" for name in ("dead", "live")])
    monkeypatch.setattr(atomic, "STALE_TEMP_SECONDS", 0.0)
    try:
        fresh = TraceStore(tmp_path)
        assert [p.name.split(".")[1] for p in fresh.removed_temp_files] == ["dead"]
        assert [p.name.split(".")[1] for p in fresh.live_temp_files] == ["live"]
        assert [state for _, state in verify(fresh).temp_files] == ["removed: left by a writer that died", "in use"]
    finally:
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].join()
    assert TraceStore(tmp_path).keys() == [key]
    assert not [p for p in store.traces_dir.iterdir() if p.name.startswith(".")]


def test_short_writes_still_append_whole_index_lines(tmp_path, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(atomic.os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    store = TraceStore(tmp_path)
    keys = [store.put(make_trace(10, seed=s)) for s in range(3)]
    monkeypatch.undo()
    fresh = TraceStore(tmp_path)
    assert sorted(fresh.summaries()["key"]) == sorted(keys) and fresh.bad_index_lines == 0
    assert all(fresh.index.entries[k] for k in keys)  # every line was read back from the index


def test_a_failed_index_append_is_undone_and_does_not_fail_put(tmp_path, monkeypatch):
    store = TraceStore(tmp_path)
    store.put(make_trace(10, seed=1))
    size = store.index_path.stat().st_size
    real_write, calls = os.write, []

    def write(fd, data):  # half a line, then the file-size limit
        calls.append(1)
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(atomic.os, "write", write)
    key = store.put(make_trace(10, seed=2))  # the trace is stored; only its cache line is missing
    monkeypatch.undo()
    assert store.index_path.stat().st_size == size  # the torn half line was truncated away
    assert key in TraceStore(tmp_path) and len(TraceStore(tmp_path).summaries()) == 2


def _put_under_size_limit(root: str, limit: int, seeds: list[int], queue) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    store, out = TraceStore(root), []
    for seed in seeds:
        try:
            out.append(("stored", store.put(make_trace(10 if seed < 100 else 3000, seed=seed))))
        except WriteError as exc:
            out.append(("error", str(exc)))
    queue.put(out)


@pytest.mark.slow
def test_a_real_file_size_limit(tmp_path):
    store = TraceStore(tmp_path)
    size = trace_path(store, store.put(make_trace(10, seed=1))).stat().st_size
    with open(store.index_path, "ab") as fh:  # an index already past the limit: its appends fail
        fh.write(b"\n" * (size + 4000))
    # spawn, not fork: forking the multi-threaded test process (torch, grading worker threads) can deadlock
    spawn = multiprocessing.get_context("spawn")
    queue = spawn.Queue()
    proc = spawn.Process(target=_put_under_size_limit, args=(str(tmp_path), size + 2000, [2, 200], queue))
    proc.start()
    outcome = queue.get(timeout=180)
    proc.join()
    assert outcome[0] == ("stored", make_trace(10, seed=2).key)  # the trace fit; only its index line did not
    assert outcome[1][0] == "error" and "the file-size limit was reached; it was not written" in outcome[1][1]
    fresh = TraceStore(tmp_path)
    assert sorted(fresh.summaries()["key"]) == sorted([make_trace(10, seed=s).key for s in (1, 2)])
    assert verify(fresh).ok and verify(fresh).temp_files == []


def test_a_full_disk_while_writing_a_trace_is_a_clear_error(tmp_path, monkeypatch):
    store = TraceStore(tmp_path)
    first, trace = store.put(make_trace(10, seed=0)), make_trace(10, seed=1)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(WriteError, match=f"trace {trace.key} .*the disk is full; it was not written") as err:
        store.put(trace)
    monkeypatch.undo()
    assert f"The 1 trace(s) stored before it by this process are kept (last: {first})" in str(err.value)
    assert store.keys() == [first] and [p.name for p in store.traces_dir.iterdir()] == [f"{first}.parquet"]


def test_files_get_the_umask_mode_like_the_index(tmp_path):
    old = os.umask(0o027)
    try:
        store = TraceStore(tmp_path / "s")
        key = store.put(make_trace(10, seed=1))
        out = export([store.get(key)], tmp_path / "t.csv")
    finally:
        os.umask(old)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in (trace_path(store, key), store.index_path, out,
                                                      out.with_name("t.csv.meta.json"))}  # fmt: skip
    assert modes == {0o640}


def test_export_to_an_unwritable_path_names_the_flag(tmp_path):
    store = TraceStore(tmp_path / "s")
    store.put(make_trace(10, seed=1))
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "f").write_text("x")
    code, out = cli("export", "--store", str(store.path), "--out", str(locked / "f" / "x.jsonl"))
    assert code == 2 and "--out" in out and "not a folder" in out


# -- strict JSON and CSV cells ---------------------------------------------------------------------------


def test_nan_and_infinity_are_never_bare_in_jsonl(tmp_path):
    trace = make_trace(12, seed=2, meta={"answer": float("nan"), "custom": {"x": float("inf")}})
    trace.topk["base"][1][2, 1] = np.nan
    trace.metrics["logp_base"][:2] = [np.nan, -np.inf]
    path = export([trace], tmp_path / "t.jsonl")

    def strict(name):
        raise ValueError(f"bare {name}")

    record = json.loads(path.read_text(), parse_constant=strict)
    assert record["meta"]["answer"] is None and record["meta"]["custom"]["x"] is None
    back = read_jsonl(path)[0]
    assert np.isnan(back.topk["base"][1][2, 1]) and np.isnan(back.metrics["logp_base"][:2]).all()
    assert np.array_equal(back.topk["base"][1][3:], trace.topk["base"][1][3:])


def test_csv_text_cells_cannot_run_as_formulas(tmp_path):
    import csv

    trace = make_trace(text="=1+1 @SUM(A1) +cmd -2 ok", seed=3)
    trace.meta["problem"]["id"] = "=HYPERLINK(1)"
    path = export([trace], tmp_path / "t.csv")
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    cells = [row["token"] for row in rows]
    assert cells[0] == "'=1+1" and all(not c.startswith(("=", "+", "-", "@")) for c in cells)
    assert any(float(row["logp_base"]) < 0 for row in rows)  # numeric columns keep their minus sign


# -- arguments and context length at the edges -------------------------------------------------------


def test_score_arguments_are_validated(qwen_pair):
    from core.scoring.teacher_forced import score

    with pytest.raises(InvalidInputError, match="chunk must be a whole number ≥ 1, got 0"):
        score(qwen_pair, "p", "r", chunk=0)
    with pytest.raises(InvalidInputError, match="response must be text or a list of token ids, got int"):
        score(qwen_pair, "p", 5)
    with pytest.raises(InvalidInputError, match="lone surrogate"):
        score(qwen_pair, "p", "a\ud800")


def test_prompts_that_do_not_fit_the_context_are_refused_fast(tmp_path, qwen_pair, monkeypatch):
    from core.decoding.generation import generate
    from core.scoring.teacher_forced import score

    for side in ("base", "reason"):
        monkeypatch.setattr(qwen_pair.model(side).config, "max_position_embeddings", 64)
    assert qwen_pair.context_length("base") == 64
    store = TraceStore(tmp_path)
    feeds = FeedLog(qwen_pair, monkeypatch)
    with pytest.raises(InvalidInputError, match="context is 64 tokens: it does not fit"):
        generate(qwen_pair, "what is 2+2? " * 8000, max_new_tokens=8, store=store)
    assert feeds.calls == []  # refused after tokenising: no forward over 100k characters
    with pytest.raises(InvalidInputError, match="exceeds"):
        score(qwen_pair, "what is 2+2? " * 30, "4")
    assert store.keys() == []
    assert qwen_pair.check_context(qwen_pair.prompt_ids("hi"), 8) == 8
    assert qwen_pair.check_context(qwen_pair.prompt_ids("hi"), 1000) == 64 - max(
        len(v) for v in qwen_pair.prompt_ids("hi").values())


def test_generation_stops_where_the_context_ends(qwen_pair, monkeypatch):
    """prompt + max_new_tokens past the context: the response stops at the last position that fits, and
    the trace says so (positions past the context would be meaningless)."""
    from core.decoding.generation import generate

    for side in ("base", "reason"):
        monkeypatch.setattr(qwen_pair.model(side).config, "max_position_embeddings", 40)
    prompt = "what is 2+2?"
    room = 40 - max(len(v) for v in qwen_pair.prompt_ids(prompt).values())
    eos = set(qwen_pair.eos_ids)
    monkeypatch.setattr(qwen_pair, "eos_ids", frozenset())  # nothing stops the row but the context
    for lookahead in (1, None):
        trace = generate(qwen_pair, prompt, max_new_tokens=room + 25, lookahead=lookahead)
        assert len(trace) == room, lookahead
        assert trace.meta["context_limit"] == {"max_response_tokens": room}
    monkeypatch.setattr(qwen_pair, "eos_ids", eos)
    short = generate(qwen_pair, prompt, max_new_tokens=3, lookahead=1)
    assert "context_limit" not in short.meta and len(short) <= 3


def test_cli_messages_instead_of_tracebacks(tmp_path, tiny_dirs):
    pair = ["--base", str(tiny_dirs["qwen_base"]), "--reason", str(tiny_dirs["qwen_reason"]), "--device", "cpu"]
    code, out = cli("score", *pair, "--prompt", "x", "--response", f"@{tmp_path / 'missing.txt'}")
    assert code == 2 and "--response" in out and "No such file" in out
    bad = tmp_path / "bad.txt"
    bad.write_text("x")
    code, out = cli("import", *pair, "--store", str(tmp_path / "s"), str(bad))
    assert code == 1 and "Unknown import format 'txt'" in out


@pytest.mark.parametrize(("args", "flag"), [
    (["generate", "--batch-size", "0"], "--batch-size"),
    (["generate", "--limit", "0"], "--limit"),
    (["eval", "--budgets", "abc"], "--budgets"),
])  # fmt: skip
def test_bad_flag_values_name_the_flag(tmp_path, args, flag):
    code, out = cli(*args, "--store", str(tmp_path / "s"))
    assert code == 2 and flag in out and not (tmp_path / "s").exists()


def test_unknown_model_type_mentions_trust_remote_code(tmp_path, tiny_dirs):
    import shutil

    model = tmp_path / "custom"
    shutil.copytree(tiny_dirs["qwen_base"], model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "foobarnet"}))
    code, out = cli("score", "--base", str(model), "--reason", str(model), "--prompt", "x", "--response", "y")
    assert code == 1 and "foobarnet" in out and "--trust-remote-code" in out


def test_unreadable_reasons_are_one_line_each(tmp_path):
    """Issue 24.12: `ls --unreadable` prints one line per damaged file (pyarrow's reasons hold newlines)."""
    store = TraceStore(tmp_path / "s")
    keys = [store.put(make_trace(20, seed=s)) for s in range(4)]
    for key, how in zip(keys, ("truncate", "header", "page")):
        damage(trace_path(store, key), how)
    raw = [reason for _, reason in TraceStore(store.path).unreadable()]
    assert any("\n" in r for r in raw)  # the case this test is about
    code, out = cli("ls", "--store", str(store.path), "--unreadable")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3 and all(line.count("\t") == 1 for line in lines), out
    from core.cli.common import terminal_text  # issue 33.6: a control byte in pyarrow's reason is shown escaped

    assert [line.split("\t")[1] for line in lines] == [terminal_text(" ".join(r.split())) for r in raw]
    code, out = cli("ls", "--store", str(store.path))
    assert len([line for line in out.splitlines() if line.startswith("  ") and ".parquet: " in line]) == 3


def test_a_killed_exports_temp_file_is_removed_by_the_next_export_and_verify_reports_removals(tmp_path, monkeypatch):
    """Issue 24.9: kill -9 during an export leaves `.all.parquet.XXXX.tmp`; the next export to that folder
    removes it (a live writer's is kept, other files are never touched); verify says what opening removed."""
    out = tmp_path / "out"
    out.mkdir()
    (out / ".other.parquet.abcdef12.tmp").write_bytes(b"not ours")
    procs = _writers_one_killed([out / "all.parquet", out / "all.parquet"])
    monkeypatch.setattr(atomic, "STALE_TEMP_SECONDS", 0.0)
    try:
        assert len([p for p in out.iterdir() if p.name.startswith(".all.parquet.")]) == 2
        export([make_trace(10, seed=1)], out / "all.parquet", overwrite=True)
        left = sorted(p.name for p in out.iterdir())
        assert len([n for n in left if n.startswith(".all.parquet.")]) == 1  # the live writer's
        assert "all.parquet" in left and ".other.parquet.abcdef12.tmp" in left
    finally:
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].join()

    store = TraceStore(tmp_path / "s")
    store.put(make_trace(10, seed=2))
    started = FORK.Event()
    proc = FORK.Process(target=_write_slowly, args=(str(store.traces_dir / "x.parquet"), started))
    proc.start()
    assert started.wait(30)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    code, text = cli("verify", "--store", str(store.path))
    report = json.loads(text)
    assert code == 0 and [t["state"] for t in report["temp_files"]] == ["removed: left by a writer that died"]
    assert not [p for p in store.traces_dir.iterdir() if p.name.startswith(".")]


def test_the_default_response_length_leaves_half_a_small_context_for_the_prompt(qwen_pair, monkeypatch):
    """The length asked for when none is given: the setting, or half the shorter context when that is less
    (the demo pair's 192 tokens: 96), so a default never overruns the context beside its prompt."""
    from core import settings
    from core.demo.pair import demo_pair

    assert qwen_pair.context_length("base") > 2 * settings.MAX_NEW_TOKENS
    assert qwen_pair.default_max_new_tokens() == settings.MAX_NEW_TOKENS
    demo = demo_pair()
    assert (demo.context_length("base"), demo.context_length("reason")) == (192, 192)
    assert demo.default_max_new_tokens() == 96 and demo.default_max_new_tokens(64) == 64
    for side, limit in (("base", 100), ("reason", 150)):
        monkeypatch.setattr(qwen_pair.model(side).config, "max_position_embeddings", limit)
    assert qwen_pair.default_max_new_tokens() == 50 and qwen_pair.default_max_new_tokens(1000) == 50


def test_a_context_overrun_is_said_once_per_pair(qwen_pair, monkeypatch, caplog):
    """Issue 22: a few minutes of the demo app logged 124 identical "exceeds the context" warnings."""
    import logging

    for side in ("base", "reason"):
        monkeypatch.setattr(qwen_pair.model(side).config, "max_position_embeddings", 40)
    monkeypatch.setattr(qwen_pair, "_context_warned", set(), raising=False)
    with caplog.at_level(logging.WARNING, logger="core.pair.loading"):
        for prompt in ("what is 2+2?", "what is 3+3?", "what is 4+4?"):
            qwen_pair.check_context(qwen_pair.prompt_ids(prompt), 100)
    said = [r for r in caplog.records if "exceeds" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(said) == 2 and {"base", "reason"} == {r.args[2] for r in said}  # one per model


# -- issue 33: side files (notes) are isolated like trace files ----------------------------------------


def _store_with_notes(tmp_path, n: int = 6):
    from core.io import notes as nt

    store = TraceStore(tmp_path / "s")
    keys = [store.put(make_trace(12, seed=s)) for s in range(n)]
    for i, key in enumerate(keys):
        nt.add_note(store, key, 1, 2, f"note {i}")
    return store, keys


@pytest.mark.parametrize("damage_how", ["truncate", "deep", "not_utf8", "folder"])
def test_a_damaged_notes_file_is_reported_and_never_stops_the_export(tmp_path, damage_how):
    from core.io import notes as nt

    store, keys = _store_with_notes(tmp_path)
    bad = nt.notes_path(store, keys[2])
    if damage_how == "truncate":  # `truncate -s 10`
        bad.write_bytes(bad.read_bytes()[:10])
    elif damage_how == "deep":
        bad.write_text("[" * 5000 + "]" * 5000)
    elif damage_how == "not_utf8":
        bad.write_bytes(b'{"forkpoint_notes": 1, "notes": [\xff]}')
    else:
        bad.unlink()
        bad.mkdir()
    for fmt in ("jsonl", "csv", "html"):
        out = tmp_path / f"x.{fmt}"
        code, text = cli("export", "--store", str(store.path), "--out", str(out))
        assert code == 0, text
        assert f"{len(keys)} traces -> {out} (1 without their damaged notes)" in text
        assert "1 damaged notes file(s) left out" in text and bad.name in text
    back = {t.key: t for t in read_jsonl(tmp_path / "x.jsonl")}
    assert set(back) == set(keys)
    assert [n["text"] for n in back[keys[0]].annotations["notes"]] == ["note 0"]
    assert "notes" not in back[keys[2]].annotations

    code, text = cli("verify", "--store", str(store.path))
    found = json.loads(text)
    assert code == 1 and not found["ok"] and [d["path"] for d in found["damaged_side_files"]] == [str(bad)]
    assert found["damaged"] == [] and found["readable"] == len(keys)
    code, text = cli("repair", "--store", str(store.path))
    report = json.loads(text)
    assert code == 0 and report["ok"] and [e["key"] for e in report["set_aside"]] == [keys[2]]
    assert not bad.exists() and any(p.name.startswith(f"{keys[2]}.notes.") for p in store.set_aside_files())
    assert verify(TraceStore(store.path)).ok
    assert [n.text for n in nt.read_notes(store, keys[3])] == ["note 3"]  # the others untouched
    nt.add_note(store, keys[2], 0, 0, "a fresh note")  # the set-aside file no longer blocks a write
    assert [n.text for n in nt.read_notes(store, keys[2])] == ["a fresh note"]


def test_attach_notes_reports_damage_per_trace(tmp_path):
    from core.io import notes as nt

    store, keys = _store_with_notes(tmp_path, 3)
    nt.notes_path(store, keys[1]).write_text('{"forkpoint_notes": 1, "notes": [{"id": 3}]}')
    damaged: list = []
    traces = nt.attach_notes(store, [store.get(k) for k in keys], damaged=damaged)
    assert [bool(t.annotations.get("notes")) for t in traces] == [True, False, True]
    assert [p for p, _ in damaged] == [nt.notes_path(store, keys[1])] and "damaged" in damaged[0][1]
    (store.path / "notes" / "Bad Name.json").write_text("{}")  # a file name that is no key is listed, not raised
    assert {p.name for p, _ in nt.unreadable_notes(store)} == {f"{keys[1]}.json", "Bad Name.json"}


def test_repair_exits_non_zero_when_a_damaged_file_cannot_be_moved(tmp_path, monkeypatch):
    store = TraceStore(tmp_path / "s")
    keys = [store.put(make_trace(20, seed=s)) for s in range(2)]
    damage(trace_path(store, keys[0]), "page")

    def refuse(self, key, why=""):  # e.g. damaged/ on a read-only mount (root ignores chmod here)
        raise WriteError(f"Cannot move damaged trace {key} aside: permission denied")

    monkeypatch.setattr(TraceStore, "set_aside", refuse)
    code, text = cli("repair", "--store", str(store.path))
    report = json.loads(text[: text.rindex("}") + 1])
    assert code == 1 and not report["ok"] and [f["path"] for f in report["failed"]] == [str(trace_path(store, keys[0]))]
    assert "could not be moved aside" in text and trace_path(store, keys[0]).exists()


def test_maintenance_uses_only_the_stores_public_api_and_the_store_does_not_import_it():
    import ast
    import inspect

    import core.io.maintenance as maintenance
    import core.io.store as store_module

    tree = ast.parse(inspect.getsource(maintenance))
    private = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
                      and isinstance(n.value, ast.Name) and n.value.id == "store"})
    assert private == []
    imported = {a.name for n in ast.walk(ast.parse(inspect.getsource(store_module))) if isinstance(n, ast.ImportFrom)
                for a in n.names} | {n.module for n in ast.walk(ast.parse(inspect.getsource(store_module)))
                                     if isinstance(n, ast.ImportFrom)}
    assert "maintenance" not in imported and "core.io.maintenance" not in imported


@pytest.mark.parametrize("address", ["999.1.1.1", "no-such-host.invalid", "8.8.8.8", "1.2.3.4.5", "\udc80x"])
def test_app_with_a_bad_address_is_a_clean_message_before_streamlit_starts(address, monkeypatch):
    import subprocess

    def started(*args, **kwargs):
        raise AssertionError("Streamlit was started with a bad --address")

    monkeypatch.setattr(subprocess, "Popen", started)
    result = CliRunner().invoke(main, ["app", "--address", address])
    assert result.exit_code == 2 and "--address" in result.output, (result.output, result.exception)
    assert "Traceback" not in result.output and "gaierror" not in result.output


# -- issue 33.2: every text is checked once where it enters (lone surrogates, NUL, size) -------------------


@pytest.fixture()
def no_pair(monkeypatch):
    import core.cli.common as common
    import core.cli.traces as traces

    def loaded(*args, **kwargs):
        raise AssertionError("a model pair was loaded before the text was checked")

    for mod in (common, traces):
        monkeypatch.setattr(mod, "pair_from_options", loaded)


SURROGATE_BYTES = os.fsdecode(b"bad \xed\xa0\x80 x")  # $'bad \xed\xa0\x80 x' as Python decodes argv


@pytest.mark.parametrize("args, flag, why", [
    (["score", "--prompt", SURROGATE_BYTES, "--response", "x y"], "--prompt", "not UTF-8 text: byte 0xed"),
    (["score", "--prompt", "p", "--response", "a\ud800b"], "--response", "lone surrogate (\\ud800"),
    (["score", "--prompt", "p\x00q", "--response", "x"], "--prompt", "NUL character"),
    (["generate", "--prompt", SURROGATE_BYTES], "--prompt", "not UTF-8 text"),
    (["generate", "--prompt", "x", "--base-format", "{problem}\x00"], "--base-format", "NUL"),
    (["search", "a\udcffb"], "PATTERN", "not UTF-8 text: byte 0xff"),
    (["takeover", "0" * 32, "--at", "3='\ud800'"], "--at", "lone surrogate"),
])  # fmt: skip
def test_bad_text_in_a_flag_is_refused_naming_it_before_any_model_loads(tmp_path, no_pair, args, flag, why):
    result = CliRunner().invoke(main, [*args, "--store", str(tmp_path / "s")])
    assert result.exit_code == 2, (result.output, result.exception)
    assert flag in result.output and why in result.output and "Traceback" not in result.output, result.output


def test_bad_text_in_a_response_file_or_problem_file_names_the_file_line_and_field(tmp_path, no_pair):
    resp = tmp_path / "r.txt"
    resp.write_text("fine\x00not fine")
    code, out = cli("score", "--prompt", "p", "--response", f"@{resp}")
    assert code == 2 and "--response" in out and "r.txt" in out and "NUL" in out
    problems = tmp_path / "p.jsonl"
    problems.write_text('{"question": "ok", "answer": "1"}\n{"question": "bad \\ud800 x", "answer": "2"}\n')
    code, out = cli("generate", "--problems", str(problems), "--store", str(tmp_path / "s"))
    assert code == 1 and f"{problems}:2: field 'question' holds a lone surrogate" in out, out
    from core.evaluation.problems import load_problems

    assert [p.prompt for p in load_problems(problems, skip_bad=True)] == ["ok"]


def test_the_api_refuses_bad_text_with_a_clear_error(qwen_pair):
    import core

    for prompt, response in (("a\ud800", "x y"), ("p", "x\udc80"), ("p", "x" * (core.settings.MAX_TEXT_CHARS + 1))):
        with pytest.raises(InvalidInputError, match="problem text|response"):
            core.score(qwen_pair, prompt, response)


def test_import_texts_are_named_by_line_and_field(tmp_path):
    import pandas as pd

    from core.io.foreign import read_foreign_jsonl

    bad_csv = tmp_path / "x.csv"
    bad_csv.write_bytes(b"id,prompt,response\na,p,fine\nb,p\xff,not utf-8\nc,p,has \\u0000 no\nd,p,nul\x00here\n")
    good, errors = read_foreign_jsonl(bad_csv)
    assert [r.id for r in good] == ["a", "c"]
    assert dict(errors) == {3: "field 'prompt' is not UTF-8 text: byte 0xff at character 1 is not valid UTF-8 "
                               "(save the file or text as UTF-8)",
                            5: "field 'response' holds a NUL character (at character 3); remove it"}
    pq_path = tmp_path / "x.parquet"
    pd.DataFrame({"id": ["a", "b"], "prompt": ["p", "q"], "response": [5, 6]}).to_parquet(pq_path)
    good, errors = read_foreign_jsonl(pq_path)
    assert good == [] and errors[0] == (1, "'response' must be a string or a list of token ids, got int 5")
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text('{"id": "a", "prompt": 3, "response": "r"}\n')
    assert read_foreign_jsonl(jsonl)[1] == [(1, "'prompt' must be a string, got int 3")]


def test_import_refuses_a_device_and_a_parquet_file_read_as_text_before_any_model_loads(tmp_path, monkeypatch):
    import pandas as pd

    import core.cli.store as store_cli

    def loaded(*args, **kwargs):
        raise AssertionError("a model pair was loaded before the file was checked")

    monkeypatch.setattr(store_cli, "pair_or_spec", loaded)
    code, out = cli("import", "/dev/zero", "--format", "jsonl", "--store", str(tmp_path / "s"))
    assert code == 1 and "/dev/zero is not a regular file" in out and "No such file" not in out
    pq_path = tmp_path / "x.parquet"
    pd.DataFrame({"id": ["a"], "prompt": ["p\x1b]0;T\x07"], "response": ["r"]}).to_parquet(pq_path)
    code, out = cli("import", str(pq_path), "--format", "csv", "--store", str(tmp_path / "s"))
    assert code == 1 and "is a Parquet file (it starts and ends with PAR1), not csv" in out
    assert all(ch in "\n\t" or " " <= ch < "\x7f" or ch > "\x9f" for ch in out), repr(out)


# -- issue 33.6: one sanitiser for everything printed to a terminal ---------------------------------------------


def test_terminal_text_shows_every_control_and_escape_escaped():
    from hypothesis import given
    from hypothesis import strategies as st

    from core.cli.common import terminal_text

    assert terminal_text("a\x1b]0;title\x07b\x1b[31mred\r\x9b\u202etxt\udc80\tx\ny") == \
        "a\\x1b]0;title\\x07b\\x1b[31mred\\x0d\\x9b\\u202etxt\\udc80\tx\ny"

    @given(st.text())
    def safe(text):
        out = terminal_text(text)
        assert not any(ord(c) < 0x20 and c not in "\t\n" or 0x7f <= ord(c) <= 0x9f or 0xD800 <= ord(c) <= 0xDFFF
                       for c in out)
        out.encode("utf-8")  # always printable (a lone surrogate would raise here)

    safe()


def test_ls_search_and_messages_print_stored_text_escaped(tmp_path):
    hostile = "p\x1b]0;PWNED\x07\x1b[2J\r\x07"
    store = TraceStore(tmp_path / "s")
    store.put(make_trace(10, seed=1, text="the answer \x1b]0;T\x07 is four", meta={
        "problem": {"id": hostile, "prompt": hostile, "gold": "4"}}))
    for args in (["ls"], ["ls", "--csv"], ["search", "answer"], ["export", "--out", str(tmp_path / "x.jsonl")]):
        code, out = cli(*args, "--store", str(store.path))
        assert code == 0, out
        assert "\x1b" not in out and "\x07" not in out and "\r" not in out, (args, repr(out))
    assert "p\\x1b]0;PWNED\\x07" in cli("ls", "--store", str(store.path))[1]


# -- issue 33.9: messages and exit codes ---------------------------------------------------------------------


def test_remove_checks_every_key_before_asking(tmp_path):
    store = TraceStore(tmp_path / "s")
    key = store.put(make_trace(10, seed=1))
    for bad in ("../../x", "a/b", ".hidden"):
        result = CliRunner().invoke(main, ["remove", "--store", str(store.path), key, bad], input="y\n")
        assert result.exit_code == 2 and "Invalid trace key" in result.output and "KEYS" in result.output
        assert "Delete" not in result.output and key in TraceStore(store.path).keys()
    result = CliRunner().invoke(main, ["remove", "--store", str(store.path), key, "f" * 32], input="y\n")
    assert result.exit_code == 1 and "No trace with key 'ffff" in result.output and "Delete" not in result.output
    assert key in TraceStore(store.path).keys()


def _odd_model(tmp_path):
    from conftest import TINY

    from core.demo.tiny import build_tiny_model, build_tiny_tokenizer

    other = build_tiny_tokenizer(["Completely different words: zebra quantum xylophone jazz."] * 3, vocab_size=300)
    return build_tiny_model(tmp_path / "odd", other, "qwen3", seed=5, **TINY)


def test_a_pair_is_checked_on_its_tokenizers_before_any_weights_load(tmp_path, tiny_dirs, monkeypatch):
    import transformers

    import core

    odd = _odd_model(tmp_path)

    def weights(*args, **kwargs):
        raise AssertionError("weights were loaded before the vocabularies were compared")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", weights)
    with pytest.raises(core.VocabularyMismatchError, match="tokenizers differ"):
        core.load_pair(str(tiny_dirs["qwen_base"]), str(odd), device="cpu")
    result = CliRunner().invoke(main, ["score", "--base", str(tiny_dirs["qwen_base"]), "--reason", str(odd),
                                       "--prompt", "p", "--response", "r", "--device", "cpu"])
    assert result.exit_code == 2 and "--base / --reason" in result.output and "tokenizers differ" in result.output
    for flag, args in (("--base", [str(tmp_path / "nope"), str(odd)]), ("--reason", [str(odd), str(tmp_path / "nope")])):
        result = CliRunner().invoke(main, ["score", "--base", args[0], "--reason", args[1], "--prompt", "p",
                                           "--response", "r", "--device", "cpu"])
        assert result.exit_code == 2 and f"Invalid value for {flag}" in result.output and "does not exist" in \
            result.output, result.output
    with pytest.raises(core.ModelLoadError) as err:
        core.load_pair(str(odd), str(tmp_path / "nope"), device="cpu")
    assert err.value.side == "reason"


def test_a_self_pair_with_different_default_formats_says_so(tiny_dirs, caplog):
    import core

    same = str(tiny_dirs["qwen_base"])
    with caplog.at_level("WARNING"):
        pair = core.load_pair(same, same, device="cpu", dtype="float32")
    assert pair.formats["base"].spec != pair.formats["reason"].spec
    assert any("same model" in r.getMessage() and "prompt format" in r.getMessage() for r in caplog.records)
    caplog.clear()
    fmt = "Q: {problem}\nA:"
    with caplog.at_level("WARNING"):
        core.load_pair(same, same, device="cpu", dtype="float32", base_format=fmt, reason_format=fmt)
    assert not any("same model" in r.getMessage() for r in caplog.records)


def test_a_problem_that_cannot_run_is_reported_and_skipped_and_the_run_exits_1(tmp_path, tiny_dirs, monkeypatch):
    from core.pair.loading import ModelPair

    monkeypatch.setattr(ModelPair, "context_length", lambda self, side: 64)
    problems = tmp_path / "p.jsonl"
    problems.write_text("\n".join(json.dumps(r) for r in [
        {"id": "short1", "question": "2+2?", "answer": "4"},
        {"id": "long", "question": "what is 2+2? " * 60, "answer": "4"},
        {"id": "short2", "question": "3+3?", "answer": "6"}]) + "\n")
    pair = ["--base", str(tiny_dirs["qwen_base"]), "--reason", str(tiny_dirs["qwen_reason"]), "--device", "cpu"]
    code, out = cli("generate", *pair, "--problems", str(problems), "--store", str(tmp_path / "s"),
                    "--max-new-tokens", "4")
    assert code == 1, out
    assert "problem long: The prompt is" in out and "does not fit" in out and "1 problem(s) skipped: long" in out
    stored = TraceStore(tmp_path / "s").summaries()
    assert sorted(stored["problem"]) == ["short1", "short2"]


# -- issue 33.8: a full disk leaves nothing behind ------------------------------------------------------------


def _disk_full_after(monkeypatch, files: int) -> None:
    """The disk fills up after `files` whole files: every later file's fsync fails with ENOSPC (folders' pass)."""
    real = os.fsync
    left = [files]

    def fsync(fd):
        if stat.S_ISREG(os.fstat(fd).st_mode):
            left[0] -= 1
            if left[0] < 0:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)


@pytest.mark.parametrize("room", [0, 1])  # the CSV fails / the CSV is written, its sidecar fails
def test_a_failed_csv_export_leaves_no_sidecar_and_no_folder(tmp_path, monkeypatch, room):
    from core.views.exports import sidecar_path

    traces = [make_trace(10, seed=s) for s in range(2)]
    out = tmp_path / "new" / "deeper" / "x.csv"
    _disk_full_after(monkeypatch, room)
    with pytest.raises(WriteError, match="the disk is full"):
        export(traces, out)
    assert not out.exists() and not sidecar_path(out).exists() and not (tmp_path / "new").exists()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    export(traces, out)
    assert out.exists() and sidecar_path(out).exists()


def test_a_failed_analyze_leaves_no_folder_and_a_html_out_is_a_file(tmp_path, monkeypatch):
    store = TraceStore(tmp_path / "s")
    for s in range(3):
        store.put(make_trace(30, seed=s, annotate=True))
    before = set(tmp_path.iterdir())
    _disk_full_after(monkeypatch, 2)  # two tables written, then the disk is full
    code, out = cli("analyze", "--store", str(store.path), "--out", str(tmp_path / "a" / "report"))
    assert code == 1 and "the disk is full" in out, out
    assert set(tmp_path.iterdir()) == before  # no folder, no temp folder, no part of the tables
    code, out = cli("analyze", "--store", str(store.path), "--out", str(tmp_path / "r.html"))
    assert code == 1 and set(tmp_path.iterdir()) == before
    monkeypatch.undo()
    code, out = cli("analyze", "--store", str(store.path), "--out", str(tmp_path / "r.html"))
    assert code == 0 and (tmp_path / "r.html").is_file() and "<html" in (tmp_path / "r.html").read_text()
    assert set(tmp_path.iterdir()) == before | {tmp_path / "r.html"}
    code, out = cli("analyze", "--store", str(store.path), "--out", str(tmp_path / "a" / "report"))
    folder = tmp_path / "a" / "report"
    assert code == 0 and (folder / "report.html").is_file() and len(list(folder.glob("*.csv"))) >= 3
    (folder / "mine.txt").write_text("kept")
    code, out = cli("analyze", "--store", str(store.path), "--out", str(folder), "--overwrite")
    assert code == 0 and (folder / "mine.txt").read_text() == "kept"
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")]


# -- issue 33.7: --base-format / --reason-format with the demo pair --------------------------------------------


def test_formats_are_checked_before_loading_and_applied_to_the_demo_pair(tmp_path, monkeypatch):
    import core.cli.common as common

    def loaded(*args, **kwargs):
        raise AssertionError("a model pair was loaded before the format was checked")

    with monkeypatch.context() as m:
        m.setattr(common, "load_pair", loaded, raising=False)
        m.setattr("core.demo.pair.load_pair", loaded)
        for flag, bad in (("--base-format", "no placeholder"), ("--reason-format", "chat:maybe")):
            result = CliRunner().invoke(main, ["score", flag, bad, "--prompt", "p", "--response", "r"])
            assert result.exit_code == 2 and f"Invalid value for '{flag}'" in result.output, result.output
    code, out = cli("score", "--prompt", "12+7", "--response", "19", "--base-format", "Q {problem} A",
                    "--reason-format", "Q {problem} A", "--store", str(tmp_path / "s"))
    assert code == 0, out
    trace = TraceStore(tmp_path / "s").get(out.split("key ")[1].split()[0])
    assert trace.meta["formats"] == {"base": "Q {problem} A", "reason": "Q {problem} A"}  # applied, not ignored
    assert trace.prompt_ids["base"] != core_demo_prompt_ids("12+7")["base"]


def core_demo_prompt_ids(problem):
    from core.demo.pair import demo_pair

    return demo_pair().prompt_ids(problem)


# -- issue 33.10: found from a wheel install ---------------------------------------------------------------------


def test_demo_measure_never_writes_into_the_installed_package(tmp_path, monkeypatch):
    from pathlib import Path

    import core.reports.demo_card as card
    import core.packaged as packaged
    from core.demo.pair import DEMO_DIR

    installed = lambda path: Path(path).resolve() == DEMO_DIR.resolve()  # noqa: E731  the pair as a wheel ships it
    monkeypatch.setattr(packaged, "is_installed", installed)
    monkeypatch.setattr(card, "is_installed", installed)
    with pytest.raises(InvalidInputError, match="inside the installed forkpoint package"):
        card.write_card(DEMO_DIR, n=1, samples=1)  # refused before anything loads or is written
    calls = []
    monkeypatch.setattr(card, "write_card", lambda source, **kw: calls.append((Path(source), kw["out"])))
    monkeypatch.chdir(tmp_path)
    code, out = cli("demo", "measure", "--limit", "2", "--samples", "1")
    assert code == 0 and calls == [(DEMO_DIR, tmp_path)], (out, calls)
    assert f"{tmp_path / 'CARD.md'} and {tmp_path / 'measure.json'}" in out  # says where it wrote
    code, out = cli("demo", "measure", "--limit", "2", "--out", str(DEMO_DIR))
    assert code == 2 and "--out" in out and "installed" in out
    code, out = cli("demo", "measure", "--limit", "2", "--out", str(tmp_path / "card"))
    assert code == 0 and calls[-1] == (DEMO_DIR, tmp_path / "card")


def test_is_installed_knows_the_wheels_files():
    from importlib import resources
    from pathlib import Path

    from core.packaged import CHECKOUT_ASSETS, is_installed

    assert is_installed(Path(str(resources.files("core") / "_assets")) / "demo" / "CARD.md")
    assert not is_installed(CHECKOUT_ASSETS / "demo") and not is_installed(Path.cwd())


def test_note_text_is_checked_where_it_enters(tmp_path):
    from core.io import notes as nt

    store, keys = _store_with_notes(tmp_path, 1)
    for bad, why in (("a\ud800", "lone surrogate"), ("a\x00b", "NUL")):
        with pytest.raises(InvalidInputError, match=why):
            nt.add_note(store, keys[0], 0, 0, bad)
        note = nt.read_notes(store, keys[0])[0]
        with pytest.raises(InvalidInputError, match=why):
            nt.edit_note(store, keys[0], note.id, text=bad)
    assert [n.text for n in nt.read_notes(store, keys[0])] == ["note 0"] and verify(TraceStore(store.path)).ok
