"""Where the test suite's time goes: a pytest plugin that logs each test's start and end per xdist worker (wall
clock, and the CPU seconds of the worker itself and of the child processes it has reaped: servers, subprocesses,
the notebook kernel), and a summary of those logs (seconds per file, when each worker finished). Processes that no
worker reaps are not counted: Ray's actors (children of Ray's raylet) and, it was measured, most of Chromium's
renderer CPU (benchmarks/RESULTS.md, "Test suite time").

    FP_SUITE_LOG=/tmp/suite .venv/bin/python -m pytest -p benchmarks.suite_time     # the README's command, logged
    .venv/bin/python benchmarks/suite_time.py /tmp/suite                              # the summary

Run `vmstat 5` beside it to see whether the cores were busy (benchmarks/RESULTS.md, "Test suite time").
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from pathlib import Path

_LOG = None
_ON = False  # set in pytest_configure: a log folder is given and this process runs tests


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest's Config
    """Log in the processes that run tests: each xdist worker, or the one process of a run without workers (an
    xdist controller also sees every test's report, and would count each one twice)."""
    global _ON
    controller = not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", default=0))
    _ON = bool(os.environ.get("FP_SUITE_LOG")) and not controller


def _write(nodeid: str, event: str) -> None:
    global _LOG
    if not _ON:
        return
    folder = os.environ["FP_SUITE_LOG"]
    if _LOG is None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        _LOG = open(Path(folder) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl", "a")  # noqa: SIM115
    cpu = os.times()
    _LOG.write(json.dumps({"id": nodeid, "ev": event, "t": time.time(), "cpu": cpu.user + cpu.system,
                           "kids": cpu.children_user + cpu.children_system}) + "\n")
    _LOG.flush()


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _write(nodeid, "start")


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    _write(nodeid, "end")


_COLUMNS = ("t", "cpu", "kids")  # wall clock, the worker's own CPU, its reaped children's CPU (older logs: wall only)


def summary(folder: Path, top: int = 25) -> str:
    """Seconds per test file (each test's start to end, setup and teardown included): wall clock, the worker's
    own CPU and its children's; and each worker's end."""
    per_file: dict[str, Counter[str]] = {c: Counter() for c in _COLUMNS}
    lines, first = [], None
    ends = {}
    for log in sorted(folder.glob("*.jsonl")):
        started: dict[str, dict] = {}
        for row in map(json.loads, log.read_text().splitlines()):
            first = row["t"] if first is None else min(first, row["t"])
            if row["ev"] == "start":
                started[row["id"]] = row
            elif row["id"] in started:
                begun, name = started.pop(row["id"]), row["id"].split("::")[0]
                for c in _COLUMNS:
                    per_file[c][name] += row.get(c, 0) - begun.get(c, 0)
                ends[log.stem] = row["t"]
    wall = per_file["t"]
    if not wall:
        return f"no test logs in {folder}"
    total = {c: sum(v.values()) for c, v in per_file.items()}
    lines.append(f"{total['t']:.0f} s of tests in {len(wall)} files; CPU: {total['cpu']:.0f} s in the workers, "
                 f"{total['kids']:.0f} s in their child processes")
    lines += [f"worker {w} ended {t - first:.0f} s after the first test started" for w, t in sorted(ends.items())]
    lines.append(f"{'wall s':>8} {'own CPU':>8} {'children':>8}  file")
    row = "{:8.1f} {:8.1f} {:8.1f}  {}"
    lines += [row.format(s, per_file["cpu"][name], per_file["kids"][name], name) for name, s in wall.most_common(top)]
    others = [name for name, _ in wall.most_common()[top:]]
    if others:
        lines.append(row.format(*(sum(per_file[c][n] for n in others) for c in _COLUMNS),
                                f"the other {len(others)} files"))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(summary(args.folder, args.top))


if __name__ == "__main__":
    main()
