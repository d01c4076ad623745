"""core/io/notes.py: notes and bookmarks beside the store's traces (crash-safe, searchable, exported)."""

from __future__ import annotations

import json
import threading

import pandas as pd
import pyarrow.parquet as pq
import pytest

from core.errors import InvalidInputError, StoreError
from core.io import notes as nt
from core.io.maintenance import verify
from core.io.store import TraceStore
from core.views.exports import export, read_jsonl
from tests.apptest import first_trace, tiny_app
from tests.fakes import make_trace


@pytest.fixture()
def stored(tmp_path):
    store = TraceStore(tmp_path / "store")
    trace = make_trace(n_tokens=12, seed=4)
    key = store.put(trace)
    return store, key


def test_add_list_edit_delete(stored):
    store, key = stored
    before = (store.traces_dir / f"{key}.parquet").read_bytes()
    a = nt.add_note(store, key, 5, 7, "  the fork happens here  ")
    b = nt.add_note(store, key, 2, bookmark=True)
    notes = nt.read_notes(store, key)
    assert [(n.start, n.end, n.text, n.bookmark) for n in notes] == [(2, 2, "", True), (5, 7, "the fork happens here", False)]
    assert a.covers(6) and not a.covers(8)
    edited = nt.edit_note(store, key, a.id, text="fork", bookmark=True)
    assert (edited.text, edited.bookmark, edited.start) == ("fork", True, 5)
    nt.delete_note(store, key, b.id)
    assert [n.id for n in nt.read_notes(store, key)] == [a.id]
    nt.delete_note(store, key, a.id)
    assert nt.read_notes(store, key) == [] and not nt.notes_path(store, key).exists()
    # the trace's own file is never rewritten and the store still reads it
    assert (store.traces_dir / f"{key}.parquet").read_bytes() == before
    assert len(store.get(key)) == 12 and verify(store).ok


def test_bad_input_names_the_problem(stored):
    store, key = stored
    with pytest.raises(InvalidInputError, match=r"0\.\.11"):
        nt.add_note(store, key, 10, 12, "past the end")
    with pytest.raises(InvalidInputError, match="start ≤ end"):
        nt.add_note(store, key, 5, 3, "backwards")
    with pytest.raises(InvalidInputError, match="needs text"):
        nt.add_note(store, key, 1, text="   ")
    with pytest.raises(InvalidInputError, match="No trace with key"):
        nt.add_note(store, "0" * 32, 1, text="x")
    with pytest.raises(InvalidInputError, match="has no note 'nope'"):
        nt.delete_note(store, key, "nope")


def test_a_killed_writer_leaves_the_old_notes(stored, monkeypatch):
    store, key = stored
    nt.add_note(store, key, 1, text="kept")
    from core.io import atomic

    real = atomic.os.replace

    def die(*args, **kw):  # the temp file is written and fsynced, then the process "dies" before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "replace", die)
    with pytest.raises(KeyboardInterrupt):
        nt.add_note(store, key, 2, text="lost")
    monkeypatch.setattr(atomic.os, "replace", real)
    assert [n.text for n in nt.read_notes(store, key)] == ["kept"]
    assert not [p for p in (store.path / "notes").iterdir() if p.name.endswith(".tmp")]


def test_damaged_notes_file_is_reported_not_hidden(stored):
    store, key = stored
    nt.add_note(store, key, 1, text="x")
    nt.notes_path(store, key).write_text('{"forkpoint_notes": 1, "notes": [{"id": ')
    with pytest.raises(StoreError, match="damaged"):
        nt.read_notes(store, key)
    found, bad = nt.all_notes(store)
    assert found == {} and bad and bad[0][0] == nt.notes_path(store, key)


def test_concurrent_writers_lose_nothing(stored):
    store, key = stored
    errors = []

    def add(i):
        try:
            nt.add_note(store, key, i % 12, text=f"note {i}", n_tokens=12)
        except Exception as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(n.text for n in nt.read_notes(store, key)) == sorted(f"note {i}" for i in range(16))


def test_search(tmp_path):
    store = TraceStore(tmp_path / "s")
    k1 = store.put(make_trace(n_tokens=8, seed=1))
    k2 = store.put(make_trace(n_tokens=8, seed=2))
    nt.add_note(store, k1, 0, text="Wait — the base hesitates")
    nt.add_note(store, k2, 3, 4, text="arithmetic slip")
    nt.add_note(store, k2, 5, bookmark=True)
    assert nt.search_notes(store, "WAIT")["key"].tolist() == [k1]
    assert nt.search_notes(store, "slip")[["start", "end"]].values.tolist() == [[3, 4]]
    assert len(nt.search_notes(store)) == 3
    assert nt.search_notes(store, bookmarks_only=True)["start"].tolist() == [5]
    assert nt.search_notes(store, "p7", problems={k2: "p7"})["key"].unique().tolist() == [k2]
    assert nt.noted_keys(store) == sorted([k1, k2])


def test_every_export_carries_the_notes(stored, tmp_path):
    store, key = stored
    nt.add_note(store, key, 2, 3, text='a <b>note</b> & "quotes"')
    nt.add_note(store, key, 3, bookmark=True)
    trace = nt.attach_notes(store, store.get(key))
    assert [n.text for n in nt.trace_notes(trace)] == ['a <b>note</b> & "quotes"', ""]
    col = nt.note_column(trace)
    assert col[1] == "" and col[2] == 'a <b>note</b> & "quotes"' and col[3] == 'a <b>note</b> & "quotes" | 🔖'
    back = read_jsonl(export(trace, tmp_path / "t.jsonl"))[0]
    assert nt.trace_notes(back) == nt.trace_notes(trace)
    export(trace, tmp_path / "t.csv")
    csv = pd.read_csv(tmp_path / "t.csv", keep_default_na=False)
    assert csv["note"].tolist() == col  # the per-token note column
    header = json.loads((tmp_path / "t.csv.meta.json").read_text())
    assert header["traces"][0]["annotations"]["notes"][0]["text"] == 'a <b>note</b> & "quotes"'
    export(trace, tmp_path / "t.parquet")
    meta = json.loads(pq.read_schema(tmp_path / "t.parquet").metadata[b"forkpoint"])
    assert len(meta["traces"][0]["annotations"]["notes"]) == 2
    assert pq.read_table(tmp_path / "t.parquet").column("note").to_pylist() == col
    page = export(trace, tmp_path / "t.html").read_text()
    assert "a &lt;b&gt;note&lt;/b&gt;" in page and "<b>note</b>" not in page


def test_attach_leaves_unnoted_traces_alone(stored):
    store, key = stored
    trace = store.get(key)
    assert nt.attach_notes(store, [trace])[0] is trace
    assert nt.note_column(trace) == [""] * len(trace)
    assert isinstance(nt.search_notes(store), pd.DataFrame) and nt.search_notes(store).empty


def test_cli_export_carries_the_notes(stored, tmp_path):
    from click.testing import CliRunner

    from core.cli import main

    store, key = stored
    nt.add_note(store, key, 4, text="from the CLI")
    out = tmp_path / "all.jsonl"
    result = CliRunner().invoke(main, ["export", "--store", str(store.path), "--format", "jsonl", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert [n.text for n in nt.trace_notes(read_jsonl(out)[0])] == ["from the CLI"]


def test_notes_stamp_changes_with_the_notes(stored):
    store, key = stored
    empty = nt.notes_stamp(store, [key])
    note = nt.add_note(store, key, 1, text="a")
    first = nt.notes_stamp(store, [key])
    nt.edit_note(store, key, note.id, text="a longer text")
    assert len({empty, first, nt.notes_stamp(store, [key])}) == 3


# -- in the app: the Trace page's panel and the Problems page's search ------------------------------------


@pytest.mark.slow
def test_app_adds_lists_and_finds_notes(tiny_dirs, tmp_path, monkeypatch):
    at = first_trace(tiny_app(tiny_dirs, tmp_path, monkeypatch))
    key = at.session_state["trace_key"]
    at.session_state["sel_pos"] = 3
    at.run()
    at.text_area(key="note_text").input("the <b>sum</b> starts here")
    next(b for b in at.button if b.label == "Add note").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    store = TraceStore(tmp_path / "store")
    assert [(n.start, n.text) for n in nt.read_notes(store, key)] == [(3, "the <b>sum</b> starts here")]
    assert any("Notes (1)" in e.label for e in at.expander)
    at.switch_page("screens/problems.py").run()
    at.text_input(key="notes_query").input("SUM").run()
    assert not at.exception and not at.error
    found = [d.value for d in at.dataframe if "text" in getattr(d.value, "columns", [])]
    assert found and found[0]["key"].tolist() == [key] and found[0]["text"].tolist() == ["the <b>sum</b> starts here"]
