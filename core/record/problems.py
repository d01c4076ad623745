"""The one reader of a problem's fields: which field holds the question, the answer, the worked solution and
the id (names detected in one order), for problem files, importers, the CLI and the app alike."""

from __future__ import annotations

import json
from typing import Any

from core.errors import InvalidInputError

QUESTION_FIELDS = ("question", "problem", "prompt", "input", "query")
ANSWER_FIELDS = ("answer", "final_answer", "gold", "target", "expected_answer")
SOLUTION_FIELDS = ("solution", "rationale")
ID_FIELDS = ("id", "unique_id", "problem_id", "qid", "idx")
GSM8K_MARK = "####"  # GSM8K's answer field: "worked solution #### 42"


def pick_field(row: dict[str, Any], given: str | None, candidates: tuple[str, ...], what: str) -> str | None:
    """The field to use: the given name (must exist) or the first candidate present (any letter case)."""
    if given is not None:
        if given not in row:
            raise InvalidInputError(f"no {what} field {given!r}; fields are: {', '.join(map(str, row))}")
        return given
    found = next((name for name in candidates if name in row), None)
    if found is None:  # "Problem" / "Answer" / "ID" spellings
        lower = {str(k).lower(): k for k in row}
        found = next((lower[name] for name in candidates if name in lower), None)
    return found


def field_text(value: Any) -> str | None:
    """A field's value as text (structured values as JSON); None for a missing or blank one."""
    if value is None:
        return None
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    text = str(value).strip()
    return text or None


def problem_fields(row: dict[str, Any], *, question_field: str | None = None, answer_field: str | None = None,
                   id_field: str | None = None) -> dict[str, Any]:
    """A problem row's fields: prompt, gold (a GSM8K "... #### 42" answer gives "42" and its worked solution),
    solution, id (None when missing) and `names`, the field each was read from. Raises InvalidInputError without a question."""
    q_name = pick_field(row, question_field, QUESTION_FIELDS, "question")
    if q_name is None:
        raise InvalidInputError(f"no question field (tried {', '.join(QUESTION_FIELDS)}); fields are: "
                                f"{', '.join(map(str, row))}; rename the question's field to one of the names tried "
                                "(in Python, load_problems(..., question_field=NAME) reads another)")
    prompt = field_text(row[q_name])
    if prompt is None:
        raise InvalidInputError(f"empty question in field {q_name!r}")
    a_name = pick_field(row, answer_field, ANSWER_FIELDS, "answer")
    s_name = pick_field(row, None, tuple(n for n in SOLUTION_FIELDS if n != a_name), "solution")
    i_name = pick_field(row, id_field, ID_FIELDS, "id")
    gold = field_text(row[a_name]) if a_name else None
    solution = field_text(row[s_name]) if s_name else None
    if gold is not None and GSM8K_MARK in gold:
        worked, _, final = gold.rpartition(GSM8K_MARK)
        gold = final.strip() or None
        solution = solution or worked.strip() or None
    return {"prompt": prompt, "gold": gold, "solution": solution, "id": field_text(row[i_name]) if i_name else None,
            "names": {"question": q_name, "answer": a_name, "solution": s_name, "id": i_name}}


def problem_record(problem: Any) -> dict[str, Any]:
    """A problem (plain text, a `Problem`, or a dict read by `problem_fields`) -> {"id", "prompt", "gold"}."""
    if isinstance(problem, str):
        return {"id": None, "prompt": problem, "gold": None}
    if isinstance(problem, dict):
        if isinstance(problem.get("prompt"), str) and set(problem) <= {"id", "prompt", "gold"}:
            return {"id": problem.get("id"), "prompt": problem["prompt"], "gold": problem.get("gold")}  # our own
        try:
            fields = problem_fields(problem)
        except InvalidInputError as err:
            raise InvalidInputError(f"A problem needs a prompt text; {err}") from None
        names = fields["names"]
        prompt, gold = problem[names["question"]], problem[names["answer"]] if names["answer"] else None
        if not isinstance(prompt, str):
            raise InvalidInputError(f"A problem needs a prompt text; got {type(prompt).__name__} in {names['question']!r}")
        if isinstance(gold, str) and GSM8K_MARK in gold:
            gold = fields["gold"]
        return {"id": problem[names["id"]] if names["id"] else None, "prompt": prompt, "gold": gold}
    prompt = getattr(problem, "prompt", None)
    if not isinstance(prompt, str):
        raise InvalidInputError(f"A problem needs a prompt text; got {type(problem).__name__}")
    return {"id": getattr(problem, "id", None), "prompt": prompt, "gold": getattr(problem, "gold", None)}
