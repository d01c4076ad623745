"""The math-verify comparison, importable in-process and runnable as a worker process.

math-verify bounds its work with SIGALRM, which only works in a process's main thread. Off the main
thread (Streamlit runs scripts in threads) `core.evaluation.grading` runs this file as a child process,
`python -P core/evaluation/mathverify_worker.py`, where the comparison is back on a main thread. The file imports
nothing from `core` so that the child does not load torch and friends.

Protocol: one JSON object per line on stdin {"answer": str, "gold": str, "timeout": int}; one line per
request on stdout {"ok": bool}. The first line written is {"ready": true}.
"""

from __future__ import annotations

import json
import logging
import sys

logger = logging.getLogger(__name__)


def _parse(text: str, timeout: int | None) -> list:
    # \boxed{} makes math-verify read the whole string as one LaTeX answer (its highest priority).
    from math_verify import parse

    return parse("\\boxed{" + text + "}", parsing_timeout=timeout)


def check(answer: str, gold: str, timeout: int | None) -> bool:
    """Whether `answer` equals `gold` by math-verify; False when either does not parse or time runs out.

    `timeout` (seconds, int) uses SIGALRM: pass None off the main thread.
    """
    # math-verify (sympy) loads on the first comparison, not with `import core`
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        gold_parsed = _parse(gold, timeout)
        answer_parsed = _parse(answer, timeout)
        if not gold_parsed or not answer_parsed:
            return False
        return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout))
    except TimeoutException:  # a BaseException: math-verify's own handlers may miss one at the edges
        logger.warning("math-verify timed out comparing %.80r with gold %.80r", answer, gold)
        return False
    except (ValueError, TypeError, ArithmeticError, RecursionError, MemoryError) as exc:
        logger.warning("math-verify failed on %.80r vs gold %.80r: %s", answer, gold, type(exc).__name__)
        return False


def main() -> None:
    """Serve comparison requests from stdin until it closes."""
    logging.basicConfig(level=logging.ERROR)
    import math_verify  # noqa: F401  (load before announcing "ready", so no request waits on the import)

    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            ok = check(str(req["answer"]), str(req["gold"]), int(req["timeout"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            ok = False
        out.write(json.dumps({"ok": ok}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
