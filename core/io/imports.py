"""Imports of traces made elsewhere: `{id, prompt, response[, answer]}` JSONL lines scored into a store."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ForkpointError, InvalidInputError
from core.trace import Trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForeignRecord:
    """One `{id, prompt, response[, answer]}` line; `answer` is the reference (gold) answer."""

    line: int
    id: str
    prompt: str
    response: str | list[int]
    answer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _parse_foreign(obj: Any) -> tuple[str, str, str | list[int], str | None, dict[str, Any]]:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "id" not in obj or isinstance(obj["id"], bool) or not isinstance(obj["id"], (str, int)) or obj["id"] == "":
        raise ValueError("missing or invalid 'id' (a non-empty string or an integer)")
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("missing or empty 'prompt' (a string)")
    response = obj.get("response")
    if isinstance(response, list):
        if not response or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in response):
            raise ValueError("'response' as a list must hold non-negative integer token ids")
    elif not isinstance(response, str) or not response:
        raise ValueError("missing or empty 'response' (a string or a list of token ids)")
    answer = obj.get("answer")
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float))):
        raise ValueError("'answer' must be a string or a number")
    extra = {k: v for k, v in obj.items() if k not in {"id", "prompt", "response", "answer"}}
    return str(obj["id"]), prompt, response, None if answer is None else str(answer), extra


def read_foreign_jsonl(path: str | os.PathLike[str]) -> tuple[list[ForeignRecord], list[tuple[int, str]]]:
    """Parse `{id, prompt, response[, answer]}` lines: (good records, [(line number, reason)] for the rest)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"No such file: {path}")
    records: list[ForeignRecord] = []
    errors: list[tuple[int, str]] = []
    first_line: dict[str, int] = {}
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                errors.append((lineno, f"not UTF-8 text: {exc}"))
                continue
            except ValueError as exc:
                errors.append((lineno, f"not valid JSON: {exc}"))
                continue
            try:
                rid, prompt, response, answer, extra = _parse_foreign(obj)
            except ValueError as exc:
                errors.append((lineno, str(exc)))
                continue
            if rid in first_line:
                errors.append((lineno, f"duplicate id {rid!r} (first on line {first_line[rid]})"))
                continue
            first_line[rid] = lineno
            records.append(ForeignRecord(lineno, rid, prompt, response, answer, extra))
    return records, errors


@dataclass
class ImportResult:
    """What an import did: stored keys (in file order) and (line number, reason) for skipped lines."""

    keys: list[str]
    errors: list[tuple[int, str]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: {"stored": n, "keys": [...], "errors": [{"line", "reason"}, ...]}."""
        errors = [{"line": line, "reason": reason} for line, reason in self.errors]
        return {"stored": len(self.keys), "keys": list(self.keys), "errors": errors}


def import_jsonl(
    pair: Any,
    path: str | os.PathLike[str],
    store: Any,
    score_fn: Callable[..., Trace] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ImportResult:
    """Score each foreign record with `score_fn(pair, {"id", "prompt", "gold"}, response)` (default
    `core.scoring.score`), mark it kind="import" and put it in `store`; bad lines are skipped and listed."""
    if score_fn is None:
        from core.scoring import score as score_fn  # lazily: scoring pulls in the model stack
    records, errors = read_foreign_jsonl(path)
    keys: list[str] = []
    for done, rec in enumerate(records, start=1):
        problem = {"id": rec.id, "prompt": rec.prompt, "gold": rec.answer}
        try:
            trace = score_fn(pair, problem, rec.response)
        except ForkpointError as exc:
            errors.append((rec.line, f"{type(exc).__name__}: {exc}"))
            log.warning("%s, line %d: %s", path, rec.line, exc)
        else:
            trace = trace.annotate()  # a copy: the scorer's trace is left alone
            trace.meta["kind"] = "import"
            trace.meta["import"] = {"file": Path(path).name, "line": rec.line, "id": rec.id, "extra": rec.extra}
            keys.append(store.put(trace))
        if progress is not None:
            progress(done, len(records))
    errors.sort()
    return ImportResult(keys, errors)
