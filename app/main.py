"""forkpoint's Streamlit app: `streamlit run app/main.py [-- --base X --reason Y --store DIR]`.

Builds the per-run context (Setup sidebar, model pair, store) and hands over to the chosen page.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run app/main.py` puts app/ on the path, not the repo root
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import resources, state  # noqa: E402
from app.context import Context, set_context  # noqa: E402
from app.first_paint import TRACE_PAGES  # noqa: E402
from app.sidebar import sidebar  # noqa: E402
from app.view import md_escape
from core.errors import ForkpointError  # noqa: E402

logging.getLogger("core").setLevel(logging.WARNING)

PAGES_DIR = Path(__file__).resolve().parent / "screens"  # not "pages": Streamlit treats that name as a v1 multipage folder
PAGES = [
    ("trace.py", "Trace", ":material/subject:", "trace"),
    ("problems.py", "Problems", ":material/table:", "problems"),
    ("generate.py", "Generate", ":material/play_arrow:", "generate"),
    ("dataset.py", "Dataset", ":material/insights:", "dataset"),
    ("compare.py", "Compare", ":material/compare:", "compare"),
    ("export.py", "Export", ":material/download:", "export"),
    ("about.py", "About", ":material/help:", "about"),
]


def main() -> None:
    st.set_page_config(page_title="forkpoint", page_icon="🍴", layout="wide",
                       initial_sidebar_state="auto")  # closed below 768 px (below 1100: app/first_paint.py)
    state.init_state()
    # the default page is served at "/" only (url_path "": it claims no other path); its other paths ("/trace", as a
    # link may be written by hand, and "/home", the path it once declared) are the same screen, hidden from the menu
    # (listed after it, so st.switch_page picks the visible one)
    pages = [st.Page(PAGES_DIR / f, title=t, icon=i, url_path="" if u == "trace" else u, default=(u == "trace"))
             for f, t, i, u in PAGES]
    pages += [st.Page(PAGES_DIR / "trace.py", title="Trace", icon=":material/subject:", url_path=path,
                      visibility="hidden") for path in TRACE_PAGES if path]
    page = st.navigation(pages)
    settings, pair = sidebar()
    try:
        store = resources.get_store(settings.store_path)
    except ForkpointError as err:  # pragma: no cover - TraceStore() only records the path
        st.error(f"Trace store problem: {md_escape(err, 400)}")
        st.stop()
    set_context(Context(settings=settings, pair=pair, store=store))
    if st.session_state.pop("pending_rollouts", False) and pair is not None:
        _make_rollouts(pair, store, settings)
    page.run()


def _make_rollouts(pair, store, settings) -> None:
    """BaseOnly rollouts of the problem set (stored), so the calibrated gate has data of THIS pair."""
    from core import settings as defaults
    from core.decoding import calibrate

    try:
        problems = resources.problem_set(settings.problems_path)[: defaults.CALIBRATION_PROBLEMS]
        with st.spinner(f"Making {len(problems)} base rollouts of this pair …"):
            calibrate(pair, problems, ratio=float(st.session_state["gate_ratio"]),
                      window=int(st.session_state["gate_window"]), score=settings.score, store=store,
                      max_new_tokens=resources.max_new_tokens(pair))
        resources.calibrated_gate.clear()
        state.notice("success", f"Made {len(problems)} base rollouts of this pair (kept apart from your traces); "
                                  "the gate is calibrated on them.")
    except ForkpointError as err:
        state.notice("error", f"Could not make base rollouts: {err}")
    st.rerun()


main()
