"""Generate: run a policy (BaseOnly, Guided at a budget, EntropyGated, ...) on chosen problems.

Runs with a progress bar; Cancel interrupts it. Every trace is graded and stored, so it shows up on
the Problems page.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import streamlit as st

from app import actions, resources, state
from app.context import get_context
from app.view import md_escape
from core import settings
from core.decoding.calibration import build_policy, holdout
from core.decoding.policies import list_policies, policy_spec
from core.errors import ForkpointError, InvalidInputError
from core.evaluation.problems import Problem
from core.scoring.registry import METRICS
from core.settings import SETTINGS

TRACE_PAGE = Path(__file__).resolve().parent / "trace.py"


def _choose_problems(problems: list[Problem]) -> list[Problem]:
    ids = [p.id for p in problems]
    by_id = {p.id: p for p in problems}
    mode = st.radio("Problems", ("chosen", "first N", "typed"), horizontal=True, key="gen_mode",
                    format_func={"chosen": "choose from the set", "first N": "first N of the set",
                                 "typed": "type a problem"}.get)
    if mode == "chosen":
        st.session_state.setdefault("gen_ids", ids[:2])
        chosen = st.multiselect("Problem ids", ids, key="gen_ids")
        return [by_id[i] for i in chosen]
    if mode == "first N":
        n = st.number_input("N", 1, max(1, len(ids)), value=min(8, max(1, len(ids))), key="gen_n")
        return problems[: int(n)]
    text = st.text_area("Problem text", key="gen_text", placeholder="Tom has 3 boxes of 4 apples …")
    gold = st.text_input("Gold answer (optional, for grading)", key="gen_gold")
    return [Problem("typed-" + hashlib.sha256(text.strip().encode()).hexdigest()[:8], text.strip(), gold.strip() or None)] if text.strip() else []


def _widget(col, spec_name: str, p, key: str):
    """One widget for a declared policy parameter (type, default, range and help from core's registry)."""
    label = p.name.replace("_", " ") + (" (blank = off)" if p.optional else "")
    if p.kind is str:
        return col.selectbox(label, p.choices, index=list(p.choices).index(p.default) if p.default in p.choices else 0,
                             key=key, help=p.help, format_func=lambda c: METRICS[c].label if c in METRICS else c)
    if p.optional:
        text = col.text_input(label, "" if p.default is None else str(p.default), key=key, help=p.help + p.range_text())
        if not text.strip():
            return None
        try:
            return p.kind(float(text)) if p.kind is int else float(text)
        except ValueError:
            raise InvalidInputError(f"{spec_name} parameter {p.name} must be a number{p.range_text()}, got {text!r}")
    lo = None if p.low is None else p.kind(p.low)
    hi = None if p.high is None else p.kind(p.high)
    step = 1 if p.kind is int else 0.01
    return col.number_input(label, lo, hi, p.kind(p.default), step, key=key, help=p.help + p.range_text())


def _setting_input(col, name: str, label: str, key: str, value=None):
    """A number widget for a row of the settings table: its default, range (core.settings) and help."""
    row = SETTINGS[name]
    low, high = row.widget_bounds()
    step = row.step or (1 if isinstance(row.value, int) else 0.01)
    return col.number_input(label, low, high, row.value if value is None else value, step, key=key, help=row.help)


def _policy_form(score: str) -> tuple[str, dict, dict]:
    """(policy name, its parameters, calibration settings) from widgets generated from the registry."""
    specs = {spec.name: spec for spec in list_policies()}
    name = st.selectbox("Policy", list(specs), key="gen_policy",
                        format_func=lambda n: f"{specs[n].label}: {specs[n].help}")
    spec = specs[name]
    cols = st.columns(3)
    params: dict = {}
    widgets = list(spec.user_params)
    for i, p in enumerate(widgets):
        if p.kind is dict:
            continue
        params[p.name] = _widget(cols[i % 3], spec.label, p, f"gen_{name}_{p.name}")
    if "score" in params and params["score"] is None:
        params["score"] = score
    calib: dict = {}
    for j, setting in enumerate(spec.calibration):
        calib[setting] = _setting_input(cols[(len(widgets) + j) % 3], setting, f"{setting} (calibration)",
                                        key=f"gen_{name}_calib_{setting}")
    if spec.cls.knob is not None and spec.cls.knob != "rate":
        rho = st.number_input("match takeover rate ρ (0 = off)", 0.0, 0.99, 0.0, 0.005, format="%.3f",
                              key=f"gen_{name}_rho", help=settings.SETTINGS["rho"].help)
        if rho > 0:
            calib["rho"] = float(rho)
    if spec.needs_gate or "rho" in calib:
        st.caption(f"{spec.label} calibrates its gate on BaseOnly rollouts of held-out problems first.")
    return name, params, calib


def _phase_bar(bar):
    """progress(done, total) callbacks per phase: labelled, and never moving backwards within a phase."""
    seen = {"frac": 0.0}

    def make(label: str, lo: float, hi: float):
        def progress(done: int, total: int) -> None:
            frac = lo + (hi - lo) * min(1.0, done / max(total, 1))
            seen["frac"] = max(seen["frac"], frac)
            bar.progress(seen["frac"], text=f"{label}: {done} / {total}")
        return progress

    return make


def main() -> None:
    ctx = get_context()
    state.show_notice()
    st.title("Generate")
    if ctx.pair is None:
        st.error("No model pair is loaded; fix it in the sidebar (Setup → Model pair).")
        return
    try:
        problems = resources.problem_set(ctx.settings.problems_path)
    except ForkpointError as err:
        st.error(f"Could not read the problems: {md_escape(err, 400)}")
        return
    chosen = _choose_problems(problems)
    try:
        name, params, calib = _policy_form(ctx.settings.score)
    except ForkpointError as err:
        st.error(md_escape(err, 400))
        return
    c = st.columns(6)
    max_new = int(_setting_input(c[0], "max_new_tokens", "max new tokens", "gen_max_new",
                                 resources.max_new_tokens(ctx.pair)))
    temperature = float(_setting_input(c[1], "temperature", "temperature", "gen_temp"))
    top_p = float(_setting_input(c[2], "top_p", "top-p", "gen_top_p"))
    seed = int(_setting_input(c[3], "seed", "seed", "gen_seed"))
    samples = int(_setting_input(c[4], "samples", "samples", "gen_samples"))
    k = int(_setting_input(c[5], "k", "top-k kept", "gen_k"))
    go = st.button(f"Run on {len(chosen)} problem(s)", type="primary", disabled=not chosen, key="gen_run")
    if not go:
        _show_last()
        return
    slot = st.empty()
    with slot.container(border=True):
        st.button("Cancel", key="gen_cancel", help="Stops the run; traces finished so far stay stored.",
                  on_click=state.notice, args=("info", "Generation cancelled; traces finished before that stay stored."))
        bar = st.progress(0.0, text="starting")
        phase = _phase_bar(bar)
        gated = policy_spec(name).needs_gate or "rho" in calib
        calibration, in_sample = holdout(problems, chosen, settings.CALIBRATION_PROBLEMS)
        if gated and in_sample:
            st.warning("Every problem of the set is chosen, so the gate is calibrated in-sample (on the problems "
                       "it then runs on). Choose fewer problems to hold some out.")
        rollouts_before, failed = set(ctx.store.calibration_store().keys()), None
        try:
            policy = build_policy(ctx.pair, name, {**params, **{k: v for k, v in calib.items()
                                                                  if k not in ("ratio", "rho")}},
                                  calibrate_on=calibration, ratio=float(calib.get("ratio", settings.RATIO)),
                                  rho=calib.get("rho"),
                                  store=ctx.store, max_new_tokens=max_new,
                                  progress=phase("Calibrating the gate (base rollouts)", 0.0, 0.3))
            traces = actions.run_generate(ctx.pair, ctx.store, chosen, policy, max_new_tokens=max_new,
                                          temperature=temperature, top_p=top_p, seed=seed, samples=samples, k=k,
                                          progress=phase(f"Generating with {policy_spec(name).label}",
                                                         0.3 if gated else 0.0, 1.0))
        except ForkpointError as err:
            failed = err
    slot.empty()  # the progress and its Cancel go, whatever the outcome
    if failed is not None:
        st.error(f"Generation failed: {md_escape(failed, 400)}")
        return
    st.session_state["gen_last"] = [t.key for t in traces]
    st.session_state["gen_note"] = None
    made = len(set(ctx.store.calibration_store().keys()) - rollouts_before)
    st.success(f"{len(traces)} trace(s) stored in {ctx.settings.store_path}; they are on the Problems page."
               + (f" Calibrating the gate made {made} BaseOnly rollouts of held-out problems, kept apart from "
                  "your traces (the store's calibration folder; the next calibration reuses them)."
                  if made > 0 else ""))
    note = policy.diagnose(traces)
    if note:
        st.session_state["gen_note"] = note
    _show_last()


def _show_last() -> None:
    keys = st.session_state.get("gen_last") or []
    if not keys:
        return
    ctx = get_context()
    rows = []
    for key in keys:
        try:
            t = resources.load_trace(ctx.settings.store_path, key)
        except ForkpointError:
            continue
        rows.append({"problem": (t.meta.get("problem") or {}).get("id"), "policy": (t.meta.get("policy") or {}).get("name"),
                     "tokens": len(t), "takeovers": t.n_takeovers,
                     "answer": t.meta.get("answer"), "correct": t.meta.get("correct"), "key": key})
    if st.session_state.get("gen_note"):
        st.warning(st.session_state["gen_note"])
    st.markdown("**Last run**")
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    pick = st.selectbox("Open a trace", keys, key="gen_open_pick", format_func=lambda k: k[:12])
    if st.button("Open in Trace", key="gen_open"):
        t = resources.load_trace(ctx.settings.store_path, pick)
        state.open_trace(pick, (t.meta.get("problem") or {}).get("id"))
        st.switch_page(TRACE_PAGE, query_params=state.trace_link_params())


main()
