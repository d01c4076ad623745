"""Shared by the benchmark scripts: replace one "## Section" of benchmarks/RESULTS.md, keep the rest."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(section: str, text: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section headed `section` with `text` (which starts with that heading)."""
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    new = pattern.sub(lambda _: text + "\n", old) if pattern.search(old) else old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new, encoding="utf-8")
