"""`core.import_file`: responses made elsewhere, scored into a store and graded against their records' answers
as generated traces are. The importer (`core/io/imports.py`) takes the grader as a hook, so the store's room
never imports grading; this is where the two meet."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from core.evaluation.grading import grade_trace
from core.io.imports import ImportResult, import_records
from core.settings import Progress
from core.trace import Trace


def import_file(
    pair: Any,
    path: str | os.PathLike[str],
    store: Any,
    score_fn: Callable[..., Trace] | None = None,
    progress: Progress | None = None,
    *,
    format: str | None = None,
    report_path: str | os.PathLike[str] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> ImportResult:
    """Import `path`'s `{id, prompt, response[, answer]}` records into `store` (`import_records`), each trace graded
    by `grade_trace` when its record gives an answer. Never raises for a bad record; the result says what happened."""
    return import_records(pair, path, store, score_fn, progress, format=format, report_path=report_path,
                          should_stop=should_stop, grade=grade_trace)


import_jsonl = import_file  # the original name (JSONL was the first format); same function
