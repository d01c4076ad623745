"""Grading: a response's final answer (read by `core.evaluation.answers`: the last \\boxed{}, an answer
phrase, or a labelled last-number fallback) compared with the gold answer by math-verify (LaTeX/sympy
equivalence: \\frac{1}{2} == 0.5 == 1/2); `grade_trace` records the answer, the rule that found it and
the verdict on the trace.

Unparseable or pathological answers grade as wrong; grading never raises on model output. math-verify
bounds its work with SIGALRM, which works only on a main thread, so off the main thread (Streamlit's
script threads) the comparison runs in a small worker process (`core/evaluation/mathverify_worker.py`) that is
killed and restarted if it overruns.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from core.errors import GradingError, InvalidInputError
from core.evaluation import mathverify_worker
from core.evaluation.answers import (  # noqa: F401
    RULES,
    Extraction,
    answer_part,
    extract,
    extract_answer,
    last_boxed,
    strip_special,
)
from core.trace import Trace, answer_rule_of  # noqa: F401  (graded traces are read by it)

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5  # math-verify's per-step limit (whole seconds: SIGALRM)
MAX_ANSWER_CHARS = 1000  # longer "answers" are prose, not answers: graded wrong without parsing
WORKER_START_TIMEOUT_S = 60.0

_NUMBER_THEN_WORDS = re.compile(
    r"(?P<n>[-+]?(?:\\?\$)?\s*\d[\d,]*(?:\.\d+)?)\s*(?:,\s*|\s+)(?P<w>[A-Za-z]{3,})\b[A-Za-z\s.,'’-]*"
)
_MATH_WORDS = {"sqrt", "frac", "cdot", "times", "pi"}
GRADER = 2  # meta["grader"]: traces graded by an older rule set are graded again
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"), ("`", "`"))


# -- comparison -------------------------------------------------------------------------------


def normalize_answer(answer: str) -> str:
    """Light clean-up before math-verify: wrappers ($..$, \\(..\\), **..**), trailing punctuation,
    unicode minus, and plain-word units or clauses after a number ("18 dollars" -> "18")."""
    s = answer.strip().replace("\u2212", "-")
    changed = True
    while changed:
        changed = False
        s = s.rstrip(" .;,:!").strip(" *")
        for left, right in _WRAPPERS:
            if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s, changed = s[len(left) : -len(right)].strip(), True
                break
    m = _NUMBER_THEN_WORDS.fullmatch(s)
    if m and m.group("w").lower() not in _MATH_WORDS:
        s = m.group("n").replace("$", "").replace("\\", "").strip(" ,")
    if s.startswith("$") and s.count("$") == 1:  # currency, not a math delimiter
        s = s[1:].strip()
    return s


# -- checking -----------------------------------------------------------------------------------


def check_answer(answer: str | None, gold: str, timeout_s: int = DEFAULT_TIMEOUT_S) -> bool:
    """Whether an extracted answer equals the gold answer (math-verify); None or unparseable -> False.

    Safe to call from any thread. `timeout_s` bounds each math-verify step (whole seconds).
    """
    if gold is None or not str(gold).strip():
        raise InvalidInputError(f"no gold answer to grade against (got {gold!r})")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
        raise InvalidInputError(f"timeout_s must be a whole number of seconds >= 1, got {timeout_s!r}")
    if answer is None:
        return False
    a, g = normalize_answer(str(answer)), normalize_answer(str(gold))
    if not a or len(a) > MAX_ANSWER_CHARS or not _balanced(a) or not _balanced(g):
        return False
    if threading.current_thread() is threading.main_thread():
        return _check_here(a, g, timeout_s)
    return _WORKER.check(a, g, timeout_s)


def grade(response_text: str, gold: str, *, timeout_s: int = DEFAULT_TIMEOUT_S, last_number: bool = True) -> bool:
    """Whether a response's final answer (see `core.evaluation.answers.extract`) equals `gold`."""
    return check_answer(extract_answer(response_text or "", last_number=last_number), gold, timeout_s)


def gold_text(gold: Any) -> str | None:
    """A gold answer as a string, or None when there is none (or an empty one)."""
    return None if gold is None or not str(gold).strip() else str(gold)


def gold_of(trace: Any) -> str | None:
    """The trace's gold answer as a string, or None when its problem has none (or an empty one)."""
    return gold_text((trace.meta.get("problem") or {}).get("gold"))


def was_cut(trace: Any) -> bool:
    """Whether a generated trace stopped at its token limit (max_new_tokens, or the context's room) rather
    than ending by itself: its last number is then mid-computation, not an answer."""
    meta = trace.meta
    limit = (meta.get("context_limit") or {}).get("max_response_tokens") or (meta.get("sampling") or {}).get(
        "max_new_tokens")
    return bool(limit) and meta.get("kind") != "score" and len(trace) >= int(limit)


def grade_trace(trace: Any) -> bool | None:
    """Grade a trace in place against its problem's gold answer, unless this grader graded it already or it
    has no gold: meta "answer", "answer_rule" (one of RULES, None when nothing was extracted: ungraded,
    counted as wrong by accuracy and apart by the tables), "correct" and "grader". The last-number fallback
    is off for a trace cut at its token limit. Returns meta["correct"] (None when ungradable). The one rule
    every edge uses (CLI, harness, app), which also gives the trace its planning tags (`store_tags`), so
    a stored trace carries them and its views and exports load no tagger."""
    # spaCy: heavy, loaded when a trace is graded (the tagger is kept for the process)
    from core.annotate.planning import store_tags

    if isinstance(trace, Trace):
        store_tags(trace)
    gold = gold_of(trace)
    if gold is None or (trace.meta.get("correct") is not None and trace.meta.get("grader") == GRADER):
        return trace.meta.get("correct")
    found = extract(trace.text, last_number=not was_cut(trace))
    trace.meta["answer"], trace.meta["answer_rule"] = found.answer, found.rule
    trace.meta["correct"] = bool(check_answer(found.answer, gold))
    trace.meta["grader"] = GRADER
    return trace.meta["correct"]


def is_ungraded(meta: dict[str, Any]) -> bool:
    """Whether a graded trace's meta says no answer was extracted (its verdict is "wrong" by default)."""
    return meta.get("correct") is not None and meta.get("answer") is None


def graded_put(store: Any, trace: Any) -> Any:
    """Grade (see `grade_trace`) and store: a new trace is written, a stored one is rewritten only when
    it was just graded (so an older run's ungraded copy, or one graded by an older rule, gains its grade).
    Returns the trace."""
    before = (trace.meta.get("correct"), trace.meta.get("grader"))
    grade_trace(trace)
    newly = trace.meta.get("correct") is not None and (trace.meta.get("correct"), trace.meta.get("grader")) != before
    if store is None:
        return trace
    stored = trace.key is not None and trace.key in store
    if not stored:
        store.put(trace)
    elif newly:
        store.put(trace, overwrite=True)
    return trace


def _balanced(s: str) -> bool:
    """Braces balance, so that wrapping in \\boxed{} cannot be escaped ("1} \\boxed{2")."""
    depth, i = 0, 0
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(s[i], 0)
        if depth < 0:
            return False
        i += 1
    return depth == 0


def _check_here(answer: str, gold: str, timeout_s: int) -> bool:
    """In-process check on the main thread; re-arms any interval timer math-verify's alarm cleared."""
    if not hasattr(signal, "setitimer"):  # not POSIX: math-verify uses processes there
        return mathverify_worker.check(answer, gold, timeout_s)
    delay, interval = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    try:
        return mathverify_worker.check(answer, gold, timeout_s)
    finally:
        if delay > 0:  # e.g. pytest-timeout's alarm: math-verify's signal.alarm(0) cancelled it
            signal.setitimer(signal.ITIMER_REAL, max(delay - (time.monotonic() - start), 1e-3), interval)


class _Worker:
    """One long-lived `python -P core/evaluation/mathverify_worker.py` child; requests are serialised by a lock."""

    def __init__(self, argv: list[str], deadline_factor: int = 8, deadline_slack_s: float = 5.0) -> None:
        # gold parse + answer parse + up to 4 comparisons, each bounded by the child's own alarm
        self.argv = argv
        self.deadline_factor = deadline_factor
        self.deadline_slack_s = deadline_slack_s
        self.proc: subprocess.Popen | None = None
        self.buf = b""
        self.lock = threading.Lock()

    def check(self, answer: str, gold: str, timeout_s: int) -> bool:
        deadline = self.deadline_factor * timeout_s + self.deadline_slack_s
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            assert self.proc is not None and self.proc.stdin is not None
            request = json.dumps({"answer": answer, "gold": gold, "timeout": timeout_s}) + "\n"
            try:
                self.proc.stdin.write(request.encode("utf-8"))
                self.proc.stdin.flush()
            except OSError:
                logger.warning("math-verify worker died; restarting on the next request")
                self.stop()
                return False
            line = self._readline(deadline)
            if line is None:
                logger.warning("math-verify worker overran %ss (or died) on %.80r; killed", deadline, answer)
                self.stop()
                return False
            try:
                return bool(json.loads(line)["ok"])
            except (ValueError, KeyError, TypeError):
                self.stop()
                return False

    def _start(self) -> None:
        self.buf = b""
        errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors)
        line = self._readline(WORKER_START_TIMEOUT_S)
        if line is None or not line.strip().startswith(b'{"ready"'):
            self.stop()
            errors.seek(0)
            tail = errors.read()[-2000:].decode("utf-8", "replace")
            errors.close()
            raise GradingError(f"could not start the math-verify worker ({' '.join(self.argv)}): {tail}")
        errors.close()
        logger.debug("math-verify worker started (pid %s)", self.proc.pid)

    def _readline(self, timeout: float) -> bytes | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def stop(self) -> None:
        """Kill the child (a later request starts a new one)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
        self.proc = None
        self.buf = b""


_WORKER = _Worker([sys.executable, "-P", str(Path(mathverify_worker.__file__).resolve())])
atexit.register(_WORKER.stop)
