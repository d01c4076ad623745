"""benchmarks/results.py: a benchmark replaces its own section of RESULTS.md and nothing else, and names its host."""

from __future__ import annotations

import os

from benchmarks.results import host, write_section


def test_a_section_is_replaced_in_place_and_a_new_one_appended(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\n## A\nold a\n\n## B\nkept b\n")
    write_section("## A", "## A\nnew a\n", path)
    write_section("## C", "## C\nc\n", path)
    assert path.read_text() == "# Benchmark results\n\n## A\nnew a\n\n## B\nkept b\n\n## C\nc\n"


def test_the_host_line_names_cpus_and_load():
    line = host()
    assert f"{os.cpu_count()} CPUs" in line and ", load " in line and "Python 3." in line
