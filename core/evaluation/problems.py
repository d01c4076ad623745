"""Problem sets: read JSONL / JSON / CSV files of questions and gold answers into `Problem` records.

Field names are configurable; when not given they are detected: GSM8K style (`question`, `answer` =
"worked solution #### 42") and MATH style (`problem`, `answer`, or `solution` with a final \\boxed{}).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.errors import InvalidInputError
from core.evaluation.grading import last_boxed
from core.io.foreign import MAX_DEPTH, MAX_LINE_BYTES, csv_rows, json_depth_exceeds
from core.record.problems import (  # noqa: F401  (the field names are re-exported: load_problems documents them)
    ANSWER_FIELDS,
    GSM8K_MARK,
    ID_FIELDS,
    QUESTION_FIELDS,
    SOLUTION_FIELDS,
    problem_fields,
)
from core.settings import check_text

logger = logging.getLogger(__name__)

PROBLEM_FORMATS = ("jsonl", "json", "csv")


@dataclass(frozen=True)
class Problem:
    """One problem: prompt text, gold final answer (None if unknown), worked solution, other fields."""

    id: str
    prompt: str
    gold: str | None = None
    solution: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)


def load_problems(
    path: str | Path,
    question_field: str | None = None,
    answer_field: str | None = None,
    id_field: str | None = None,
    limit: int | None = None,
    skip_bad: bool = False,
) -> list[Problem]:
    """Read problems from a .jsonl, .json (list of objects) or .csv file.

    Fields not given are detected (QUESTION_FIELDS, ANSWER_FIELDS, ID_FIELDS, in that order of
    preference). A GSM8K answer "... #### 42" gives gold "42" and the text before "####" as solution;
    with no answer field, a final \\boxed{} in a `solution` field gives the gold. Ids missing from the
    file become "<file stem>-<row index>". A bad row raises InvalidInputError naming its line, or, with
    `skip_bad=True`, is logged and skipped. `limit` keeps the first `limit` good problems.
    """
    path = Path(path)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise InvalidInputError(f"limit must be a non-negative integer or None, got {limit!r}")
    kind = path.suffix.lower().lstrip(".")
    if kind not in PROBLEM_FORMATS:
        raise InvalidInputError(f"unknown problem file type {path.name!r}; use one of: .{', .'.join(PROBLEM_FORMATS)}")
    if not path.is_file():
        raise InvalidInputError(f"problem file {str(path)!r} does not exist")
    return problems_from_rows(_rows(path, kind, skip_bad), path.stem, where=str(path), question_field=question_field,
                              answer_field=answer_field, id_field=id_field, limit=limit, skip_bad=skip_bad)


def problems_from_rows(rows: Iterable[tuple[int, Any]], stem: str, *, where: str, question_field: str | None = None,
                       answer_field: str | None = None, id_field: str | None = None, limit: int | None = None,
                       skip_bad: bool = False) -> list[Problem]:
    """Problems from (line, row dict) pairs (a file's rows or a hub dataset's), with the field detection
    and error handling of `load_problems`; `where` names the source in messages."""
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for index, (line, row) in enumerate(rows):
        if limit is not None and len(problems) >= limit:
            break
        try:
            if isinstance(row, _Bad):
                raise InvalidInputError(row.problem)
            if not isinstance(row, dict):
                raise InvalidInputError(f"expected an object with fields, got {type(row).__name__}")
            problem = _problem(row, stem, index, question_field, answer_field, id_field)
            if problem.id in seen:
                raise InvalidInputError(f"duplicate id {problem.id!r} (first on line {seen[problem.id]})")
        except InvalidInputError as exc:
            message = f"{where}:{line}: {exc}"
            if not skip_bad:
                raise InvalidInputError(message) from None
            logger.warning("skipping bad problem row: %s", message)
            continue
        seen[problem.id] = line
        problems.append(replace(problem, meta={**problem.meta, "line": line}))
    if not problems:
        logger.warning("no problems read from %s", where)
    return problems


@dataclass(frozen=True)
class _Bad:
    problem: str


def _rows(path: Path, kind: str, skip_bad: bool = False) -> Iterator[tuple[int, Any]]:
    """(line number, parsed row or _Bad) for every data row; row indices stay stable past bad rows."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"cannot read problem file {str(path)!r}: {exc}") from exc
    if kind == "csv":
        rows = csv_rows(io.StringIO(text, newline=""), str(path), skipped=skip_bad)
        head = next(rows, None)
        header = head.cells if head is not None else []
        for row in rows:  # a row's line is its last, as the csv module counts
            if row.cells is None:  # a quote left open merged lines: refused, never read as one problem
                yield row.first, _Bad(row.problem)
            elif len(row.cells) > len(header):
                yield row.last, _Bad("row has more cells than the header has columns")
            else:  # a short row lacks its last fields
                yield row.last, dict(zip(header, row.cells))
    elif kind == "json":
        if json_depth_exceeds(text):
            raise InvalidInputError(f"{path}: JSON nested deeper than {MAX_DEPTH} levels (the limit)")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
        if not isinstance(data, list):
            raise InvalidInputError(f"{path}: a .json problem file must hold a list of objects")
        yield from ((i + 1, row) for i, row in enumerate(data))  # "line" = item number here
    else:
        for number, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            if len(raw) > MAX_LINE_BYTES or json_depth_exceeds(raw):  # before parsing: no RecursionError
                yield number, _Bad(f"line over {MAX_LINE_BYTES} bytes or nested deeper than {MAX_DEPTH} levels")
                continue
            try:
                yield number, json.loads(raw)
            except json.JSONDecodeError as exc:
                yield number, _Bad(f"not valid JSON: {exc.msg} (column {exc.colno})")


def _problem(
    row: dict[str, Any], stem: str, index: int, question_field: str | None, answer_field: str | None,
    id_field: str | None,
) -> Problem:
    fields = problem_fields(row, question_field=question_field, answer_field=answer_field, id_field=id_field)
    prompt, gold, solution, pid = fields["prompt"], fields["gold"], fields["solution"], fields["id"]
    names = fields["names"]
    for role, text in (("question", prompt), ("answer", gold), ("solution", solution), ("id", pid)):
        if text is not None:
            check_text(text, f"field {names[role]!r}")
    if gold is None and solution is not None:
        gold = last_boxed(solution)
    used = set(fields["names"].values())
    meta = {k: v for k, v in row.items() if k not in used}
    return Problem(pid or f"{stem}-{index}", prompt, gold, solution, meta)
