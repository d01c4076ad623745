"""Session state in one place: `init_state()` sets every key once; the URL mirrors what is on screen.

The query parameters `problem`, `trace` and `pos` hold the open problem, trace and selected token,
so a copied link opens the same view.
"""

from __future__ import annotations

import sys
from typing import Any

import streamlit as st

from app.config import AppConfig, PairSpec, parse_args
from app.view import DEFAULT_TOP
from core.metrics import DEFAULT_SCORE, SCORES
from core.errors import ForkpointError
from core.heatmap import SCALES

DEFAULTS: dict[str, Any] = {
    "score": DEFAULT_SCORE,  # the disagreement score that colours tokens and picks spikes
    "scale": "linear",  # colour scale: linear, log, rank
    "spike_kind": "top",  # "top" (top-p% per trace) or "gate" (calibrated on base rollouts)
    "spike_top_pct": 100 * DEFAULT_TOP,  # p, in percent
    "gate_ratio": 0.05,  # r: share of tokens the gate should fire on
    "gate_window": 16,  # W: running-mean window
    "trace_key": None,  # the open trace
    "problem_id": None,  # its problem
    "sel_pos": None,  # the selected token
    "compare": None,  # {"parent": key, "child": key, "pos": int}: the last branch, side by side
    "pending": None,  # a queued generation job (branch) that the Trace page runs with a progress bar
    "notice": None,  # (kind, message) to show once after a rerun
    "first_view": True,  # the very first render of the session (opens a demo trace)
}


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def init_state(argv: list[str] | None = None) -> AppConfig:
    """Set every session key once (start-up args, then the URL's query parameters); returns the config."""
    ss = st.session_state
    if "config" not in ss:
        try:
            config = parse_args(sys.argv[1:] if argv is None else argv)
        except ForkpointError as err:
            ss["notice"] = ("error", f"{err}. Using the demo pair.")
            config = AppConfig(pair=PairSpec())
        ss["config"] = config
        ss["pair_spec"] = config.pair
        ss["store_path"] = config.store or ""
        ss["problems_path"] = config.problems or ""
        for name, value in DEFAULTS.items():
            ss.setdefault(name, value)
        read_query_params()
    if ss["score"] not in SCORES:
        ss["score"] = DEFAULT_SCORE
    if ss["scale"] not in SCALES:
        ss["scale"] = "linear"
    return ss["config"]


def read_query_params() -> None:
    """Adopt problem / trace / pos from the URL (a shared link)."""
    qp = st.query_params
    ss = st.session_state
    if qp.get("trace"):
        ss["trace_key"] = str(qp["trace"])
        ss["first_view"] = False
    if qp.get("problem"):
        ss["problem_id"] = str(qp["problem"])
    if qp.get("pos") is not None:
        ss["sel_pos"] = _int_or_none(qp.get("pos"))


def write_query_params() -> None:
    """Mirror the open problem, trace and selected token into the URL."""
    ss = st.session_state
    wanted = {"problem": ss.get("problem_id"), "trace": ss.get("trace_key"), "pos": ss.get("sel_pos")}
    for name, value in wanted.items():
        if value is None or value == "":
            if name in st.query_params:
                del st.query_params[name]
        elif st.query_params.get(name) != str(value):
            st.query_params[name] = str(value)


def open_trace(key: str | None, problem_id: str | None = None, pos: int | None = None) -> None:
    """Make `key` the open trace (selection and comparison reset unless `pos` is given)."""
    ss = st.session_state
    if key != ss.get("trace_key"):
        ss["compare"] = None
    ss["trace_key"] = key
    ss["problem_id"] = problem_id
    ss["sel_pos"] = pos
    ss["first_view"] = False


def notice(kind: str, message: str) -> None:
    """Queue a message (info, success, warning, error) to show at the top of the next run."""
    st.session_state["notice"] = (kind, message)


def show_notice() -> None:
    """Show and clear the queued message."""
    item = st.session_state.get("notice")
    if item:
        kind, message = item
        getattr(st, kind if kind in ("info", "success", "warning", "error") else "info")(message)
        st.session_state["notice"] = None
