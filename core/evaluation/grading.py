"""Final-answer extraction and checking: the last \\boxed{} (or a text fallback), compared with the gold
answer by math-verify (LaTeX/sympy equivalence: \\frac{1}{2} == 0.5 == 1/2).

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

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5  # math-verify's per-step limit (whole seconds: SIGALRM)
MAX_ANSWER_CHARS = 1000  # longer "answers" are prose, not answers: graded wrong without parsing
WORKER_START_TIMEOUT_S = 60.0

_BOXED = re.compile(r"\\(?:boxed|fbox)\b")
_HASHES = re.compile(r"####[ \t]*(?P<x>[^\n]*)")
_PHRASES = (
    re.compile(r"(?i)\banswer\s+is\s*[:：]?\s*(?P<x>[^\n]*)"),
    re.compile(r"(?i)\banswer\s*(?:\*\*)?\s*[:：]\s*(?P<x>[^\n]*)"),
)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_NUMBER_THEN_WORDS = re.compile(
    r"(?P<n>[-+]?(?:\\?\$)?\s*\d[\d,]*(?:\.\d+)?)\s*(?:,\s*|\s+)(?P<w>[A-Za-z]{3,})\b[A-Za-z\s.,'’-]*"
)
_MATH_WORDS = {"sqrt", "frac", "cdot", "times", "pi"}
THINK_CLOSE_TAGS = ("</think>", "</thinking>", "</reasoning>")
# Special-token markup of the common families (Qwen/ChatML, Llama 3, DeepSeek's full-width bars, Gemma,
# SentencePiece); answers never contain these strings.
_SPECIAL = re.compile(
    r"<\|[A-Za-z0-9_.:\-]{1,40}\|>|<｜[^｜<>\n]{1,40}｜>|</?s>|<(?:eos|bos|pad|unk)>|<(?:start|end)_of_turn>"
)
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"), ("`", "`"))


# -- extraction ---------------------------------------------------------------------------------


def last_boxed(text: str) -> str | None:
    """Contents of the last complete \\boxed{...} / \\fbox{...} (nested braces balanced; "\\{" escaped)."""
    for m in reversed(list(_BOXED.finditer(text))):
        i = m.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            inner = _braced(text, i)
            if inner is not None:
                return inner.strip()
        elif i > m.end():  # "\boxed 5": up to the next space or $
            word = re.match(r"[^\s$]+", text[i:])
            if word:
                return word.group(0)
    return None


def _braced(text: str, open_at: int) -> str | None:
    """The text inside the brace group opening at `open_at`, or None if it never closes."""
    depth, i = 0, open_at
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # \{ \} \\ and commands never open or close a group
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
        i += 1
    return None


def strip_special(text: str) -> str:
    """`text` without special-token markup ("<|im_end|>", "<｜end▁of▁sentence｜>", "</s>", "<eos>", ...);
    the think tags stay (see `answer_part`)."""
    return _SPECIAL.sub("", text or "")


def answer_part(text: str) -> str:
    """The answer part of a chain of thought: the text after the last closing think tag when there is
    one, else the whole text (a response that never closes its thought is graded on all of it)."""
    ends = [text.rfind(tag) + len(tag) for tag in THINK_CLOSE_TAGS if tag in text]
    return text[max(ends):] if ends else text


def extract_answer(text: str, last_number: bool = False) -> str | None:
    """The response's final answer, or None.

    Special tokens are stripped and only the part after a closing think tag is read (`answer_part`).
    Order: last \\boxed{}; else the last "#### X" (GSM8K); else the last "answer is X" / "answer: X"
    (X up to the end of its sentence or line); else, only with `last_number=True`, the last number.
    The last-number fallback is off by default: a rollout that trails off mid-computation would
    otherwise be graded on an intermediate result, and would sometimes be counted right by chance.
    """
    text = answer_part(strip_special(text))
    if not text:
        return None
    boxed = last_boxed(text)
    if boxed:
        return boxed
    hashes = [m for m in _HASHES.finditer(text) if m.group("x").strip()]
    if hashes:
        return _sentence(hashes[-1].group("x"))
    found = [m for pattern in _PHRASES for m in pattern.finditer(text) if m.group("x").strip()]
    if found:
        return _sentence(max(found, key=lambda m: m.start()).group("x"))
    if last_number:
        numbers = _NUMBER.findall(text)
        if numbers:
            return numbers[-1]
    return None


def _sentence(x: str) -> str | None:
    """Cut a captured answer at the end of its sentence ("12. Next ..." -> "12")."""
    end = re.search(r"\.(?:\s|$)", x)
    out = (x[: end.start()] if end else x).strip()
    return out or None


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


def grade(response_text: str, gold: str, *, timeout_s: int = DEFAULT_TIMEOUT_S, last_number: bool = False) -> bool:
    """Whether a response's final answer (see `extract_answer`) equals `gold`."""
    return check_answer(extract_answer(response_text or "", last_number=last_number), gold, timeout_s)


def gold_text(gold: Any) -> str | None:
    """A gold answer as a string, or None when there is none (or an empty one)."""
    return None if gold is None or not str(gold).strip() else str(gold)


def gold_of(trace: Any) -> str | None:
    """The trace's gold answer as a string, or None when its problem has none (or an empty one)."""
    return gold_text((trace.meta.get("problem") or {}).get("gold"))


def grade_trace(trace: Any) -> bool | None:
    """Grade a trace in place (meta "answer" and "correct") against its problem's gold answer, unless it
    is graded already or has no gold; returns meta["correct"] (None when ungradable). The one rule
    every edge uses (CLI, harness, app)."""
    gold = gold_of(trace)
    if gold is None or trace.meta.get("correct") is not None:
        return trace.meta.get("correct")
    trace.meta["answer"] = extract_answer(trace.text)
    trace.meta["correct"] = bool(check_answer(trace.meta["answer"], gold))
    return trace.meta["correct"]


def graded_put(store: Any, trace: Any) -> Any:
    """Grade (see `grade_trace`) and store: a new trace is written, a stored one is rewritten only when
    it was just graded (so an older run's ungraded copy gains its grade). Returns the trace."""
    was_graded = trace.meta.get("correct") is not None
    grade_trace(trace)
    newly = not was_graded and trace.meta.get("correct") is not None
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
