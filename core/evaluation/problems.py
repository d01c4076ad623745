"""Problem sets: read JSONL / JSON / CSV files of questions and gold answers into `Problem` records.

Field names are configurable; when not given they are detected: GSM8K style (`question`, `answer` =
"worked solution #### 42") and MATH style (`problem`, `answer`, or `solution` with a final \\boxed{}).
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.errors import InvalidInputError
from core.evaluation.grading import last_boxed
from core.io.foreign import MAX_DEPTH, MAX_LINE_BYTES, json_depth_exceeds
from core.settings import check_text

logger = logging.getLogger(__name__)

QUESTION_FIELDS = ("question", "problem", "prompt", "input", "query")
ANSWER_FIELDS = ("answer", "final_answer", "gold", "target", "expected_answer")
SOLUTION_FIELDS = ("solution", "rationale")
ID_FIELDS = ("id", "unique_id", "problem_id", "qid", "idx")
FORMATS = ("jsonl", "json", "csv")
GSM8K_MARK = "####"


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
    if kind not in FORMATS:
        raise InvalidInputError(f"unknown problem file type {path.name!r}; use one of: .{', .'.join(FORMATS)}")
    if not path.is_file():
        raise InvalidInputError(f"problem file {str(path)!r} does not exist")
    return problems_from_rows(_rows(path, kind), path.stem, where=str(path), question_field=question_field,
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


def _rows(path: Path, kind: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed row or _Bad) for every data row; row indices stay stable past bad rows."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"cannot read problem file {str(path)!r}: {exc}") from exc
    if kind == "csv":
        reader = csv.DictReader(text.splitlines(keepends=True))
        for row in reader:
            if None in row:  # more cells than header columns
                yield reader.line_num, _Bad("row has more cells than the header has columns")
            else:
                yield reader.line_num, {k: v for k, v in row.items() if v is not None}
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


def _pick(row: dict[str, Any], given: str | None, candidates: tuple[str, ...], what: str) -> str | None:
    """The field to use: the given name (must exist) or the first candidate present."""
    if given is not None:
        if given not in row:
            raise InvalidInputError(f"no {what} field {given!r}; fields are: {', '.join(map(str, row))}")
        return given
    found = next((name for name in candidates if name in row), None)
    if found is None:  # "Problem" / "Answer" / "ID" spellings
        lower = {str(k).lower(): k for k in row}
        found = next((lower[name] for name in candidates if name in lower), None)
    return found


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    text = str(value).strip()
    return text or None


def _problem(
    row: dict[str, Any], stem: str, index: int, question_field: str | None, answer_field: str | None,
    id_field: str | None,
) -> Problem:
    q_name = _pick(row, question_field, QUESTION_FIELDS, "question")
    if q_name is None:
        raise InvalidInputError(
            f"no question field (tried {', '.join(QUESTION_FIELDS)}); fields are: {', '.join(map(str, row))}; "
            "pass question_field="
        )
    prompt = _text(row[q_name])
    if prompt is None:
        raise InvalidInputError(f"empty question in field {q_name!r}")
    check_text(prompt, f"field {q_name!r}")
    a_name = _pick(row, answer_field, ANSWER_FIELDS, "answer")
    s_name = _pick(row, None, tuple(n for n in SOLUTION_FIELDS if n != a_name), "solution")
    i_name = _pick(row, id_field, ID_FIELDS, "id")
    answer = _text(row[a_name]) if a_name else None
    solution = _text(row[s_name]) if s_name else None
    gold = answer
    if answer is not None and GSM8K_MARK in answer:
        worked, _, final = answer.rpartition(GSM8K_MARK)
        gold = final.strip() or None
        solution = solution or worked.strip() or None
    if gold is None and solution is not None:

        gold = last_boxed(solution)
    pid = _text(row[i_name]) if i_name else None
    for name, text in ((a_name, answer), (s_name, solution), (i_name, pid)):
        if text is not None:
            check_text(text, f"field {name!r}")
    used = {q_name, a_name, s_name, i_name}
    meta = {k: v for k, v in row.items() if k not in used}
    return Problem(pid or f"{stem}-{index}", prompt, gold, solution, meta)
