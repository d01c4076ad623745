"""Session state in one place: `init_state()` sets every key it owns (on every run, not only the first),
and the URL mirrors what is on screen.

Every key of `DEFAULTS` is (re)set with `setdefault` on each run: Streamlit drops a widget's key when a
run ends without drawing that widget (e.g. a page switch from a selection callback), and a page that
then read `st.session_state["score"]` crashed with a KeyError. The query parameters hold the open
problem, trace, token, metric, colour scale and range, spike rule and the open branch comparison, so a
copied link opens the same view.
"""

from __future__ import annotations

import sys
from typing import Any

import streamlit as st

from app.config import AppConfig, PairChoice, parse_args, script_args
from app.view import PROB_MODES, RANGES
from core import settings
from core.errors import ForkpointError
from core.scoring.registry import DEFAULT_SCORE, SCORES
from core.views.heatmap import SCALES

DEFAULTS: dict[str, Any] = {
    "score": DEFAULT_SCORE,  # the disagreement score that colours tokens and picks spikes
    "scale": "linear",  # colour scale: linear, log, rank
    "crange": "trace",  # colour range: "trace" (each trace's own min..max) or "pair" (fixed over the pair's traces)
    "prob_mode": "prob",  # how probabilities are shown: "prob" or "logprob"
    "spike_kind": "top",  # "top" (top-p% per trace) or "gate" (calibrated on base rollouts)
    "spike_top_pct": 100 * settings.SPIKE_TOP,  # p, in percent
    "gate_ratio": settings.RATIO,  # r: share of tokens the gate should fire on
    "gate_window": settings.WINDOW,  # W: running-mean window
    "trace_key": None,  # the open trace
    "problem_id": None,  # its problem
    "sel_pos": None,  # the selected token
    "compare": None,  # {"parent": key, "child": key, "pos": int}: the last branch, side by side
    "pending": None,  # a queued generation job (branch) that the Trace page runs with a progress bar
    "notice": None,  # (kind, message) to show once after a rerun
    "first_view": True,  # the very first render of the session (opens a demo trace)
    "click_mode": "flip",  # the switchboard: a click on a token flips its takeover ("edit": types there, "select")
    "sw_then": "policy",  # after a switch the rest is written by: the trace's policy, "base" or "reason"
    "sw_hist": [],  # the switch states of this visit (trace keys), for back / forward
    "sw_i": 0,  # the open state's index in sw_hist
    "sw_go": None,  # a back / forward move the token view makes in the browser's history (state.GO_KEY)
    "switch_job": None,  # a queued switch ({"pos"}: flip, {"pos", "token"}: force, {"wanted"}) the fragment applies
    "pf_subset": None,  # {"label", "keys"}: the traces of a Dataset histogram bar, filtering the Problems table
}
# URL parameter -> session key, for the view settings (written only when they differ from the default).
TOP_PCT_RANGE = (0.1, 20.0)  # the spike rule's p (percent of tokens) a URL may set; outside it, the default
VIEW_PARAMS = {"metric": "score", "scale": "scale", "range": "crange", "prob": "prob_mode", "click": "click_mode"}


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float_or_none(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if out == out and abs(out) != float("inf") else None


def init_state(argv: list[str] | None = None) -> AppConfig:
    """Set every session key this app reads (start-up args and the URL once, defaults on every run)."""
    ss = st.session_state
    first = "config" not in ss
    if first:
        try:
            config = parse_args(script_args(sys.argv) if argv is None else argv)
        except ForkpointError as err:
            ss["notice"] = ("error", f"{err}. Using the demo pair.")
            config = AppConfig(pair=PairChoice())
        ss["config"] = config
        ss.setdefault("pair_spec", config.pair)
        ss.setdefault("store_path", config.store or "")
        ss.setdefault("problems_path", config.problems or "")
    kept = ss.get(KEPT_KEY) or {}  # the last run's widget values: a dropped key comes back as the user left it
    for name in ("store_path", "problems_path"):  # text widgets: their keys vanish like the others
        ss.setdefault(name, kept.get(name, ""))
    ss.setdefault("pair_spec", ss["config"].pair)
    for name, value in DEFAULTS.items():
        ss.setdefault(name, kept.get(name, value))
    if first:
        read_query_params()
    else:
        follow_url()
    _repair()
    return ss["config"]


KEPT_KEY = "_kept_widget_values"
# the keys widgets own (only these are dropped by Streamlit; plain keys such as switch_job must stay popped)
WIDGET_KEYS = ("store_path", "problems_path", "score", "scale", "crange", "prob_mode", "spike_kind", "spike_top_pct",
               "gate_ratio", "gate_window", "click_mode", "sw_then")


def keep_widget_values() -> None:
    """Remember the sidebar's widget values in a key no widget owns. A page switch from a selection callback
    drops widget keys; without this the store went back to ./forkpoint-store ("Trace … is not in the store")
    and the metric to its default."""
    ss = st.session_state
    ss[KEPT_KEY] = {k: ss[k] for k in WIDGET_KEYS if k in ss}


def _repair() -> None:
    """Replace values no widget can show (a hand-edited URL, a metric that left the registry)."""
    ss = st.session_state
    choices = {"score": SCORES, "scale": SCALES, "crange": RANGES, "prob_mode": PROB_MODES,
               "spike_kind": ("top", "gate"), "sw_then": ("policy", "base", "reason"),
               "click_mode": ("flip", "edit", "select")}
    for name, valid in choices.items():
        if ss.get(name) not in valid:
            ss[name] = DEFAULTS[name]
    pct = _float_or_none(ss.get("spike_top_pct"))
    low, high = TOP_PCT_RANGE
    ss["spike_top_pct"] = pct if pct is not None and low <= pct <= high else DEFAULTS["spike_top_pct"]
    ratio = _float_or_none(ss.get("gate_ratio"))
    ss["gate_ratio"] = ratio if ratio is not None and 0.001 <= ratio <= 0.5 else DEFAULTS["gate_ratio"]
    window = _int_or_none(ss.get("gate_window"))
    ss["gate_window"] = window if window is not None and 1 <= window <= 512 else DEFAULTS["gate_window"]


def parse_spike(text: str) -> dict[str, Any] | None:
    """`top:5` (top 5% per trace) or `gate:0.05:16` (calibrated gate, r and W) -> session values, else None."""
    parts = str(text).split(":")
    if parts[0] == "top" and len(parts) == 2 and _float_or_none(parts[1]) is not None:
        return {"spike_kind": "top", "spike_top_pct": _float_or_none(parts[1])}
    if parts[0] == "gate" and len(parts) == 3 and _float_or_none(parts[1]) is not None and _int_or_none(parts[2]):
        return {"spike_kind": "gate", "gate_ratio": _float_or_none(parts[1]), "gate_window": _int_or_none(parts[2])}
    return None


def spike_param() -> str:
    """The spike rule as the URL writes it (see parse_spike)."""
    ss = st.session_state
    if ss.get("spike_kind") == "gate":
        return f"gate:{float(ss['gate_ratio']):g}:{int(ss['gate_window'])}"
    return f"top:{float(ss['spike_top_pct']):g}"


def read_query_params() -> None:
    """Adopt the view a shared link describes: problem, trace, pos, metric, scale, range, spikes, compare."""
    qp = st.query_params
    ss = st.session_state
    if qp.get("trace"):
        ss["trace_key"] = str(qp["trace"])
        ss["first_view"] = False
    if qp.get("problem"):
        ss["problem_id"] = str(qp["problem"])
    if qp.get("pos") is not None:
        ss["sel_pos"] = _int_or_none(qp.get("pos"))
    for param, name in VIEW_PARAMS.items():
        if qp.get(param):
            ss[name] = str(qp[param])
    if qp.get("spikes") and (rule := parse_spike(qp["spikes"])):
        ss.update(rule)
    cmp = str(qp.get("compare") or "")
    child, _, at = cmp.partition("@")
    if child and ss.get("trace_key") and _int_or_none(at) is not None:
        ss["compare"] = {"parent": ss["trace_key"], "child": child, "pos": _int_or_none(at)}


def wanted_query_params() -> dict[str, str | None]:
    """What the URL should hold now (None: leave the parameter out)."""
    ss = st.session_state
    job = ss.get("compare") or {}
    compare = f"{job['child']}@{job['pos']}" if job and job.get("parent") == ss.get("trace_key") else None
    wanted: dict[str, Any] = {"problem": ss.get("problem_id"), "trace": ss.get("trace_key"), "pos": ss.get("sel_pos")}
    for param, name in VIEW_PARAMS.items():
        wanted[param] = ss.get(name) if ss.get(name) != DEFAULTS[name] else None
    spikes = spike_param()
    wanted["spikes"] = None if spikes == f"top:{DEFAULTS['spike_top_pct']:g}" else spikes
    wanted["compare"] = compare
    return {k: (None if v is None or v == "" else str(v)) for k, v in wanted.items()}


URL_KEY = "_url_written"  # the query parameters this session last wrote (or adopted)
DATASET_TAB_KEY = "ds_tab"  # the Dataset page's open analysis tab (its label; lazy tabs: only it runs)
INSTRUMENTS_TAB_KEY = "ds_instruments_tab"  # the Dataset page's open instruments tab (its label)
GO_KEY = "sw_go"  # a pending move through the browser's history ({"step": -1 | 1, "id": n}, the token view makes it)
CHARTS_KEY = "charts_ok"  # the token view has drawn in this session: the Trace page's Plotly charts may draw


def write_query_params() -> None:
    """Mirror the open view into the URL, in one message (Streamlit pushes one browser-history entry per
    message: a switch is one entry, not one per changed parameter). A back / forward move of the switchboard
    writes nothing: the token view moves the browser's history instead (GO_KEY), so the browser's Back and
    Forward walk the same states as b / f."""
    ss = st.session_state
    if ss.get(GO_KEY):
        return
    wanted = {k: v for k, v in wanted_query_params().items() if v is not None}
    if st.query_params.to_dict() != wanted:
        st.query_params.from_dict(wanted)
    ss[URL_KEY] = wanted


def follow_url() -> None:
    """Browser Back / Forward: Streamlit reruns with that history entry's URL; when it names another trace or
    token than this session last wrote, open that view (a URL without a trace, as on another page, is left)."""
    ss = st.session_state
    last = ss.get(URL_KEY)
    qp = st.query_params.to_dict()
    if last is None or not qp.get("trace") or qp == last:
        return
    if qp["trace"] != ss.get("trace_key"):
        ss["compare"] = None
    ss["trace_key"] = str(qp["trace"])
    ss["sel_pos"] = _int_or_none(qp.get("pos"))
    if qp.get("problem"):
        ss["problem_id"] = str(qp["problem"])
    ss[URL_KEY] = qp
    ss[GO_KEY] = None


def open_trace(key: str | None, problem_id: str | None = None, pos: int | None = None) -> None:
    """Make `key` the open trace (selection and comparison reset unless `pos` is given)."""
    ss = st.session_state
    if key != ss.get("trace_key"):
        ss["compare"] = None
    ss["trace_key"] = key
    ss["problem_id"] = problem_id
    ss["sel_pos"] = pos
    ss["first_view"] = False


def trace_link_params() -> dict[str, str]:
    """Query parameters for st.switch_page to the Trace page (the open trace plus the view settings)."""
    return {k: v for k, v in wanted_query_params().items() if v is not None}


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
