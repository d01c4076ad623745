"""Shared scaffolding for `streamlit.testing.v1.AppTest` runs of app/main.py on the tiny Qwen pair."""

from __future__ import annotations

import json
import sys
from pathlib import Path

MAIN = Path(__file__).resolve().parents[1] / "app" / "main.py"
TIMEOUT = 180
ONE_PROBLEM = [{"id": "p1", "question": "What is 5 + 7?", "answer": "12"}]


def write_problems(path: Path, problems: list[dict]) -> Path:
    """A problems file (JSONL, one problem a line)."""
    path.write_text("".join(json.dumps(p) + "\n" for p in problems))
    return path


def tiny_argv(tiny_dirs: dict[str, Path], store: Path, problems: Path) -> list[str]:
    """App arguments for the tiny Qwen pair on CPU, a store and a problems file."""
    return ["--base", str(tiny_dirs["qwen_base"]), "--reason", str(tiny_dirs["qwen_reason"]), "--store", str(store),
            "--problems", str(problems), "--max-new-tokens", "12", "--device", "cpu", "--dtype", "float32"]


def start_app(monkeypatch, args: list[str], drawn: bool = True):
    """An AppTest of app/main.py (not yet run) with `args` as its command line (sys.argv is what the app parses).
    `drawn`: the session's token view has said it is on screen, as it does in a browser (AppTest runs no front
    end), so the Trace page draws its charts (app/trace_panels.charts_ready)."""
    from streamlit.testing.v1 import AppTest

    from app.state import CHARTS_KEY  # deferred with AppTest: app.state imports streamlit

    monkeypatch.setattr(sys, "argv", [str(MAIN), *args])
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    if drawn:
        at.session_state[CHARTS_KEY] = True
    return at


def tiny_app(tiny_dirs: dict[str, Path], tmp_path: Path, monkeypatch, problems: list[dict] = ONE_PROBLEM):
    """An AppTest (not yet run) on the tiny pair, a store at tmp_path/store and `problems` at tmp_path/problems.jsonl."""
    problems_file = write_problems(tmp_path / "problems.jsonl", problems)
    return start_app(monkeypatch, tiny_argv(tiny_dirs, tmp_path / "store", problems_file))


def first_trace(at):
    """Run the app's first view on an empty store and press its one action, Generate (the first problem's
    trace, which opens): the first view stores nothing unasked."""
    at.run()
    at.button(key="first_generate").click().run()
    return at
