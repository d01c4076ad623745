"""Where the test suite's time goes: a pytest plugin that logs each test's start and end per xdist worker, and a
summary of those logs (seconds per file, when each worker finished).

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
    _LOG.write(json.dumps({"id": nodeid, "ev": event, "t": time.time()}) + "\n")
    _LOG.flush()


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _write(nodeid, "start")


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    _write(nodeid, "end")


def summary(folder: Path, top: int = 25) -> str:
    """Seconds per test file (each test's start to end, setup and teardown included) and each worker's end."""
    per_file: Counter[str] = Counter()
    lines, first = [], None
    ends = {}
    for log in sorted(folder.glob("*.jsonl")):
        started: dict[str, float] = {}
        for row in map(json.loads, log.read_text().splitlines()):
            first = row["t"] if first is None else min(first, row["t"])
            if row["ev"] == "start":
                started[row["id"]] = row["t"]
            elif row["id"] in started:
                per_file[row["id"].split("::")[0]] += row["t"] - started.pop(row["id"])
                ends[log.stem] = row["t"]
    if not per_file:
        return f"no test logs in {folder}"
    lines.append(f"{sum(per_file.values()):.0f} s of tests in {len(per_file)} files")
    lines += [f"worker {w} ended {t - first:.0f} s after the first test started" for w, t in sorted(ends.items())]
    lines += [f"{s:7.1f} s  {name}" for name, s in per_file.most_common(top)]
    rest = sum(s for _, s in per_file.most_common()[top:])
    if rest:
        lines.append(f"{rest:7.1f} s  the other {len(per_file) - top} files")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(summary(args.folder, args.top))


if __name__ == "__main__":
    main()
