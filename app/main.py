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
from app.sidebar import current_pair, sidebar  # noqa: E402
from core.errors import ForkpointError  # noqa: E402

logging.getLogger("core").setLevel(logging.WARNING)

PAGES_DIR = Path(__file__).resolve().parent / "screens"  # not "pages": Streamlit treats that name as a v1 multipage folder
PAGES = [
    ("trace.py", "Trace", ":material/subject:", "trace"),
    ("problems.py", "Problems", ":material/table:", "problems"),
    ("generate.py", "Generate", ":material/play_arrow:", "generate"),
    ("dataset.py", "Dataset", ":material/insights:", "dataset"),
    ("export.py", "Export", ":material/download:", "export"),
]


def main() -> None:
    st.set_page_config(page_title="forkpoint", page_icon="🍴", layout="wide")
    state.init_state()
    pages = [st.Page(PAGES_DIR / f, title=t, icon=i, url_path=u, default=(u == "trace")) for f, t, i, u in PAGES]
    page = st.navigation(pages)
    settings = sidebar()
    try:
        store = resources.get_store(settings.store_path)
    except ForkpointError as err:  # pragma: no cover - TraceStore() only records the path
        st.error(f"Trace store problem: {err}")
        st.stop()
    pair = current_pair(settings.pair_spec)
    set_context(Context(settings=settings, pair=pair, store=store))
    page.run()


main()
