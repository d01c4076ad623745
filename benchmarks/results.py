"""Shared by the benchmark scripts: replace one "## Section" of benchmarks/RESULTS.md, keep the rest."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(section: str, text: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section headed `section` with `text` (which starts with that heading)."""
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    new = pattern.sub(lambda _: text + "\n", old) if pattern.search(old) else old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new.rstrip("\n") + "\n", encoding="utf-8")


def host() -> str:
    """This machine as a results line names it: CPU model, CPU count, load average now, Python (these hosts differ
    in speed, so a number is read beside the machine that measured it)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, Python {platform.python_version()}"
