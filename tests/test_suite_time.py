"""benchmarks/suite_time.py: the summary adds up each test's wall clock and CPU per file, from every worker's log."""

from __future__ import annotations

import json

from benchmarks.suite_time import summary


def _log(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_adds_wall_and_cpu_per_file_over_workers(tmp_path):
    _log(tmp_path / "gw0.jsonl", [
        {"id": "tests/a.py::x", "ev": "start", "t": 100.0, "cpu": 1.0, "kids": 0.0},
        {"id": "tests/a.py::x", "ev": "end", "t": 104.0, "cpu": 3.5, "kids": 1.0},
        {"id": "tests/b.py::y", "ev": "start", "t": 104.0, "cpu": 3.5, "kids": 1.0},
        {"id": "tests/b.py::y", "ev": "end", "t": 105.0, "cpu": 4.0, "kids": 1.0},
        {"id": "tests/b.py::z", "ev": "start", "t": 105.0, "cpu": 4.0, "kids": 1.0},  # never ended: not counted
    ])
    _log(tmp_path / "gw1.jsonl", [
        {"id": "tests/a.py::w", "ev": "start", "t": 101.0},  # an older log: wall clock only
        {"id": "tests/a.py::w", "ev": "end", "t": 107.0},
    ])
    lines = summary(tmp_path).splitlines()
    assert lines[0] == "11 s of tests in 2 files; CPU: 3 s in the workers, 1 s in their child processes"
    assert lines[1:3] == ["worker gw0 ended 5 s after the first test started",
                          "worker gw1 ended 7 s after the first test started"]
    assert [line.split() for line in lines[4:]] == [["10.0", "2.5", "1.0", "tests/a.py"],
                                                   ["1.0", "0.5", "0.0", "tests/b.py"]]
    assert summary(tmp_path, top=1).splitlines()[-1].split() == ["1.0", "0.5", "0.0", "the", "other", "1", "files"]


def test_summary_of_an_empty_folder_says_so(tmp_path):
    assert summary(tmp_path) == f"no test logs in {tmp_path}"
