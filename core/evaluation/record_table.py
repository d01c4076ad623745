"""A run's records (one row per generated trace: RECORD_COLUMNS) on disk, and the per-group counts that the
policy table is computed from, read from that table (SQL aggregation) or from an in-memory DataFrame.

`RecordTable` is the driver's scratch table: rows go into an SQLite file (a temporary directory, removed
on `close()` or when the table is collected) as batches finish, so the driver's memory does not grow with
the number of rows. It is not a second store: the traces and their summaries live in the `TraceStore`;
this table only adds where each row belongs in the run (benchmark, policy label, problem index, sample).
"""

from __future__ import annotations

import sqlite3
import tempfile
import weakref
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Self

import numpy as np
import pandas as pd

from core.errors import InvalidInputError
from core.trace import RowSummary

RECORD_COLUMNS = ("benchmark", "policy", "problem", "index", "sample", "correct", "tokens", "taken", "key",
                  "answer_rule")
CHUNK_ROWS = 50_000  # rows fetched from SQLite at a time


class GroupCounts(NamedTuple):
    """Everything the policy table needs of one (benchmark, policy) group: integer counts, exact either way."""

    benchmark: Any
    policy: Any
    sizes: np.ndarray  # samples per problem, problems in index order
    sums: np.ndarray  # correct samples per problem, same order
    rows: int
    correct: int
    tokens: int
    taken: int
    wrong: int | None  # answered, but wrong (None: the records do not say which rule graded them)
    ungraded: int | None  # no answer extracted


def frame_groups(records: pd.DataFrame) -> Iterator[GroupCounts]:
    """The groups of an in-memory records frame, in order of first appearance."""
    has_rule = "answer_rule" in records
    for (bench, label), g in records.groupby(["benchmark", "policy"], sort=False):
        per = g.groupby("index")["correct"].agg(["size", "sum"])
        correct = g["correct"].astype(bool)
        none = g["answer_rule"].isna() if has_rule else None
        yield GroupCounts(bench, label, per["size"].to_numpy(np.int64), per["sum"].to_numpy(np.int64), len(g),
                          int(correct.sum()), int(g["tokens"].sum()), int(g["taken"].sum()),
                          int((~correct & ~none).sum()) if has_rule else None,
                          int(none.sum()) if has_rule else None)


class RecordTable:
    """RECORD_COLUMNS in an SQLite file, appended batch by batch (`add`), aggregated with SQL (`groups`),
    and read back in `seq` order (`frame`, `chunks`). `path=None`: a temporary file, removed on `close`."""

    def __init__(self, path: str | Path | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="forkpoint-records-") if path is None else None
        self.path = Path(self._tmp.name) / "records.sqlite" if self._tmp is not None else Path(path)
        self.db = sqlite3.connect(self.path)
        # a scratch table: a crash loses nothing the store does not hold, so no journal or fsync
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute("PRAGMA temp_store=FILE")
        # columns without a declared type keep what was put in (a problem id stays an int or a str)
        self.db.execute('CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY, benchmark, policy, problem, '
                        '"index", sample, correct INTEGER, tokens INTEGER, taken INTEGER, key, answer_rule)')
        self._rows = self.db.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        self._close = weakref.finalize(self, _close, self.db, self._tmp)

    def __len__(self) -> int:
        return self._rows

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the database (and remove a temporary one)."""
        self._close()

    def add(self, start: int, benchmark: str, policy: str, rows: Sequence[tuple[int, int, RowSummary]]) -> None:
        """Rows (problem index, sample, summary) at positions start, start + 1, ... of the run."""
        self.db.executemany(
            "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(start + j, benchmark, policy, r.problem, index, sample, int(bool(r.correct)), int(r.length),
              int(r.takeovers), r.key, r.answer_rule) for j, (index, sample, r) in enumerate(rows)])
        self.db.commit()
        self._rows += len(rows)

    def add_frame(self, frame: pd.DataFrame) -> None:
        """Append a records frame (RECORD_COLUMNS) after the rows already here."""
        missing = set(RECORD_COLUMNS) - set(frame.columns)
        if missing:
            raise InvalidInputError(f"records lack columns {sorted(missing)}")
        start = self.next_seq()
        cols = [frame[c].tolist() for c in RECORD_COLUMNS]
        self.db.executemany(
            "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(start + j, b, p, pr, _plain(i), _plain(s), int(bool(c)), int(t), int(tk), k, _none(a))
             for j, (b, p, pr, i, s, c, t, tk, k, a) in enumerate(zip(*cols))])
        self.db.commit()
        self._rows += len(frame)

    def next_seq(self) -> int:
        """The position after the last row (rows of one stage may arrive out of order)."""
        last = self.db.execute("SELECT MAX(seq) FROM records").fetchone()[0]
        return 0 if last is None else int(last) + 1

    def chunks(self, size: int = CHUNK_ROWS) -> Iterator[pd.DataFrame]:
        """The records in run order, `size` rows at a time."""
        cur = self.db.execute(f"SELECT {', '.join(_q(c) for c in RECORD_COLUMNS)} FROM records ORDER BY seq")
        while True:
            got = cur.fetchmany(size)
            if not got:
                return
            yield _frame(got)

    def frame(self) -> pd.DataFrame:
        """All records as one DataFrame (RECORD_COLUMNS; for small runs and tests: it holds every row)."""
        cur = self.db.execute(f"SELECT {', '.join(_q(c) for c in RECORD_COLUMNS)} FROM records ORDER BY seq")
        return _frame(cur.fetchall())

    def policies(self) -> list[Any]:
        """The policy labels, in order of first appearance."""
        return [r[0] for r in self.db.execute("SELECT policy, MIN(seq) AS f FROM records GROUP BY policy ORDER BY f")]

    def groups(self) -> Iterator[GroupCounts]:
        """Per (benchmark, policy), in order of first appearance: the counts, summed by SQLite."""
        heads = self.db.execute(
            "SELECT benchmark, policy, MIN(seq) AS f, COUNT(*), SUM(correct), SUM(tokens), SUM(taken), "
            "SUM(correct = 0 AND answer_rule IS NOT NULL), SUM(answer_rule IS NULL) FROM records "
            "GROUP BY benchmark, policy ORDER BY f").fetchall()
        for bench, label, _, rows, correct, tokens, taken, wrong, ungraded in heads:
            sizes, sums = array("q"), array("q")
            cur = self.db.execute('SELECT COUNT(*), SUM(correct) FROM records WHERE benchmark IS ? AND policy IS ? '
                                  'AND "index" IS NOT NULL GROUP BY "index" ORDER BY "index"', (bench, label))
            while got := cur.fetchmany(CHUNK_ROWS):
                for n, c in got:
                    sizes.append(n)
                    sums.append(c)
            yield GroupCounts(bench, label, np.frombuffer(sizes, np.int64) if sizes else np.zeros(0, np.int64),
                              np.frombuffer(sums, np.int64) if sums else np.zeros(0, np.int64), rows, correct,
                              tokens, taken, wrong, ungraded)


def record_groups(records: pd.DataFrame | RecordTable) -> Iterator[GroupCounts]:
    """The (benchmark, policy) groups of records held in memory or in a `RecordTable`."""
    return records.groups() if isinstance(records, RecordTable) else frame_groups(records)


def _close(db: sqlite3.Connection, tmp: tempfile.TemporaryDirectory | None) -> None:
    db.close()
    if tmp is not None:
        tmp.cleanup()


def _q(name: str) -> str:
    return f'"{name}"'


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _none(value: Any) -> Any:
    return None if value is None or (isinstance(value, float) and np.isnan(value)) else value


def _frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    """Rows as a frame built column by column (the dtypes pandas infers for the lists a run collects)."""
    cols = dict(zip(RECORD_COLUMNS, map(list, zip(*rows)))) if rows else {c: [] for c in RECORD_COLUMNS}
    data: dict[str, Any] = {name: np.asarray(cols[name], dtype=np.int64) for name in ("index", "sample", "tokens",
                                                                                       "taken")}
    data["correct"] = np.asarray(cols["correct"], dtype=bool)
    data.update({name: cols[name] for name in ("benchmark", "policy", "problem", "key", "answer_rule")})
    return pd.DataFrame({name: data[name] for name in RECORD_COLUMNS}, columns=list(RECORD_COLUMNS))
