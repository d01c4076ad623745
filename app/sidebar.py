"""The Setup sidebar: model pair, prompt formats, store, score metric, colour scale and spike rule.

`sidebar()` draws the widgets (bound to session state by key) and returns the plain `Settings` and the
loaded pair.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import streamlit as st

import core
from app import resources, state
from app.config import PairChoice
from app.state import DEFAULTS
from app.view import PROB_MODES, RANGE_LABELS, RANGES, SpikeRule, md_escape
from core.annotate.spikes import Gate
from core.errors import ForkpointError
from core.scoring.registry import METRICS, SCORES
from core.settings import SETTINGS
from core.views.heatmap import SCALES

DEVICES = ("auto", "cpu", "cuda")
DTYPES = SETTINGS["dtype"].choices


@dataclass(frozen=True)
class Settings:
    """What every page reads: where traces live, how to colour them and how spikes are chosen."""

    store_path: str
    problems_path: str | None
    score: str
    scale: str
    rule: SpikeRule
    pair_spec: PairChoice
    crange: str = "trace"  # colour range: "trace" or "pair" (fixed over the pair's stored traces)
    prob_mode: str = "prob"  # "prob" or "logprob"


def _pair_form() -> None:
    ss = st.session_state
    spec: PairChoice = ss["pair_spec"]
    ss.setdefault("pair_demo", spec.demo)
    for name in ("base", "reason", "base_format", "reason_format", "device", "dtype"):
        ss.setdefault(f"pair_{name}", getattr(spec, name))
    with st.expander(f"Model pair: {spec.label()}", expanded=False):
        st.toggle("Bundled demo pair", key="pair_demo", help="Two tiny models trained for this app; no download.")
        custom = not ss["pair_demo"]
        st.text_input("Base model", key="pair_base", disabled=not custom,
                      help="Hub id (org/name), local directory, or a .gguf file.")
        st.text_input("Reasoning model", key="pair_reason", disabled=not custom,
                      help="Must share the base model's vocabulary.")
        st.text_input("Base prompt format", key="pair_base_format", disabled=not custom,
                      placeholder="Question: {problem}\\nAnswer:", help="A template with {problem}, or chat[:think|:nothink].")
        st.text_input("Reasoning prompt format", key="pair_reason_format", disabled=not custom,
                      placeholder="chat (its chat template)", help="A template with {problem}, or chat[:think|:nothink].")
        c1, c2 = st.columns(2)
        c1.selectbox("Device", DEVICES, key="pair_device")
        c2.selectbox("Dtype", DTYPES, key="pair_dtype")
        if st.button("Load pair", key="pair_load", width="stretch"):
            # what the form does not show (revisions, --trust-remote-code) stays as the app was started
            new = replace(ss["pair_spec"], demo=not custom, base=ss["pair_base"].strip(),
                          reason=ss["pair_reason"].strip(), base_format=ss["pair_base_format"],
                          reason_format=ss["pair_reason_format"], device=ss["pair_device"], dtype=ss["pair_dtype"])
            if custom and not (new.base and new.reason):
                st.error("Give both a base and a reasoning model (hub id, local directory or .gguf file).")
            else:
                ss["pair_spec"] = new


def _rule(store_path: str, score: str, pair: core.ModelPair | None) -> SpikeRule:
    ss = st.session_state
    for name in ("spike_kind", "spike_top_pct", "gate_ratio", "gate_window"):
        ss.setdefault(name, DEFAULTS[name])  # widget keys vanish while their widget is not drawn
    st.radio("Spikes", ("top", "gate"), key="spike_kind", horizontal=True,
             format_func=lambda k: {"top": "top p% per trace", "gate": "calibrated gate"}[k])
    if ss["spike_kind"] == "top":
        low, high = SETTINGS["spike_top"].widget_bounds()  # the table's range, in percent
        st.slider("p (% of tokens)", 100 * low, 100 * high, key="spike_top_pct", step=100 * SETTINGS["spike_top"].step)
        return SpikeRule(top=float(ss["spike_top_pct"]) / 100.0)
    c1, c2 = st.columns(2)
    c1.number_input("r (takeover ratio)", *SETTINGS["ratio"].widget_bounds(), key="gate_ratio",
                    step=SETTINGS["ratio"].step, format="%.3f", help=SETTINGS["ratio"].help)
    c2.number_input("W (window)", *SETTINGS["window"].widget_bounds(), key="gate_window", step=1,
                    help=SETTINGS["window"].help)
    fallback = SpikeRule(top=float(ss["spike_top_pct"]) / 100.0)
    if pair is None:
        st.warning("The calibrated gate needs a loaded model pair. Showing top p% spikes instead.")
        return fallback
    if not resources.has_rollouts(pair, store_path):
        st.warning("The store has no BaseOnly rollouts of this pair to calibrate the gate on (rollouts of "
                   "other pairs are never used). Showing top p% spikes instead.")
        if st.button("Make base rollouts of the problem set", key="make_rollouts"):
            ss["pending_rollouts"] = True
        return fallback
    store = resources.get_store(store_path)
    try:
        gate: Gate = resources.calibrated_gate(store_path, repr(pair.fingerprint()), score, float(ss["gate_ratio"]),
                                               int(ss["gate_window"]),
                                               len(store.keys()) + len(store.calibration_store().keys()), pair)
    except ForkpointError as err:
        st.warning(f"{err}. Showing top p% spikes instead.")
        return fallback
    st.caption(f"τ = {gate.tau:.3g}, λ = {gate.lam:.3g}, W = {gate.window} (fit on this pair's base rollouts)")
    return SpikeRule(top=None, gate=gate)


def sidebar() -> tuple[Settings, core.ModelPair | None]:
    """Draw the Setup sidebar; return the settings it holds and the pair they name (loaded before the
    spike rule is worked out, so a gate is calibrated for this run's pair, not the last one's)."""
    ss = st.session_state
    with st.sidebar:
        st.subheader("Setup")
        _pair_form()
    pair = current_pair(ss["pair_spec"])
    with st.sidebar:
        st.text_input("Trace store", key="store_path", placeholder=resources.store_path(None),
                      help="Directory of stored traces ($FORKPOINT_STORE or ./forkpoint-store by default).")
        st.text_input("Problem file", key="problems_path", placeholder="demo problems",
                      help=".jsonl / .json / .csv with question and answer fields.")
        st.selectbox("Score metric", SCORES, key="score", format_func=lambda s: METRICS[s].score_label,
                     help="The per-token disagreement that colours tokens and picks spikes.")
        # one under the other: side by side, the range's label was cut to "per trace (c…" in the sidebar
        st.selectbox("Colour scale", SCALES, key="scale", help="linear; log spreads the low end; rank = percentiles.")
        st.selectbox("Colour range", RANGES, key="crange", format_func=RANGE_LABELS.get,
                     help="Fixed across this pair's traces makes heat comparable between two traces.")
        st.radio("Probabilities", PROB_MODES, key="prob_mode", horizontal=True,
                 format_func={"prob": "p", "logprob": "log p (nats)"}.get)
        path = resources.store_path(ss["store_path"] or None)
        rule = _rule(path, ss["score"], pair)
    state.keep_widget_values()
    return Settings(store_path=path, problems_path=ss["problems_path"].strip() or None, score=ss["score"],
                    scale=ss["scale"], rule=rule, pair_spec=ss["pair_spec"], crange=ss["crange"],
                    prob_mode=ss["prob_mode"]), pair


def current_pair(spec: PairChoice) -> core.ModelPair | None:
    """The loaded pair (once per process), or None with the reason shown as an error message."""
    try:
        with st.spinner(f"Loading the model pair ({spec.label()}) …", show_time=True):
            pair = resources.load_pair(spec)
    except ForkpointError as err:
        st.error(f"Could not load the model pair: {md_escape(err, 400)}")
        return None
    if getattr(pair, "vocab_notes", None):
        with st.sidebar:
            st.caption("Vocabulary differences tolerated: " + "; ".join(md_escape(n) for n in pair.vocab_notes))
    return pair
