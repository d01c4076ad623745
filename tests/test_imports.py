"""core.io.imports / core.io.foreign: per-record imports of foreign JSONL, CSV and Parquet files.

Every record is stored, skipped (duplicate / already stored) or failed with its line and reason; the
report matches the store, also after Ctrl-C, a full disk or kill -9.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import signal
import stat
import time
import tracemalloc

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fakes import make_trace
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import core.io.atomic as atomic
from core.errors import InvalidInputError, ModelLoadError
from core.io.foreign import (
    MAX_DEPTH,
    MAX_LINE_BYTES,
    ForeignRecord,
    count_records,
    iter_foreign,
    json_depth_exceeds,
)
from core.evaluation.graded_import import import_file, import_jsonl
from core.io.imports import (
    ImportResult,
    read_foreign_jsonl,
    record_key,
)
from core.io.store import TraceStore

FOREIGN = [
    '{"id": "a", "prompt": "What is 2+2?", "response": "4", "answer": "4"}',
    "",
    '{"id": "b", "prompt": "Add 1 and 1.", "response": [5, 6, 7]}',
    "not json at all",
    '{"id": "c", "prompt": "", "response": "x"}',
    '{"id": "d", "prompt": "p", "response": ""}',
    '["a", "list"]',
    '{"id": "a", "prompt": "dup", "response": "r"}',
    '{"prompt": "no id", "response": "r"}',
    '{"id": 7, "prompt": "numeric id", "response": "r", "answer": 3, "source": "gsm8k"}',
    '{"id": "e", "prompt": "p", "response": [1, -2]}',
]


def write_foreign(path, extra: bytes = b"", lines=FOREIGN, sep: str = "\n"):
    path.write_bytes(sep.join(lines).encode("utf-8") + sep.encode() + extra)
    return path


def fake_score(pair, problem, response):
    """A scorer that needs no model: a fake trace of the response text."""
    text = response if isinstance(response, str) else " ".join(f"t{i}" for i in response)
    return make_trace(text=text, seed=len(text), meta={"problem": problem, "kind": "score"})


def record_lines(store: TraceStore) -> dict[int, str]:
    """line -> key of every imported trace in the store (the ground truth a report is checked against)."""
    return {store.get(k).meta["import"]["line"]: k for k in store.keys()}


# -- reading ------------------------------------------------------------------------------------------


def test_read_foreign_jsonl_reports_bad_lines(tmp_path):
    records, errors = read_foreign_jsonl(write_foreign(tmp_path / "f.jsonl", b'{"id": "z", "prompt": "\xff"}\n'))
    assert [(r.line, r.id) for r in records] == [(1, "a"), (3, "b"), (8, "a"), (10, "7")]
    assert records[1].response == [5, 6, 7] and records[0].answer == "4" and records[3].answer == "3"
    assert records[3].extra == {"source": "gsm8k"}
    assert [line for line, _ in errors] == [4, 5, 6, 7, 9, 11, 12]
    reasons = dict(errors)
    assert "not valid JSON" in reasons[4] and "prompt" in reasons[5] and "response" in reasons[6]
    assert "JSON object" in reasons[7] and "id" in reasons[9] and "token ids" in reasons[11]
    assert "UTF-8" in reasons[12]
    with pytest.raises(InvalidInputError, match="No such file"):
        read_foreign_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(InvalidInputError, match="Unknown import format 'txt'"):
        read_foreign_jsonl(tmp_path / "f.txt")


def test_bom_bare_cr_crlf_and_constants(tmp_path):
    lines = ['{"id": "a", "prompt": "p", "response": "r"}', '{"id": "b", "prompt": "p", "response": "s"}',
             '{"id": "c", "prompt": "p", "response": "t", "answer": NaN}']  # fmt: skip
    for sep in ("\r", "\r\n", "\n"):
        path = tmp_path / "f.jsonl"
        path.write_bytes(b"\xef\xbb\xbf" + sep.join(lines).encode())  # a BOM, and no final newline
        records, errors = read_foreign_jsonl(path)
        assert [(r.line, r.id) for r in records] == [(1, "a"), (2, "b")], sep
        assert errors == [(3, errors[0][1])] and "NaN" in errors[0][1]
        assert count_records(path) == 3


def test_crlf_split_across_read_chunks(tmp_path, monkeypatch):
    import core.io.foreign as foreign

    monkeypatch.setattr(foreign, "_CHUNK", 7)  # every line boundary falls somewhere inside a read
    lines = [json.dumps({"id": str(i), "prompt": "p" * i, "response": "r"}) for i in range(1, 12)]
    path = tmp_path / "f.jsonl"
    path.write_bytes("\r\n".join(lines).encode() + b"\r\n")
    records, errors = read_foreign_jsonl(path)
    assert errors == [] and [r.line for r in records] == list(range(1, 12))


def test_lone_surrogates_and_deep_nesting_fail_alone(tmp_path):
    lines = [
        '{"id": "\\ud800", "prompt": "p", "response": "r"}',
        '{"id": "x", "prompt": "p", "response": "a\\udfffb"}',
        "[" * 3000 + "]" * 3000,
        '{"id": "deep", "prompt": "p", "response": "r", "extra": ' + "[" * 100 + "]" * 100 + "}",
        '{"id": "ok", "prompt": "brackets in text [[[[{{{{ do not count", "response": "' + "[" * 200 + '"}',
    ]
    records, errors = read_foreign_jsonl(write_foreign(tmp_path / "f.jsonl", lines=lines))
    assert [r.id for r in records] == ["ok"]
    reasons = dict(errors)
    assert "'id' holds a lone surrogate" in reasons[1] and "'response' holds a lone surrogate" in reasons[2]
    assert f"deeper than {MAX_DEPTH}" in reasons[3] and f"deeper than {MAX_DEPTH}" in reasons[4]


@given(st.recursive(st.none() | st.integers() | st.text(alphabet='[]{}"\\ab'),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(alphabet='[{"\\', max_size=3),
                                                                              kids, max_size=3),
                    max_leaves=40))
@settings(max_examples=150, deadline=None)
def test_json_depth_matches_the_parsed_depth(value):
    def depth(v):
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    text = json.dumps(value)
    for limit in range(0, 6):
        assert json_depth_exceeds(text.encode(), limit) == (depth(value) > limit), (text, limit)


def _read_traced(path):
    """read_foreign_jsonl(path) and its peak traced memory in bytes."""
    tracemalloc.start()
    try:
        records, errors = read_foreign_jsonl(path)
        return records, errors, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_fifty_megabyte_line_is_rejected_in_bounded_memory(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fh:
        fh.write(b'{"id": "x", "prompt": "p", "response": "' + b"a" * 50_000_000 + b'"}\n')
        fh.write(b'{"id": "y", "prompt": "p", "response": "b"}\n')
    records, errors, peak = _read_traced(path)
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.0f} MiB"  # the 8 MiB limit plus one read, never 50 MB
    assert [r.id for r in records] == ["y"] and errors[0][0] == 1 and "longer than" in errors[0][1]


def test_a_csv_cell_over_the_limit_skips_its_row_and_the_rest_is_read(tmp_path):
    """Issue 24.3: a 9 MiB cell skips its row (named by line), in bounded memory; the rows after it are read."""
    path = tmp_path / "big.csv"
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write("id,prompt,response\r\na,p,r\r\n")
        fh.write('b,p,"' + ("x" * 1023 + "\n") * 9 * 1024 + '"\r\n')  # 9 MiB over 9217 lines, quoted
        fh.write("c,p,r\r\nd,\"q\"\"uote\",s\r\n")
    records, errors, peak = _read_traced(path)
    assert peak < 24 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    last = 3 + 9 * 1024
    assert [(r.line, r.id) for r in records] == [(2, "a"), (last + 1, "c"), (last + 2, "d")]
    assert records[2].prompt == 'q"uote'
    assert errors == [(3, f"row (lines 3-{last}) is longer than {MAX_LINE_BYTES} bytes (the limit); skipped unread")]
    store = TraceStore(tmp_path / "s")
    result = import_file("PAIR", path, store, score_fn=fake_score)
    assert result.stopped is None and [line for line, _ in result.stored] == [2, last + 1, last + 2]
    assert result.to_dict()["complete"] is True and result.to_dict()["failed"] == 1


def test_an_unterminated_quote_names_the_lines_it_swallowed(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text('id,prompt,response\na,p,r\nb,"never closed,r\nc,p,r\nd,"q",r\ne,p,r\n')
    records, errors = read_foreign_jsonl(path)
    assert [r.id for r in records] == ["a", "e"]
    assert errors == [(3, "quotes out of step: a quote on line 3 closes on line 5 before more text, so lines 3-5 "
                          "were read as one row and skipped (check the quotes on line 3)")]  # fmt: skip
    path.write_text('id,prompt,response\na,p,r\nb,"never closed,r\nc,p,r\nd,"",r\ne,p,r\n')
    assert read_foreign_jsonl(path)[1] == [(3, "a quote opened on line 3 is never closed: lines 3-6 were read as "
                                                "one row and skipped (close the quote)")]  # fmt: skip
    path.write_text('id,prompt,response\na,p,r\nb,"never closed,r\nc,p,r\n')
    records, errors = read_foreign_jsonl(path)
    assert [r.id for r in records] == ["a"]
    assert errors == [(3, "a quote opened on line 3 is never closed: lines 3-4 were read as one row and skipped "
                          "(close the quote)")]  # fmt: skip


_CSV_TEXT = st.lists(st.sampled_from(["a", "b", ",", '"', "\n", "\r", "\r\n", " ", "é"]), max_size=40).map("".join)


@given(_CSV_TEXT, st.integers(1, 40))
@settings(max_examples=400, deadline=None)
def test_csv_records_split_as_the_csv_module_reads_them(text, chunk):
    """The bounded-memory record splitter agrees with csv.reader on rows and first lines, at any read size."""
    import csv
    import io

    import core.io.foreign as foreign

    reader, ref, prev = csv.reader(io.StringIO(text, newline="")), [], 0
    for row in reader:
        ref.append((prev + 1, row))
        prev = reader.line_num
    old, foreign._CHUNK = foreign._CHUNK, chunk
    try:
        got = [(r.first, foreign._csv_cells(r.text)) for r in foreign._csv_texts(io.StringIO(text, newline=""), 1 << 20)]
    finally:
        foreign._CHUNK = old
    assert got == ref


@given(st.lists(_CSV_TEXT, max_size=8), st.sampled_from(["\n", "\r\n"]))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_csv_import_never_raises_and_accounts_for_every_row(tmp_path, rows, sep):
    path = tmp_path / "fuzz.csv"
    path.write_text(sep.join(["id,prompt,response", *rows]) + sep, encoding="utf-8", newline="")
    store = TraceStore(tmp_path / f"store-{time.perf_counter_ns()}")
    result = import_file("PAIR", path, store, score_fn=fake_score)
    assert result.stopped is None
    seen = [line for line, _ in result.stored] + [line for line, _, _ in result.skipped] + \
        [line for line, _ in result.errors]
    assert len(seen) == len(set(seen))
    read = {item.line if isinstance(item, ForeignRecord) else item[0] for item in iter_foreign(path)}
    assert set(seen) == read and record_lines(store) == dict(result.stored)


def test_a_damaged_parquet_row_group_is_reported_and_the_others_stored(tmp_path):
    """Issue 24.1: one damaged page loses its row group only (each row reported with the group's range)."""
    rows = [{"id": str(i), "prompt": f"p{i}", "response": f"r{i}"} for i in range(1, 101)]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=20)
    column = pq.read_metadata(path).row_group(2).column(1)
    at = column.dictionary_page_offset or column.data_page_offset
    raw = bytearray(path.read_bytes())
    raw[at : at + 12] = bytes(b ^ 0xFF for b in raw[at : at + 12])  # the page header of group 3
    path.write_bytes(bytes(raw))
    store = TraceStore(tmp_path / "s")
    result = import_file("PAIR", path, store, score_fn=fake_score, report_path=tmp_path / "r.jsonl")
    assert [line for line, _ in result.stored] == [*range(1, 41), *range(61, 101)]
    assert [line for line, _ in result.errors] == list(range(41, 61))
    assert all(why.startswith("row group 3 of 5 (rows 41-60) cannot be read: ") for _, why in result.errors)
    assert len(store.keys()) == 80 and record_lines(store) == dict(result.stored)
    end = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[-1])
    assert end["failed"] == 20 and end["stored"] == 80


# -- importing -----------------------------------------------------------------------------------------


def test_import_with_fake_scorer(tmp_path):
    calls, progress = [], []

    def scorer(pair, problem, response):  # core.scoring.teacher_forced.score takes a problem dict as its prompt
        calls.append((pair, problem))
        if problem["id"] == "b":
            raise ModelLoadError("token id 7 is outside the vocabulary")
        return fake_score(pair, problem, response)

    store = TraceStore(tmp_path / "store")
    result = import_jsonl("PAIR", write_foreign(tmp_path / "f.jsonl"), store, score_fn=scorer,
                          progress=lambda done, total: progress.append((done, total)))  # fmt: skip
    assert [c[1]["id"] for c in calls] == ["a", "b", "a", "7"] and calls[0][0] == "PAIR"
    assert calls[0][1] == {"id": "a", "prompt": "What is 2+2?", "gold": "4"}
    assert progress[-1] == (11, 11) and [d for d, _ in progress] == sorted(d for d, _ in progress)
    assert [line for line, _ in result.stored] == [1, 8, 10] and all(k in store for k in result.keys)
    assert (3, "token id 7 is outside the vocabulary") in result.errors  # a core error's message, not its class
    assert [line for line, _ in result.errors] == [3, 4, 5, 6, 7, 9, 11]
    assert result.notes == [(8, "id 'a' also on line 1, with other content")]
    stored = store.get(result.keys[2])
    assert stored.meta["kind"] == "import" and stored.meta["import"]["line"] == 10
    assert stored.meta["problem"]["gold"] == "3" and stored.meta["import"]["extra"] == {"source": "gsm8k"}
    assert record_lines(store) == dict(result.stored)
    report = result.to_dict()
    assert (report["stored"], report["skipped"], report["failed"], report["complete"]) == (3, 0, 7, True)


def test_failure_reasons_show_a_core_message_alone():
    """Issue: "InvalidInputError: Prompt (6 tokens)..." in the report; a core error's message is written for the
    user, another error keeps its class (a bare KeyError's message is only the key)."""
    from core.errors import InvalidInputError
    from core.io.imports import failure_reason

    assert failure_reason(InvalidInputError("Prompt (6 tokens) is too long")) == "Prompt (6 tokens) is too long"
    assert failure_reason(KeyError("x")) == "KeyError: 'x'" and failure_reason(RuntimeError()) == "RuntimeError"


def test_records_with_an_answer_are_graded_on_import(tmp_path):
    """Issue 22.2: an imported record with an answer is graded like a generated trace, so `ls` and the
    app's Correct filter see it; one without stays ungraded."""
    lines = [json.dumps({"id": "a", "prompt": "1+2?", "response": "so \\boxed{3}", "answer": "3"}),
             json.dumps({"id": "b", "prompt": "1+2?", "response": "so \\boxed{4}", "answer": 3}),
             json.dumps({"id": "c", "prompt": "1+2?", "response": "so \\boxed{3}"})]  # fmt: skip
    def ungraded_score(pair, problem, response):  # as core.scoring.score: no answer, no grade
        trace = fake_score(pair, problem, response)
        del trace.meta["answer"], trace.meta["correct"]
        return trace

    store = TraceStore(tmp_path / "s")
    result = import_file("PAIR", write_foreign(tmp_path / "f.jsonl", lines=lines), store, score_fn=ungraded_score)
    graded = {store.get(k).meta["import"]["id"]: (store.get(k).meta.get("answer"), store.get(k).meta.get("correct"))
              for k in result.keys}  # fmt: skip
    assert graded == {"a": ("3", True), "b": ("4", False), "c": (None, None)}, graded
    table = store.summaries().set_index("key")
    assert [table.loc[k, "correct"] for k in result.keys] == [True, False, None]


def test_records_differing_in_id_or_answer_are_distinct_and_true_duplicates_are_reported(tmp_path):
    lines = [
        '{"id": "1", "prompt": "What is 2+2?", "response": "4", "answer": "4"}',
        '{"id": "2", "prompt": "What is 2+2?", "response": "4", "answer": "4"}',
        '{"id": "1", "prompt": "What is 2+2?", "response": "4", "answer": "5"}',
        '{"id": "1", "prompt": "What is 2+2?", "response": "4", "answer": "4"}',
        '{"id": "1", "prompt": "What is 2+2?", "response": "4", "answer": "4", "note": "extra fields do not count"}',
    ]
    store = TraceStore(tmp_path / "store")
    result = import_file("PAIR", write_foreign(tmp_path / "f.jsonl", lines=lines), store, score_fn=fake_score)
    assert [line for line, _ in result.stored] == [1, 2, 3] and len(set(result.keys)) == 3
    assert len(store.keys()) == 3 and record_lines(store) == dict(result.stored)
    assert [(line, why) for line, _, why in result.skipped] == [(4, "duplicate of line 1"), (5, "duplicate of line 1")]
    assert result.skipped[0][1] == result.keys[0] and result.errors == []
    assert {store.get(k).meta["problem"]["gold"] for k in result.keys} == {"4", "5"}
    # another pair makes other traces of the same records
    other = import_file("OTHER", tmp_path / "f.jsonl", store, score_fn=fake_score)
    assert len(other.stored) == 3 and not set(other.keys) & set(result.keys)


def test_reimport_skips_stored_records_without_rescoring(tmp_path):
    calls = []

    def scorer(pair, problem, response):
        calls.append(problem["id"])
        return fake_score(pair, problem, response)

    path, store = write_foreign(tmp_path / "f.jsonl"), TraceStore(tmp_path / "store")
    first = import_file("PAIR", path, store, score_fn=scorer)
    calls.clear()
    again = import_file("PAIR", path, store, score_fn=scorer)
    assert calls == [] and again.stored == []
    assert [(line, key) for line, key, _ in again.skipped] == first.stored
    assert all(why == "already in the store (not scored again)" for _, _, why in again.skipped)
    # a damaged stored record is re-scored and rewritten, not skipped
    victim = store.traces_dir / f"{first.keys[0]}.parquet"
    victim.write_bytes(victim.read_bytes()[:100])
    third = import_file("PAIR", path, TraceStore(store.path), score_fn=scorer)
    assert calls == ["a"] and third.stored == first.stored[:1]
    assert store.get(first.keys[0]).meta["import"]["line"] == 1 and len(store.set_aside_files()) == 1


def test_csv_and_parquet_imports(tmp_path):
    rows = [
        {"id": "a", "prompt": "What is 2+2?", "response": "4", "answer": "4", "src": "x"},
        {"id": "b", "prompt": "Line one\nline two, with \"quotes\"", "response": "=1+1", "answer": ""},
        {"id": "c", "prompt": "", "response": "r", "answer": "1"},
    ]
    csv_path = tmp_path / "f.csv"
    csv_path.write_bytes(b"\xef\xbb\xbf" + pd.DataFrame(rows).to_csv(index=False, lineterminator="\r\n").encode())
    store = TraceStore(tmp_path / "store")
    result = import_file("PAIR", csv_path, store, score_fn=fake_score)
    assert [line for line, _ in result.stored] == [2, 3] and [line for line, _ in result.errors] == [5]
    b = store.get(result.keys[1])
    assert b.meta["problem"]["prompt"] == rows[1]["prompt"] and b.meta["problem"]["gold"] is None
    assert b.text == "=1+1" and store.get(result.keys[0]).meta["import"]["extra"] == {"src": "x"}

    table = pa.table({"id": ["p", "q", "r"], "prompt": ["x", "y", "z"],
                      "response": [[1, 2, 3], [4, 5], [-1]]})  # fmt: skip
    pq.write_table(table, tmp_path / "f.parquet")
    result = import_file("PAIR", tmp_path / "f.parquet", store, score_fn=fake_score)
    assert [line for line, _ in result.stored] == [1, 2] and result.errors[0][0] == 3
    assert store.get(result.keys[0]).meta["problem"]["prompt"] == "x"
    with pytest.raises(InvalidInputError, match="lacks"):
        pd.DataFrame({"id": [1]}).to_csv(tmp_path / "bad.csv", index=False)
        import_file("PAIR", tmp_path / "bad.csv", store, score_fn=fake_score)


def test_ctrl_c_and_cancel_leave_a_report_that_matches_the_store(tmp_path):
    lines = [json.dumps({"id": str(i), "prompt": "p", "response": f"r{i}"}) for i in range(1, 9)]
    path = write_foreign(tmp_path / "f.jsonl", lines=lines)

    def scorer(pair, problem, response):
        if problem["id"] == "4":
            raise KeyboardInterrupt
        return fake_score(pair, problem, response)

    store = TraceStore(tmp_path / "store")
    result = import_file("PAIR", path, store, score_fn=scorer, report_path=tmp_path / "report.jsonl")
    assert result.stopped == "interrupted (Ctrl-C) at line 4" and result.last_line == 4
    assert [line for line, _ in result.stored] == [1, 2, 3] and record_lines(store) == dict(result.stored)
    assert result.errors == [(4, result.stopped)]
    log = [json.loads(line) for line in (tmp_path / "report.jsonl").read_text().splitlines()]
    assert [e["line"] for e in log if e["status"] == "stored"] == [1, 2, 3]
    assert log[-1] == {"status": "end", "complete": False, "stopped": result.stopped, "stored": 3, "skipped": 0,
                       "failed": 1}  # fmt: skip

    seen = []
    result = import_file("PAIR", path, store, score_fn=fake_score, should_stop=lambda: len(seen) >= 5,
                         progress=lambda done, total: seen.append(done))  # fmt: skip
    assert result.stopped == "cancelled before line 6"
    assert [line for line, _ in result.stored] == [4, 5] and len(result.skipped) == 3
    assert record_lines(store) == {i: record_key_of(lines[i - 1]) for i in range(1, 6)}


def record_key_of(line: str) -> str:
    from core.io.foreign import _record

    return record_key(_record(0, json.loads(line)), "'PAIR'")


def test_disk_full_stops_with_a_report_naming_what_was_stored(tmp_path, monkeypatch):
    lines = [json.dumps({"id": str(i), "prompt": "p", "response": f"r{i}"}) for i in range(1, 7)]
    path = write_foreign(tmp_path / "f.jsonl", lines=lines)
    store = TraceStore(tmp_path / "store")
    real_fsync, calls = os.fsync, []

    def fsync(fd):  # the 4th trace file finds the disk full
        if stat.S_ISREG(os.fstat(fd).st_mode):
            calls.append(fd)
        if len(calls) == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    result = import_file("PAIR", path, store, score_fn=fake_score)
    assert [line for line, _ in result.stored] == [1, 2, 3] and record_lines(store) == dict(result.stored)
    assert "the disk is full" in result.stopped and "line 4" in result.stopped
    assert result.errors == [(4, result.stopped)] and result.to_dict()["complete"] is False
    assert not [p for p in store.traces_dir.iterdir() if p.name.startswith(".")]  # no temp file left


class _FillingFile:
    """A text file whose flush finds the disk full after `room` lines (as a 1 MB tmpfs would)."""

    def __init__(self, fh, room: int) -> None:
        self.fh, self.room = fh, room

    def write(self, text: str) -> int:
        self.room -= 1
        return self.fh.write(text) if self.room >= 0 else len(text)  # past the room nothing lands

    def flush(self) -> None:
        if self.room < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


@pytest.mark.parametrize("room", [0, 3, 6])  # the first line, a middle one, the closing "end" line
def test_a_full_disk_while_writing_the_report_stops_cleanly(tmp_path, monkeypatch, room):
    """Issue 24.2: the report writer's full disk stops the import with a message, like the store's."""
    import builtins

    import core.io.imports as imports

    lines = [json.dumps({"id": str(i), "prompt": "p", "response": f"r{i}"}) for i in range(1, 7)]
    path = write_foreign(tmp_path / "f.jsonl", lines=lines)
    monkeypatch.setattr(imports, "open", lambda *a, **k: _FillingFile(builtins.open(*a, **k), room), raising=False)
    store = TraceStore(tmp_path / "store")
    result = import_file("PAIR", path, store, score_fn=fake_score, report_path=tmp_path / "r.jsonl")
    assert "Cannot write the import report" in result.stopped and "the disk is full" in result.stopped
    assert record_lines(store) == dict(result.stored)  # what the result calls stored is what the store holds
    # issue 33.8: and what the report says stored, too: the trace whose line could not be written is taken back
    report = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(report) == room and {r["line"]: r["key"] for r in report if r["status"] == "stored"} == record_lines(store)
    assert len(result.stored) == min(room, 6) and result.to_dict()["complete"] is False
    if room < 6:
        assert result.errors[-1] == (room + 1, result.errors[-1][1]) and "rerun to store it" in result.errors[-1][1]


def test_cli_report_on_a_full_or_unwritable_path(tmp_path, tiny_dirs):
    from click.testing import CliRunner

    from core.cli import main

    pair = ["--base", str(tiny_dirs["qwen_base"]), "--reason", str(tiny_dirs["qwen_reason"]), "--device", "cpu"]
    src = write_foreign(tmp_path / "f.jsonl", lines=[json.dumps({"id": "a", "prompt": "What is 2+3?", "response": "5"})])
    result = CliRunner().invoke(main, ["import", *pair, "--store", str(tmp_path / "s"), str(src), "--report", "/dev/full"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "Import stopped early" in result.stderr and "/dev/full: the disk is full" in result.stderr
    result = CliRunner().invoke(main, ["import", "--store", str(tmp_path / "s"), str(src), "--report", "/proc/x"])
    assert result.exit_code == 2 and "--report" in result.output and "Traceback" not in result.output


def _kill_target(path: str, store: str, report: str) -> None:
    def slow(pair, problem, response):
        time.sleep(0.01)
        return fake_score(pair, problem, response)

    import_file("PAIR", path, TraceStore(store), score_fn=slow, report_path=report)


def test_kill_minus_nine_mid_import_then_rerun_accounts_for_every_record(tmp_path):
    lines = [json.dumps({"id": str(i), "prompt": f"p{i % 7}", "response": f"r{i}"}) for i in range(1, 121)]
    lines[30] = "{broken"
    path = write_foreign(tmp_path / "f.jsonl", lines=lines)
    store_dir, report = tmp_path / "store", tmp_path / "r1.jsonl"
    proc = multiprocessing.get_context("fork").Process(target=_kill_target, args=(str(path), str(store_dir),
                                                                                  str(report)))  # fmt: skip
    proc.start()
    deadline = time.time() + 60
    while len(TraceStore(store_dir).keys()) < 40:
        assert time.time() < deadline and proc.is_alive()
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    store = TraceStore(store_dir)
    assert store.unreadable() == []
    logged = [json.loads(x) for x in report.read_text().splitlines() if x.endswith("}")]
    logged_stored = {e["line"]: e["key"] for e in logged if e["status"] == "stored"}
    on_disk = record_lines(store)
    # every record the log calls stored is in the store; at most the one in flight is stored but unlogged
    assert logged_stored.items() <= on_disk.items() and len(on_disk) - len(logged_stored) <= 1

    result = import_file("PAIR", path, store, score_fn=fake_score, report_path=tmp_path / "r2.jsonl")
    assert result.stopped is None and [line for line, _ in result.errors] == [31]
    done = dict(result.stored) | {line: key for line, key, _ in result.skipped}
    assert sorted(done) == [i for i in range(1, 121) if i != 31]
    assert {line for line, _, _ in result.skipped} == set(on_disk)
    assert record_lines(store) == done and len(store.keys()) == 119


# -- fuzz -----------------------------------------------------------------------------------------------

_GOOD = st.fixed_dictionaries(
    {"id": st.one_of(st.text(min_size=1, max_size=4), st.integers(0, 9)),
     "prompt": st.text(min_size=1, max_size=8).filter(str.strip),
     "response": st.one_of(st.text(min_size=1, max_size=8), st.lists(st.integers(0, 30), min_size=1, max_size=4))},
    optional={"answer": st.one_of(st.text(max_size=3), st.integers(), st.none())},
)  # fmt: skip
_LINE = st.one_of(
    _GOOD.map(lambda d: json.dumps(d).encode()),
    _GOOD.map(lambda d: json.dumps(d, ensure_ascii=False).encode("utf-8", "surrogatepass")),  # raw surrogates
    st.binary(max_size=30),
    st.integers(1, 200).map(lambda n: b"[" * n + b"]" * n),
    st.sampled_from([b"", b"   ", b"\xef\xbb\xbf{}", b'{"id": NaN}', b"null", b'{"id": "x", "prompt": "\\ud800"}']),
)


@given(st.lists(_LINE, max_size=12), st.sampled_from([b"\n", b"\r\n", b"\r"]), st.booleans())
@example(lines=[b"PAR1"], sep=b"\n", bom=False)  # a text line that starts as Parquet does (hypothesis found it)
@example(lines=[b"PAR1 x", b"PAR1"], sep=b"\n", bom=False)  # and ends as it does: shorter than Parquet's framing
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_import_never_raises_and_accounts_for_every_line(tmp_path, lines, sep, bom):
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + sep.join(lines))
    store = TraceStore(tmp_path / f"store-{time.perf_counter_ns()}")
    result = import_file("PAIR", path, store, score_fn=fake_score)
    assert isinstance(result, ImportResult) and result.stopped is None
    lines_seen = [line for line, _ in result.stored] + [line for line, _, _ in result.skipped] + \
        [line for line, _ in result.errors]
    assert len(lines_seen) == len(set(lines_seen))  # each line has exactly one outcome ...
    physical = path.read_bytes().removeprefix(b"\xef\xbb\xbf").splitlines()  # bytes split on \n, \r\n, \r
    assert set(lines_seen) == {i for i, raw in enumerate(physical, 1) if raw.strip()}  # ... and none is lost
    assert record_lines(store) == dict(result.stored) and store.unreadable() == []
    json.dumps(result.to_dict(), allow_nan=False).encode("utf-8")  # the report itself is valid JSON text


def test_cli_import_csv_reports_and_reruns_skip(tmp_path, tiny_dirs):
    from click.testing import CliRunner

    from core.cli import main

    pair = ["--base", str(tiny_dirs["qwen_base"]), "--reason", str(tiny_dirs["qwen_reason"]), "--device", "cpu"]
    src = tmp_path / "f.csv"
    pd.DataFrame([{"id": "a", "prompt": "What is 2+3?", "response": "5", "answer": "5"},
                  {"id": "b", "prompt": "", "response": "x", "answer": ""}]).to_csv(src, index=False)  # fmt: skip
    args = ["import", *pair, "--store", str(tmp_path / "s"), str(src)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert (out["stored"], out["failed"], out["errors"][0]["line"]) == (1, 1, 3)
    log = [json.loads(x) for x in open(out["report"], encoding="utf-8")]
    assert [e["status"] for e in log] == ["stored", "failed", "end"]
    again = CliRunner().invoke(main, args)
    counts = json.loads(again.stdout.strip().splitlines()[-1])
    assert (counts["stored"], counts["skipped"]) == (0, 1)
    assert "record" in again.stderr and "tok/s" not in again.stderr  # the progress bar counts records
